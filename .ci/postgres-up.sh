#!/usr/bin/env bash
# Idempotent PostgreSQL for the tests (and for trying replicas by hand) on a Debian 12 machine.
# Prints one line on stdout: the DSN of a database the gateway may use, e.g.
#   postgresql://gateway:<password>@127.0.0.1:<port>/gateway
# Everything else goes to stderr.
#
# - Installs Debian's `postgresql` with apt when its server binaries are missing (as root).
# - Keeps a cluster of its own under $GATEWAY_POSTGRES_DIR (default /var/tmp/gateway-postgres):
#   data/ (the cluster), run/ (its unix socket), port, password, pid of the postmaster.
#   Debian's own `main` cluster is never touched.
# - The server runs as a non-root user (`postgres` when run as root, else the caller),
#   listens on 127.0.0.1 only, on a free port picked the first time (kept while free), with
#   password (scram) logins over TCP. The role `gateway` may create databases (the tests
#   make one per gateway group and drop it).
# - If the cluster already answers: print its DSN and do nothing else.
#
# .ci/postgres-down.sh stops the server this script started.
# `postgres-up.sh --install` only installs the server's package (CI: the tests start
# clusters of their own in temporary folders with this same script).
set -euo pipefail

STATE=${GATEWAY_POSTGRES_DIR:-/var/tmp/gateway-postgres}
DATA=$STATE/data
SOCKETS=$STATE/run
TIMEOUT=60

log() { printf '[postgres-up] %s\n' "$*" >&2; }
die() { printf '[postgres-up] error: %s\n' "$*" >&2; exit 1; }

# The newest installed server's bin folder (Debian keeps them per major version).
bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
        printf '%s\n' "$dir"
    fi
}

BIN=$(bindir)
if [ -z "$BIN" ]; then
    [ "$(id -u)" -eq 0 ] || die "PostgreSQL's server is not installed; run this as root once"
    # Keep the package from starting Debian's main cluster while it installs (only for
    # this install: a policy-rc.d we made is removed again).
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        made_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    log "installing postgresql"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
    if [ -n "$made_policy" ]; then
        rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
    BIN=$(bindir)
    [ -n "$BIN" ] || die "no /usr/lib/postgresql/*/bin/initdb after installing postgresql"
fi
if [ "${1:-}" = --install ]; then
    log "PostgreSQL's server is installed ($BIN)"
    exit 0
fi

# Who runs the server: never root (postgres refuses to).
if [ "$(id -u)" -eq 0 ]; then
    OWNER=postgres
    getent passwd "$OWNER" >/dev/null || die "no '$OWNER' user (the postgresql package makes it)"
    as_owner() { setpriv --reuid="$OWNER" --regid="$(id -g "$OWNER")" --init-groups -- "$@"; }
else
    OWNER=$(id -un)
    as_owner() { "$@"; }
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Free to listen on: SO_REUSEADDR as PostgreSQL itself binds, so that the port of a server
# just stopped (its connections in TIME_WAIT) is kept across a restart.
port_free() {
    python3 -c 'import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

dsn() {
    printf 'postgresql://gateway:%s@127.0.0.1:%s/gateway\n' "$(cat "$STATE/password")" "$(cat "$STATE/port")"
}

answers() {
    [ -f "$STATE/port" ] && "$BIN/pg_isready" -q -h 127.0.0.1 -p "$(cat "$STATE/port")" -t 2
}

if answers && [ -f "$STATE/password" ]; then
    log "PostgreSQL already answers on port $(cat "$STATE/port")"
    dsn
    exit 0
fi

mkdir -p "$STATE"
chmod 0755 "$STATE"

# 1. A cluster of our own (made again when a previous attempt left it half-made).
if [ ! -f "$DATA/PG_VERSION" ] || [ ! -f "$STATE/password" ]; then
    rm -rf "$DATA" "$SOCKETS"
    mkdir -p "$DATA" "$SOCKETS"
    chown "$OWNER" "$DATA" "$SOCKETS"
    chmod 0700 "$DATA"
    python3 -c 'import secrets; print(secrets.token_hex(16))' > "$STATE/password.new"
    chmod 0600 "$STATE/password.new"
    log "initdb $DATA (as $OWNER)"
    as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >&2
    mv "$STATE/password.new" "$STATE/password"
    rm -f "$STATE/port"
    fresh=1
else
    mkdir -p "$SOCKETS"
    chown "$OWNER" "$SOCKETS"
    fresh=
fi

# 2. A port: the one kept from last time while it is free, else a new free one.
if [ ! -f "$STATE/port" ] || ! port_free "$(cat "$STATE/port")"; then
    free_port > "$STATE/port"
fi
port=$(cat "$STATE/port")

# 3. Start it (pg_ctl waits until it accepts connections).
log "starting PostgreSQL on 127.0.0.1:$port (log: $STATE/server.log)"
touch "$STATE/server.log"
chown "$OWNER" "$STATE/server.log"
as_owner "$BIN/pg_ctl" -D "$DATA" -l "$STATE/server.log" -w -t "$TIMEOUT" start \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$SOCKETS -c max_connections=200" >&2 \
    || { tail -n 40 "$STATE/server.log" >&2; die "PostgreSQL did not start"; }
head -n 1 "$DATA/postmaster.pid" > "$STATE/pid"

# 4. The gateway's role and database (first start only).
if [ -n "$fresh" ]; then
    password=$(cat "$STATE/password")
    as_owner "$BIN/psql" -q -h "$SOCKETS" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 >&2 <<SQL
CREATE ROLE gateway LOGIN CREATEDB PASSWORD '$password';
CREATE DATABASE gateway OWNER gateway;
SQL
fi

answers || die "PostgreSQL does not answer on port $port"
log "PostgreSQL answers on 127.0.0.1:$port"
dsn
