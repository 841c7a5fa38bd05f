#!/usr/bin/env bash
# Set up everything the tests need and run them: the venv, and (as root) a Docker engine
# and the kernel image, so that the behavioural suite runs on every backend (local, Docker,
# and forkserver, which forks its kernels in that image's files), and Debian's
# PostgreSQL server, for the store and replica tests (they start clusters of their own).
# Extra arguments go to pytest.
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
exec .venv/bin/python -m pytest "$@"
