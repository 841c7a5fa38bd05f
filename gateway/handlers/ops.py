"""Operations: `/v1/health` and `/metrics`."""

from __future__ import annotations

import asyncio

from gateway.handlers.base import BaseHandler
from gateway.metrics import CONTENT_TYPE
from gateway.models.answers import Health, Kernels, Pool, StoreHealth
from gateway.version import __version__


class HealthHandler(BaseHandler):
    public = True

    async def get(self) -> None:
        runs = self.services.runs
        store_ok = await self._store_answers()
        status = "draining" if runs.draining else "ok"
        if not store_ok:  # not ready: a load balancer sends new runs to another replica
            status = "store_unavailable"
        health = Health(
            status=status,
            backend=self.services.backend.name,
            store=StoreHealth(kind=runs.store.kind, ok=store_ok),
            kernels=Kernels(running=runs.running, pooled=runs.kernels.ready),
            pools={kind: Pool(**pool) for kind, pool in runs.kernels.describe().items()},
            version=__version__,
        )
        self.send_json(health, 200 if store_ok else 503)

    async def _store_answers(self) -> bool:
        """Whether the store answers within STORE_PING_TIMEOUT. A ping that takes longer is
        left to end on its own (cancelling it would wait for the driver's cancel, which can
        take longer still); until it has, the store is taken as not answering."""
        if _PINGS:  # the last one is still waiting: the store is not answering now
            return False
        ping = asyncio.ensure_future(self.services.runs.store.ping())
        done, _ = await asyncio.wait({ping}, timeout=STORE_PING_TIMEOUT)
        if not done:
            _PINGS.add(ping)
            ping.add_done_callback(_finished_ping)
            return False
        return ping.exception() is None


STORE_PING_TIMEOUT = 3.0  # seconds: a health probe answers within its own timeout
_PINGS: set[asyncio.Future[None]] = set()  # late pings, held until they end


def _finished_ping(ping: asyncio.Future[None]) -> None:
    _PINGS.discard(ping)
    if not ping.cancelled():
        ping.exception()  # retrieved: a late failure is expected, not an unhandled error


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.services.metrics.render())
