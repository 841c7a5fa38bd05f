#!/usr/bin/env bash
# Create the virtual environment at .venv (idempotent) and install the gateway into it.
#   scripts/setup.sh          the gateway, both backends, its kernels and MCP (extra `all`)
#   scripts/setup.sh test     ... plus what the tests need
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
python=${PYTHON:-python3}

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # bubblewrap gives the local backend its namespaces; the tests also drive Chromium.
    need=()
    command -v bwrap >/dev/null || need+=(bubblewrap)
    if [ "$extra" = test ] && [ ! -x /usr/bin/chromium ]; then need+=(chromium fonts-dejavu-core); fi
    if [ ${#need[@]} -gt 0 ]; then
        echo "setup: installing ${need[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extra:-base}
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip >&2
    if [ "$extra" = test ]; then
        .venv/bin/python -m pip install --quiet -e '.[test]' >&2
    else
        .venv/bin/python -m pip install --quiet -e '.[all]' >&2
    fi
    touch "$stamp"
fi

if [ "$extra" = test ]; then
    # The page's bundle is committed (gateway/static/dist); the tests rebuild it offline from
    # package-lock.json to check it, so they need the locked npm packages (npm ci, skipped
    # when node_modules has them already).
    if command -v npm >/dev/null; then
        scripts/page.sh install
    else
        echo "setup: npm is missing: the page's bundle check will be skipped (apt-get install nodejs npm)" >&2
    fi
fi
