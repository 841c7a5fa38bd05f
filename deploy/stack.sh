#!/usr/bin/env bash
# The gateway as a Docker Swarm stack on this machine's engine (deploy/stack.yaml), as root.
#
#   deploy/stack.sh up     build the images (offline: docker/build.sh, docker/build-stack.sh),
#                          make this engine a one-node swarm if it is none, make the host
#                          folders and secrets, `docker stack deploy`, and wait until the
#                          load balancer answers /v1/health; prints its URL last
#   deploy/stack.sh down   `docker stack rm` (each replica drains), wait until its tasks
#                          are gone; leave the swarm if `up` made it (and remove the
#                          docker_gwbridge network that came with it); unmount the folder
#   deploy/stack.sh down --volumes   the same, and remove the store's volume
#
# Settings (environment; deploy/stack.yaml lists what each does):
#   GATEWAY_STACK_NAME           the stack's name (kernel-gateway)
#   GATEWAY_STACK_DIR            host folder for data dirs and sandboxes
#                                (/var/lib/kernel-gateway-stack); its secrets/ holds the
#                                store's password, its DSN and the tokens file (0700)
#   GATEWAY_STACK_TOKENS         a --tokens file to use (copied); without it, `up` makes one
#                                with one admin token (printed once, kept in secrets/)
#   GATEWAY_STACK_KERNEL_IMAGE   the kernels' image (default: docker/build.sh's tag)
#   GATEWAY_STACK_SETTINGS       the replicas' settings file (deploy/stack-settings.toml)
#   GATEWAY_STACK_PORT_PREFIX (89), GATEWAY_STACK_POSTGRES_PORT (5433),
#   GATEWAY_STACK_REPLICAS (2)
#   GATEWAY_STACK_WAIT           seconds `up` waits for the load balancer (300)
# Secrets are files of Swarm's, fixed once made: to change the tokens, `down` then `up`.
set -euo pipefail
shopt -s inherit_errexit

