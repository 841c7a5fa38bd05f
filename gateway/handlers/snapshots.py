"""`/v1/snapshots`: the kernel states the caller's runs kept (`gateway.runs.snapshots`)."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.models.record import SnapshotList


class SnapshotsHandler(BaseHandler):
    async def get(self) -> None:
        snapshots = self.services.runs.snapshots
        own = sorted(snapshots.owned(self.user.user), key=lambda s: s.used)
        await self.send_json(SnapshotList(snapshots=[snapshots.info(s) for s in own]))


class SnapshotHandler(BaseHandler):
    async def delete(self, snapshot_id: str) -> None:
        self.services.runs.snapshots.delete(snapshot_id, self.user.user)
        self.set_status(204)
        await self.finish()
