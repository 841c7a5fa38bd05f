# The gateway's own image (kernel-gateway:<hash>), for deploy/stack.yaml and
# deploy/kubernetes/. Built by docker/build-stack.sh, offline (`docker build --network
# none`), from a context it assembles:
#   Dockerfile, requirements.txt (docker/stack/gateway-requirements.txt), wheelhouse/
#   (every wheel), src/ (pyproject.toml, gateway/, kernels/), entrypoint.sh, healthcheck.py
# BASE is build-stack.sh's debootstrap-made Debian 12 (python3, python3-venv, tini).
#
# Layout:
#   /opt/venv                      the gateway and its server extras (Docker SDK,
#                                  PostgreSQL driver, pyseccomp); `gateway` on PATH
#   /var/lib/kernel-gateway        the default data dir, owned by the user `gateway`
#   /usr/local/lib/kernel-gateway  entrypoint.sh, healthcheck.py
#   user gateway, uid 10001 (the default; the Docker backend needs root: deploy/stack.yaml)
ARG BASE=kernel-gateway-base:bookworm

# ---------------------------------------------------------------- builder
FROM ${BASE} AS builder
ENV LANG=C.UTF-8 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
COPY requirements.txt /tmp/requirements.txt
COPY wheelhouse/ /wheelhouse/
# the dependencies first: a change of the gateway's code reuses this layer
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-index --find-links /wheelhouse \
        --require-virtualenv -r /tmp/requirements.txt
COPY src/ /tmp/src/
RUN /opt/venv/bin/python -m pip install --no-index --find-links /wheelhouse \
        --require-virtualenv --no-deps /tmp/src \
 && /opt/venv/bin/python -m pip check \
 && /opt/venv/bin/python -c "import docker, psycopg, psycopg_pool, pyseccomp, gateway.server" \
 && /opt/venv/bin/gateway serve --help >/dev/null \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib/python3.11/site-packages/gateway \
        /opt/venv/lib/python3.11/site-packages/kernels

# ------------------------------------------------------------------ final
FROM ${BASE}
LABEL org.opencontainers.image.title="kernel-gateway"
COPY --from=builder /opt/venv /opt/venv
COPY entrypoint.sh healthcheck.py /usr/local/lib/kernel-gateway/
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/kernel-gateway \
        --shell /usr/sbin/nologin gateway \
 && mkdir -p /var/lib/kernel-gateway \
 && chown gateway:gateway /var/lib/kernel-gateway \
 && chmod 0755 /usr/local/lib/kernel-gateway/entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=127.0.0.1 \
    GATEWAY_PORT=8888 \
    GATEWAY_DATA_DIR=/var/lib/kernel-gateway
USER gateway
WORKDIR /var/lib/kernel-gateway
EXPOSE 8888
# SIGTERM drains (running runs finish, up to --drain-timeout); tini passes it on and reaps
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "/usr/local/lib/kernel-gateway/healthcheck.py"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/lib/kernel-gateway/entrypoint.sh"]
CMD ["gateway", "serve"]
