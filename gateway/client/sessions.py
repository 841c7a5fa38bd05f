"""Sessions: runs that each start from the state the one before kept (API.md, "Snapshots").

    with client.session() as s:
        s.run("x = 1")
        s.run("print(x)")          # 1
        other = s.fork()           # a branch: the same state, apart from now on
        other.run("x = 2")
        s.run("print(x)")          # still 1

Each run is sent with `keep` and, after the first, `from` the last kept snapshot. A run
whose state could not be kept (it timed out, was killed) leaves the session where it was:
its record's notes say why. Leaving the block deletes the snapshots this session kept
(a fork's are its own).
"""

from __future__ import annotations

import contextlib
from typing import Protocol, Unpack

from gateway.client.base import RunOptions
from gateway.errors import NotFound, SnapshotGone
from gateway.models.typed import TypedRunRecord


class SyncRuns(Protocol):
    """What a session needs of a client (`GatewayClient`)."""

    def run(self, code: str | None = None, **options: Unpack[RunOptions]) -> TypedRunRecord: ...

    def delete_snapshot(self, snapshot_id: str) -> None: ...


class AsyncRuns(Protocol):
    """What an async session needs of a client (`AsyncGatewayClient`)."""

    async def run(
        self, code: str | None = None, **options: Unpack[RunOptions]
    ) -> TypedRunRecord: ...

    async def delete_snapshot(self, snapshot_id: str) -> None: ...


class _State:
    """Where a session is: the snapshot its next run starts from, and what it kept."""

    def __init__(self, snapshot: str | None) -> None:
        self.snapshot = snapshot
        self.kept: list[str] = []

    def options(self, options: RunOptions) -> RunOptions:
        chosen: RunOptions = {**options, "keep": True}
        if self.snapshot is not None:
            chosen["continue_from"] = self.snapshot
        return chosen

    def after(self, record: TypedRunRecord) -> TypedRunRecord:
        if record.snapshot is not None:
            self.snapshot = record.snapshot.id
            self.kept.append(record.snapshot.id)
        return record


class Session:
    """A sync client's session (`GatewayClient.session`)."""

    def __init__(self, client: SyncRuns, snapshot: str | None = None) -> None:
        self.client = client
        self._state = _State(snapshot)

    @property
    def snapshot(self) -> str | None:
        """The snapshot the next run starts from (None before the first)."""
        return self._state.snapshot

    def run(self, code: str | None = None, **options: Unpack[RunOptions]) -> TypedRunRecord:
        record = self.client.run(code, **self._state.options(options))
        return self._state.after(record)

    def fork(self) -> Session:
        """A session that starts from this one's state and goes its own way."""
        return Session(self.client, self._state.snapshot)

    def close(self) -> None:
        kept, self._state.kept = self._state.kept, []
        for snapshot in kept:
            # one that already went (evicted, expired) is no failure
            with contextlib.suppress(NotFound, SnapshotGone):
                self.client.delete_snapshot(snapshot)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncSession:
    """An async client's session (`AsyncGatewayClient.session`)."""

    def __init__(self, client: AsyncRuns, snapshot: str | None = None) -> None:
        self.client = client
        self._state = _State(snapshot)

    @property
    def snapshot(self) -> str | None:
        return self._state.snapshot

    async def run(self, code: str | None = None, **options: Unpack[RunOptions]) -> TypedRunRecord:
        record = await self.client.run(code, **self._state.options(options))
        return self._state.after(record)

    def fork(self) -> AsyncSession:
        return AsyncSession(self.client, self._state.snapshot)

    async def aclose(self) -> None:
        kept, self._state.kept = self._state.kept, []
        for snapshot in kept:
            with contextlib.suppress(NotFound, SnapshotGone):
                await self.client.delete_snapshot(snapshot)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
