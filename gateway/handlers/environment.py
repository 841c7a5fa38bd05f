"""`GET /v1/environment`: the languages this gateway's kernels have, with their kernels and
installed packages (the backend reads them: `SandboxBackend.environment`)."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from gateway.handlers.base import BaseHandler
from gateway.models.environment import Environment

log = logging.getLogger(__name__)


class EnvironmentHandler(BaseHandler):
    async def get(self) -> None:
        backend = self.services.backend
        found = await backend.environment()
        answer = Environment.unknown(backend.name)
        if found is not None:
            try:
                answer = Environment.read(
                    found.found, backend=backend.name, source=found.source, image=found.image
                )
            except ValidationError as exc:
                log.warning("the kernels' environment list has an unexpected shape: %s", exc)
        await self.send_json(answer)
