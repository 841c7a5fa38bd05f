#!/bin/sh
# The gateway image's entrypoint (under tini, which passes SIGTERM on: the gateway drains).
#   STORE_DSN_FILE  a file holding the store's DSN (a Swarm secret): exported as
#                   GATEWAY_STORE, so that the password is in no flag, `ps` or service spec
#   TMPDIR          made when missing: Python's tempfile would silently fall back to /tmp,
#                   where the Docker engine could not see the sandboxes' folders
set -eu
if [ -n "${STORE_DSN_FILE:-}" ]; then
    GATEWAY_STORE=$(cat "$STORE_DSN_FILE")
    export GATEWAY_STORE
fi
if [ -n "${TMPDIR:-}" ]; then
    mkdir -p "$TMPDIR"
fi
exec "$@"
