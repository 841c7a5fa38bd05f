"""Operations: `/v1/health` and `/metrics`."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.metrics import CONTENT_TYPE
from gateway.models.answers import Health, Kernels, Pool
from gateway.version import __version__


class HealthHandler(BaseHandler):
    public = True

    def get(self) -> None:
        runs = self.services.runs
        health = Health(
            status="draining" if runs.draining else "ok",
            backend=self.services.backend.name,
            kernels=Kernels(running=runs.running, pooled=runs.kernels.ready),
            pools={kind: Pool(**pool) for kind, pool in runs.kernels.describe().items()},
            version=__version__,
        )
        self.send_json(health)


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.services.metrics.render())
