#!/bin/sh
# The load balancer's entrypoint: writes HAProxy's configuration and runs it (master-worker,
# in the foreground, under tini).
#   LB_PORT              where it listens, on 127.0.0.1 (8900)
#   REPLICAS             how many gateway replicas (2): replica n listens on
#   REPLICA_PORT_PREFIX  <prefix><n as two digits>, e.g. 8901, 8902 (deploy/stack.yaml
#                        gives task slot n that port)
#   LB_BIND              the address it binds (127.0.0.1)
# Each replica is checked with `GET /v1/health` every 2 s: down after two failures (a
# draining replica has closed its listener; one without its store answers 503), up after
# one success. A request whose connection a replica refuses goes to another (redispatch);
# each request has a connection of its own to its replica (http-server-close), so none is
# sent over a kept-alive connection to a replica that has begun to drain. WebSocket
# upgrades pass through (`timeout tunnel` bounds an idle stream); a synchronous run may wait
# for a slot, then a kernel's start (60 s), then run for the gateway's largest timeout (300
# s): the server timeout (900 s) is well above that, so that no client is told 504 while its
# run goes on (and sent to retry it). HAProxy's own hard stop comes before Docker's SIGKILL
# (the service's stop_grace_period, 400 s).
set -eu
LB_BIND=${LB_BIND:-127.0.0.1}
config=/run/haproxy-lb/haproxy.cfg
{
    cat <<CFG
global
    log stdout format raw local0 notice
    maxconn 4096
    hard-stop-after 390s

defaults
    mode http
    log global
    option httplog
    option dontlognull
    option http-server-close
    option forwardfor
    option redispatch 1
    retries 3
    # only a connection the replica refused: a request it received and then dropped (it
    # died mid-run) is never sent again, to another replica, to run twice
    retry-on conn-failure
    timeout connect 5s
    timeout http-request 30s
    timeout client 900s
    timeout server 900s
    timeout tunnel 1h
    timeout client-fin 30s

frontend gateway
    bind ${LB_BIND}:${LB_PORT}
    monitor-uri /lb-health
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /v1/health
    http-check expect status 200
    default-server inter 2s fall 2 rise 1
CFG
    n=1
    while [ "$n" -le "$REPLICAS" ]; do
        printf '    server replica%d 127.0.0.1:%s%02d check\n' "$n" "$REPLICA_PORT_PREFIX" "$n"
        n=$((n + 1))
    done
} > "$config"
haproxy -c -q -f "$config"
exec haproxy -W -db -f "$config"
