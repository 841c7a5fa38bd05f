#!/usr/bin/env bash
# Set up everything the tests need and run them: the venv, and (as root) a Docker engine
# and the kernel image, so that the behavioural suite runs on every backend (local, Docker,
# and forkserver, which forks its kernels in that image's files), and Debian's
# PostgreSQL server, for the store and replica tests (they start clusters of their own).
#
# Without arguments, in three tiers (tests/README.md, "Tiers"), each stopping the script
# when it fails:
#   1. fast    the tests marked `fast` (no real kernel: the execution layer on the fake
#              backend, parsers, budgets, the store, the layers), about a minute, stopping
#              at the first failure;
#   2. the rest but `serial`, in GATEWAY_TEST_WORKERS (2) processes at once (pytest-xdist):
#              most tests wait on kernels, containers and timeouts, not on the CPU;
#   3. serial  the tests that time another user's answers or measure a gateway's memory,
#              one at a time, with nothing else running beside them.
# Not in any tier: the Swarm stack's test (marker `stack`, tests/test_stack.py), which makes
# this engine a swarm for a few minutes; CI runs it once, on its own (`scripts/test.sh -m stack`).
# With arguments, one pytest run with exactly those (e.g. `scripts/test.sh -m attack`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
if [ "$(id -u)" = 0 ] && [ "${GATEWAY_SKIP_DOCKER:-0}" != 1 ]; then
    .ci/docker-up.sh
    GATEWAY_DOCKER_IMAGE=$(docker/build.sh)  # the tag of this checkout's kernel image
    export GATEWAY_DOCKER_IMAGE
fi
if [ "$(id -u)" = 0 ] && [ "${GATEWAY_SKIP_POSTGRES:-0}" != 1 ]; then
    .ci/postgres-up.sh --install
fi
pytest=(.venv/bin/python -m pytest)
if [ $# -gt 0 ]; then
    exec "${pytest[@]}" "$@"
fi
started=$(date +%s)
tier() {
    echo "== tier $1 ($(( $(date +%s) - started )) s so far)"
}
tier "1: fast"
"${pytest[@]}" -m fast -x -q
tier "2: the rest, ${GATEWAY_TEST_WORKERS:-2} at once"
"${pytest[@]}" -m "not fast and not serial and not stack" -q -n "${GATEWAY_TEST_WORKERS:-2}" --dist loadfile
tier "3: serial"
"${pytest[@]}" -m "serial and not fast" -q
tier "done"
