#!/bin/sh
# The store image's entrypoint: at first start (an empty $PGDATA) make the cluster, with
# the role `gateway` (password from POSTGRES_PASSWORD_FILE, a Swarm secret) owning the
# database `gateway`; then run PostgreSQL in the foreground on 127.0.0.1:$PGPORT, password
# (scram) logins over TCP only.
#   PGDATA, PGPORT, POSTGRES_PASSWORD_FILE; PG_LISTEN (127.0.0.1), PG_MAX_CONNECTIONS (200:
#   each replica uses up to 13). No JIT: the base image has no LLVM (build-stack.sh).
set -eu
: "${POSTGRES_PASSWORD_FILE:?the gateway role's password file}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    initdb -D "$PGDATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    pg_ctl -D "$PGDATA" -w -s -o "-c listen_addresses= -k /run/postgresql" start
    # the password read by psql itself into a variable, quoted by psql (:'...'): never in
    # a command line (world-readable in /proc) nor pasted into SQL
    psql -q -h /run/postgresql -U postgres -d postgres -v ON_ERROR_STOP=1 \
        -v password_file="$POSTGRES_PASSWORD_FILE" <<'SQL'
\set password `cat :'password_file'`
CREATE ROLE gateway LOGIN PASSWORD :'password';
CREATE DATABASE gateway OWNER gateway;
SQL
    pg_ctl -D "$PGDATA" -w -s -m fast stop
fi
exec postgres -D "$PGDATA" -c listen_addresses="${PG_LISTEN:-127.0.0.1}" -c port="$PGPORT" \
    -c unix_socket_directories=/run/postgresql -c max_connections="${PG_MAX_CONNECTIONS:-200}" \
    -c jit=off
