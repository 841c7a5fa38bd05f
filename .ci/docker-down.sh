#!/usr/bin/env bash
# Stop the dockerd that .ci/docker-up.sh started (pid in /tmp/gateway-dockerd.pid).
# Without that pid file: do nothing (a dockerd started by someone else stays).
set -euo pipefail

PID_FILE=/tmp/gateway-dockerd.pid
WAIT=20

log() { printf '[docker-down] %s\n' "$*"; }

# True when $1 is a live (not zombie) process.
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

if [ ! -f "$PID_FILE" ]; then
    log "no $PID_FILE; nothing to stop"
    exit 0
fi

pid=$(cat "$PID_FILE" 2>/dev/null || true)
if ! [[ "$pid" =~ ^[0-9]+$ ]]; then
    log "bad pid file content '$pid'; removing it"
    rm -f "$PID_FILE"
    exit 0
fi

if ! alive "$pid"; then
    log "dockerd $pid is not running"
    rm -f "$PID_FILE"
    exit 0
fi

comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
if [ "$comm" != dockerd ]; then
    log "pid $pid is '$comm', not dockerd (stale pid file); not touching it"
    rm -f "$PID_FILE"
    exit 0
fi

log "stopping dockerd $pid (SIGTERM, up to ${WAIT} s)"
kill -TERM "$pid"
deadline=$((SECONDS + WAIT))
while alive "$pid"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        log "dockerd $pid still running after ${WAIT} s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 1
        break
    fi
    sleep 0.5
done
rm -f "$PID_FILE"
log "done"
