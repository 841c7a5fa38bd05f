"""`GET /v1/usage`: what the caller's runs spent and may spend (`gateway.runs.usage`)."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.runs.usage import usage, whose


class UsageHandler(BaseHandler):
    async def get(self) -> None:
        runs, uploads = self.services.runs, self.services.uploads
        user = whose(self.request.query_arguments, self.user)
        shelf = None if uploads is None else uploads.shelf
        found = await usage(self.user.user, user, runs.store, runs.quotas, shelf, runs.snapshots)
        await self.send_json(found)
