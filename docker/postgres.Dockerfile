# The store of the gateway's Swarm stack (kernel-gateway-postgres:<hash>): Debian's
# PostgreSQL 15 from the stack's base; entrypoint.sh makes the cluster, the role and the
# database at first start (docker/stack/postgres-entrypoint.sh). Built by
# docker/build-stack.sh, offline. Any PostgreSQL the replicas reach will do instead.
ARG BASE=kernel-gateway-base:bookworm
FROM ${BASE}
LABEL org.opencontainers.image.title="kernel-gateway-postgres"
COPY entrypoint.sh /usr/local/lib/kernel-gateway/
# deploy/stack.yaml hands the password secret to uid 101 (postgres): say so here if the
# base's postgres is another uid, rather than crash-loop on an unreadable secret there
RUN test "$(id -u postgres)" = 101 \
 && chmod 0755 /usr/local/lib/kernel-gateway/entrypoint.sh \
 && mkdir -p /var/lib/postgresql/data /run/postgresql \
 && chown postgres:postgres /var/lib/postgresql/data /run/postgresql \
 && chmod 0700 /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data \
    PGPORT=5432 \
    LANG=C.UTF-8
USER postgres
VOLUME /var/lib/postgresql/data
# SIGINT: PostgreSQL's fast shutdown (open sessions are ended, the data is flushed)
STOPSIGNAL SIGINT
HEALTHCHECK --interval=5s --timeout=5s --start-period=30s --retries=3 \
    CMD ["sh", "-c", "pg_isready -q -h 127.0.0.1 -p \"$PGPORT\""]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/lib/kernel-gateway/entrypoint.sh"]
