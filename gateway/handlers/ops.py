"""Operations: `/v1/health` and `/metrics`."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.metrics import CONTENT_TYPE
from gateway.version import __version__


class HealthHandler(BaseHandler):
    public = True

    def get(self) -> None:
        runs = self.services.runs
        self.send_json(
            {
                "status": "draining" if runs.draining else "ok",
                "backend": self.services.backend.name,
                "kernels": {"running": runs.running, "pooled": runs.kernels.ready},
                "pools": runs.kernels.describe(),
                "version": __version__,
            }
        )


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.services.metrics.render())
