# The load balancer in front of the gateway's replicas (kernel-gateway-lb:<hash>): Debian's
# HAProxy 2.6 from the stack's base, its configuration written at start by entrypoint.sh
# from the environment (docker/stack/lb-entrypoint.sh says which). Built by
# docker/build-stack.sh, offline.
ARG BASE=kernel-gateway-base:bookworm
FROM ${BASE}
LABEL org.opencontainers.image.title="kernel-gateway-lb"
COPY entrypoint.sh healthcheck.py /usr/local/lib/kernel-gateway/
RUN chmod 0755 /usr/local/lib/kernel-gateway/entrypoint.sh \
 && mkdir -p /run/haproxy-lb \
 && chown haproxy:haproxy /run/haproxy-lb \
 && haproxy -v
ENV LB_PORT=8900 \
    REPLICAS=2 \
    REPLICA_PORT_PREFIX=89 \
    LANG=C.UTF-8
USER haproxy
# SIGUSR1: a soft stop (HAProxy stops listening, open connections and streams finish)
STOPSIGNAL SIGUSR1
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python3", "/usr/local/lib/kernel-gateway/healthcheck.py"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/lib/kernel-gateway/entrypoint.sh"]