log() { printf '[deploy/stack.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

export GATEWAY_STACK_NAME=${GATEWAY_STACK_NAME:-kernel-gateway}
NAME=$GATEWAY_STACK_NAME
GATEWAY_STACK_SETTINGS=$(realpath -- "${GATEWAY_STACK_SETTINGS:-$SCRIPT_DIR/stack-settings.toml}")
export GATEWAY_STACK_SETTINGS
GATEWAY_STACK_SETTINGS_HASH=$(sha256sum < "$GATEWAY_STACK_SETTINGS" | cut -c1-12)
export GATEWAY_STACK_SETTINGS_HASH
export GATEWAY_STACK_DIR=${GATEWAY_STACK_DIR:-/var/lib/kernel-gateway-stack}
export GATEWAY_STACK_SECRETS=$GATEWAY_STACK_DIR/secrets
export GATEWAY_STACK_PORT_PREFIX=${GATEWAY_STACK_PORT_PREFIX:-89}
export GATEWAY_STACK_POSTGRES_PORT=${GATEWAY_STACK_POSTGRES_PORT:-5433}
export GATEWAY_STACK_REPLICAS=${GATEWAY_STACK_REPLICAS:-2}
SWARM_MARK=$GATEWAY_STACK_DIR/.swarm-made-by-stack.sh
# `up` made GATEWAY_STACK_DIR a bind mount of itself (`down` unmounts only what it made)
BIND_MARK=/run/kernel-gateway/stack-bind-$(printf '%s' "$GATEWAY_STACK_DIR" | sha256sum | cut -c1-16)
WAIT=${GATEWAY_STACK_WAIT:-300}

# The stack's services, or its containers, still there (one line each).
services_left() { docker service ls -q --filter "label=com.docker.stack.namespace=$NAME"; }
containers_left() { docker ps -aq --filter "label=com.docker.stack.namespace=$NAME"; }

swarm_state() { docker info --format '{{.Swarm.LocalNodeState}}'; }

ensure_swarm() {
    if [ "$(swarm_state)" = active ]; then
        log "this engine is in a swarm already"
        return 0
    fi
    # the node's address is loopback: nothing of the swarm's listens on another address
    docker swarm init --advertise-addr 127.0.0.1 --listen-addr 127.0.0.1:2377 >/dev/null
    : > "$SWARM_MARK"
    log "made this engine a one-node swarm (down leaves it)"
}

# GATEWAY_STACK_DIR as a mount of its own, shared: the gateways mount sandboxes' tmpfs
# under it in their containers (rshared), and the engine must see them.
ensure_shared_folder() {
    mkdir -p "$GATEWAY_STACK_DIR/sandboxes"
    chmod 0711 "$GATEWAY_STACK_DIR"
    mkdir -p -m 0700 /run/kernel-gateway
    if ! mountpoint -q "$GATEWAY_STACK_DIR"; then
        mount --bind "$GATEWAY_STACK_DIR" "$GATEWAY_STACK_DIR"
        : > "$BIND_MARK"
    fi
    mount --make-shared "$GATEWAY_STACK_DIR"
}

random_hex() { python3 -c 'import secrets; print(secrets.token_hex(24))'; }

ensure_secrets() {
    local s=$GATEWAY_STACK_SECRETS
    (umask 077 && mkdir -p "$s")
    [ -s "$s/postgres_password" ] || (umask 077 && random_hex > "$s/postgres_password")
    (umask 077 && printf 'postgresql://gateway:%s@127.0.0.1:%s/gateway\n' \
        "$(cat "$s/postgres_password")" "$GATEWAY_STACK_POSTGRES_PORT" > "$s/store_dsn")
    if [ -n "${GATEWAY_STACK_TOKENS:-}" ]; then
        (umask 077 && cp "$GATEWAY_STACK_TOKENS" "$s/tokens.json")
    elif [ ! -s "$s/tokens.json" ]; then
        local token
        token=$(random_hex)
        (umask 077 && printf '{"%s": {"user": "admin", "role": "admin"}}\n' "$token" > "$s/tokens.json")
        log "made $s/tokens.json with one admin token: $token"
    fi
}

wait_for_lb() {
    local url="http://127.0.0.1:${GATEWAY_STACK_PORT_PREFIX}00/v1/health" deadline=$((SECONDS + WAIT))
    log "waiting for $url"
    until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || {
            docker service ps --no-trunc "${NAME}_gateway" >&2 || true
            die "the load balancer did not answer within $WAIT s"
        }
        sleep 1
    done
    printf 'http://127.0.0.1:%s00\n' "$GATEWAY_STACK_PORT_PREFIX"
}

up() {
    [ "$(id -u)" -eq 0 ] || die "run as root (the gateway's Docker backend mounts, as root)"
    docker info >/dev/null 2>&1 || die "docker does not answer (start it, e.g. .ci/docker-up.sh)"
    local line
    if [ -z "${GATEWAY_STACK_KERNEL_IMAGE:-}" ]; then
        GATEWAY_STACK_KERNEL_IMAGE=$("$REPO_ROOT/docker/build.sh" | tail -n 1)
    fi
    export GATEWAY_STACK_KERNEL_IMAGE
    while IFS= read -r line; do
        case "$line" in
            GATEWAY_STACK_*_IMAGE=*) export "${line?}" ;;
            *) die "unexpected line from docker/build-stack.sh: $line" ;;
        esac
    done < <("$REPO_ROOT/docker/build-stack.sh")
    mkdir -p "$GATEWAY_STACK_DIR"
    ensure_swarm
    ensure_shared_folder
    ensure_secrets
    docker stack deploy --resolve-image never -c "$SCRIPT_DIR/stack.yaml" "$NAME" >&2
    wait_for_lb
}

down() {
    local volumes=
    case "${1:-}" in
        --volumes) volumes=1 ;;
        "") ;;
        *) die "unknown argument: $1" ;;
    esac
    docker info >/dev/null 2>&1 || die "docker does not answer"
    if [ "$(swarm_state)" = active ] && [ -n "$(services_left)" ]; then
        docker stack rm "$NAME" >&2
    fi
    # the replicas drain first (up to their stop_grace_period)
    local deadline=$((SECONDS + 420))
    while [ -n "$(containers_left)" ]; do
        [ "$SECONDS" -lt "$deadline" ] || die "the stack's containers are still there after 420 s"
        sleep 1
    done
    if [ -n "$volumes" ]; then
        docker volume rm "${NAME}_postgres" >/dev/null 2>&1 || true
    fi
    if [ -f "$SWARM_MARK" ] && [ -n "$(docker service ls -q)" ]; then
        # another stack's services run in it now: leaving would take them down
        log "the swarm this script made now runs other services: it stays"
    elif [ -f "$SWARM_MARK" ]; then
        docker swarm leave --force >/dev/null
        # the bridge the swarm made at its first task (it outlives the swarm)
        docker network rm docker_gwbridge >/dev/null 2>&1 || true
        rm -f "$SWARM_MARK"
        log "left the swarm this script made"
    fi
    if [ -f "$BIND_MARK" ] && mountpoint -q "$GATEWAY_STACK_DIR"; then
        umount "$GATEWAY_STACK_DIR" || log "warning: could not unmount $GATEWAY_STACK_DIR"
    fi
    rm -f "$BIND_MARK"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) shift; down "$@" ;;
    *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
