#!/usr/bin/env bash
# The page's bundle: gateway/static/src and the npm packages of package-lock.json, bundled by
# esbuild (scripts/page-bundle.mjs) into gateway/static/dist, which is committed.
#   scripts/page.sh install   install the locked packages into node_modules (npm ci; skipped
#                             when node_modules already has this lockfile's packages)
#   scripts/page.sh build     install, then rebuild gateway/static/dist: commit the result
#   scripts/page.sh check     rebuild in a scratch folder and fail if gateway/static/dist differs
#                             by one byte (offline: run install first)
set -euo pipefail
cd "$(dirname "$0")/.."
command=${1:-}
stamp=node_modules/.installed-$(sha256sum package-lock.json | cut -c1-16)

need() {
    command -v "$1" >/dev/null || { echo "page: $1 is missing (apt-get install nodejs npm)" >&2; exit 2; }
}

install() {
    need npm
    if [ ! -f "$stamp" ]; then
        # No install scripts run: esbuild finds its binary without its postinstall step.
        npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2
        touch "$stamp"
    fi
}

case "$command" in
    install) install ;;
    build) install; need node; node scripts/page-bundle.mjs ;;
    check)
        need node
        if [ ! -f "$stamp" ]; then
            echo "page: node_modules does not hold package-lock.json's packages: run scripts/page.sh install" >&2
            exit 2
        fi
        node scripts/page-bundle.mjs --check ;;
    *) echo "usage: scripts/page.sh install|build|check" >&2; exit 2 ;;
esac
