#!/usr/bin/env bash
# Idempotent Docker set-up for a fresh Debian 12 machine, run as root.
#
# - If `docker info` already answers: do nothing.
# - Otherwise: write /etc/docker/daemon.json (no bridge, no iptables, no
#   forwarding/masquerading; only if absent), a policy-rc.d that keeps
#   package installs from starting services (only if absent), install
#   docker.io and debootstrap when missing, start dockerd in the background
#   (log /tmp/gateway-dockerd.log, pid /tmp/gateway-dockerd.pid) and wait
#   until `docker info` answers (60 s).
#
# .ci/docker-down.sh stops the dockerd this script started (and only that).
set -euo pipefail

DAEMON_JSON=/etc/docker/daemon.json
POLICY_RC=/usr/sbin/policy-rc.d
LOG_FILE=/tmp/gateway-dockerd.log
PID_FILE=/tmp/gateway-dockerd.pid
TIMEOUT=60

log() { printf '[docker-up] %s\n' "$*"; }
die() { printf '[docker-up] error: %s\n' "$*" >&2; exit 1; }

docker_answers() { docker info >/dev/null 2>&1; }

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }

# True when $1 is a live (not zombie) process.
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# True when $1 is a live process named dockerd.
is_dockerd() {
    local pid=$1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]
}

fail_with_log() {
    printf '[docker-up] error: %s\n' "$1" >&2
    if [ -f "$LOG_FILE" ]; then
        printf '[docker-up] last lines of %s:\n' "$LOG_FILE" >&2
        tail -n 40 "$LOG_FILE" >&2 || true
    fi
    exit 1
}

if have docker && docker_answers; then
    log "docker already answers; nothing to do"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root"

# 1. daemon.json before the package is installed (dockerd refuses the same
#    settings given both as flags and in this file: never pass them as flags).
if [ ! -e "$DAEMON_JSON" ]; then
    mkdir -p "$(dirname "$DAEMON_JSON")"
    printf '%s\n' '{"bridge": "none", "iptables": false, "ip6tables": false, "ip-forward": false, "ip-masq": false}' \
        > "$DAEMON_JSON"
    log "wrote $DAEMON_JSON"
else
    log "$DAEMON_JSON exists; left as is"
fi

# 2. Keep apt from starting services while installing.
if [ ! -e "$POLICY_RC" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$POLICY_RC"
    chmod 0755 "$POLICY_RC"
    log "wrote $POLICY_RC"
fi

# 3. Packages.
if ! have dockerd || ! have debootstrap || ! have docker; then
    log "installing docker.io and debootstrap"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io debootstrap
fi
export PATH="$PATH:/usr/sbin:/sbin"
have dockerd || die "dockerd not found after installing docker.io"

# 4. Start dockerd unless one we started earlier is still coming up.
started=
if [ -f "$PID_FILE" ] && is_dockerd "$(cat "$PID_FILE")"; then
    pid=$(cat "$PID_FILE")
    log "dockerd $pid (from $PID_FILE) is running; waiting for it"
else
    rm -f "$PID_FILE"
    log "starting dockerd (log: $LOG_FILE)"
    # setsid: not in the CI shell's process group, so a Ctrl-C / group signal
    # to the caller does not take the daemon down half-way.
    setsid dockerd >>"$LOG_FILE" 2>&1 </dev/null &
    pid=$!
    printf '%s\n' "$pid" > "$PID_FILE"
    started=1
fi

deadline=$((SECONDS + TIMEOUT))
until docker_answers; do
    if ! alive "$pid"; then
        rm -f "$PID_FILE"
        fail_with_log "dockerd (pid $pid) exited before docker answered"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        if [ -n "$started" ]; then
            kill -TERM "$pid" 2>/dev/null || true
            rm -f "$PID_FILE"
        fi
        fail_with_log "docker did not answer within ${TIMEOUT} s"
    fi
    sleep 0.5
done

log "docker answers (dockerd pid $pid, $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
