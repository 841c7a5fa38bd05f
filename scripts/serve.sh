#!/usr/bin/env bash
# Set up (see setup.sh) and start the gateway, on http://127.0.0.1:8888 unless told otherwise.
# Extra arguments go to `gateway serve` (e.g. --backend docker, --port 9000, --host 0.0.0.0);
# $PORT is the port when no --port is given. Nothing else is added: `gateway serve`'s own
# defaults (127.0.0.1, 8888) and its GATEWAY_* variables and --config file hold as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
flags=()
given_port=no
for arg in "$@"; do
    case "$arg" in
        --port | --port=*) given_port=yes ;;
    esac
done
if [ "$given_port" = no ] && [ -n "${PORT:-}" ]; then
    flags+=(--port "$PORT")
fi
exec .venv/bin/python -m gateway serve ${flags[@]+"${flags[@]}"} "$@"
