"""Operations: `/v1/health` and `/metrics`."""

from __future__ import annotations

import asyncio

from gateway.errors import StoreUnavailable
from gateway.handlers.base import BaseHandler
from gateway.metrics import CONTENT_TYPE
from gateway.version import __version__


class HealthHandler(BaseHandler):
    public = True

    async def get(self) -> None:
        runs = self.services.runs
        store_ok = await self._store_answers()
        status = "draining" if runs.draining else "ok"
        if not store_ok:  # not ready: a load balancer sends new runs to another replica
            status = "store_unavailable"
        self.send_json(
            {
                "status": status,
                "backend": self.services.backend.name,
                "store": {"kind": runs.store.kind, "ok": store_ok},
                "kernels": {"running": runs.running, "pooled": runs.kernels.ready},
                "pools": runs.kernels.describe(),
                "version": __version__,
            },
            200 if store_ok else 503,
        )

    async def _store_answers(self) -> bool:
        try:
            await asyncio.wait_for(self.services.runs.store.ping(), STORE_PING_TIMEOUT)
        except (StoreUnavailable, TimeoutError):
            return False
        return True


STORE_PING_TIMEOUT = 3.0  # seconds: a health probe answers within its own timeout


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.services.metrics.render())
