#!/usr/bin/env bash
# Set up (see setup.sh) and start the gateway on http://127.0.0.1:8888.
# Extra arguments go to `gateway serve` (e.g. --backend docker, --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m gateway serve --host 127.0.0.1 --port "${PORT:-8888}" "$@"
