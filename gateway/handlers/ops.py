"""Operations: `/v1/health` and `/metrics`.

Both tell of every tenant's activity (runs by status and language, running and pooled
kernels, pool hits, the queue), so on a gateway with tokens only an operator sees it: an
admin's token, or the metrics token (`--metrics-token-file`, which Prometheus sends as the
bearer token of its scrape and which opens nothing else). A user's token is told as much
as anyone: whether the gateway serves. A single-user gateway tells its user everything.
"""

from __future__ import annotations

from gateway.errors import Forbidden, Unauthorized
from gateway.handlers.base import BaseHandler
from gateway.metrics import CONTENT_TYPE
from gateway.models.answers import Health, Kernels, Pool, StoreHealth
from gateway.version import __version__


class HealthHandler(BaseHandler):
    """Public: whether this gateway serves (a load balancer's probe). What it runs (backend,
    store, kernels, pools, version) only for an operator (`TokenTable.sees_gateway`)."""

    public = True

    async def get(self) -> None:
        runs = self.services.runs
        store_ok = await runs.store.answers(STORE_PING_TIMEOUT)
        status = "draining" if runs.draining else "ok"
        if not store_ok:  # not ready: a load balancer sends new runs to another replica
            status = "store_unavailable"
        if not self.services.tokens.sees_gateway(self.presented_token()):
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
    """Prometheus text, for an operator only (`TokenTable.sees_gateway`): 401 without a
    valid token, 403 for a user's."""

    public = True  # checked in `get`: the metrics token is no user's, so no principal

    def get(self) -> None:
        tokens = self.services.tokens
        presented = self.presented_token()
        if not tokens.sees_gateway(presented):
            if tokens.authenticate(presented) is None:
                raise Unauthorized(self.unauthorized_message)
            raise Forbidden(
                "/metrics tells of every user's activity: it needs an admin's token or the "
                "operator's metrics token (--metrics-token-file)."
            )
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.services.metrics.render())
