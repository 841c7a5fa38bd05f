"""Operations: `/v1/health` and `/metrics`."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.metrics import CONTENT_TYPE
from gateway.models.answers import Health, Kernels, Pool, StoreHealth
from gateway.version import __version__


class HealthHandler(BaseHandler):
    """Public: whether this gateway serves (a load balancer's probe). What it runs (backend,
    store, kernels, pools, version) only for a caller with a valid token, or on a
    single-user gateway: running kernels and pool hits tell of other tenants' activity."""

    public = True

    async def get(self) -> None:
        runs = self.services.runs
        store_ok = await runs.store.answers(STORE_PING_TIMEOUT)
        status = "draining" if runs.draining else "ok"
        if not store_ok:  # not ready: a load balancer sends new runs to another replica
            status = "store_unavailable"
        tokens = self.services.tokens
        if tokens.enabled and tokens.authenticate(self.presented_token()) is None:
            await self.send_json(Health(status=status), 200 if store_ok else 503)
            return
        health = Health(
            status=status,
            backend=self.services.backend.name,
            store=StoreHealth(kind=runs.store.kind, ok=store_ok),
            kernels=Kernels(running=runs.running, pooled=runs.pools.ready),
            pools={kind: Pool(**pool) for kind, pool in runs.pools.describe().items()},
            version=__version__,
        )
        await self.send_json(health, 200 if store_ok else 503)


STORE_PING_TIMEOUT = 3.0  # seconds: a health probe answers within its own timeout


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.services.metrics.render())
