#!/usr/bin/env bash
# Stop the PostgreSQL server that .ci/postgres-up.sh started (its cluster under
# $GATEWAY_POSTGRES_DIR, default /var/tmp/gateway-postgres). The cluster's files stay, so
# the next postgres-up.sh starts it again in a second. Nothing else is touched.
set -euo pipefail

STATE=${GATEWAY_POSTGRES_DIR:-/var/tmp/gateway-postgres}
DATA=$STATE/data

log() { printf '[postgres-down] %s\n' "$*" >&2; }

if [ ! -f "$DATA/postmaster.pid" ]; then
    log "no server running from $DATA; nothing to stop"
    exit 0
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ "$(id -u)" -eq 0 ]; then
    setpriv --reuid=postgres --regid="$(id -g postgres)" --init-groups -- \
        "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
else
    "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
fi
rm -f "$STATE/pid"
log "done"
