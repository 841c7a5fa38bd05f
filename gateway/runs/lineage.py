"""What the store knows of snapshots: where one lives, why one went, and the code that made
it (DESIGN.md decision 24, "Gone, elsewhere, rebuilt").

A snapshot lives in one gateway's memory (`gateway.runs.snapshots`), but its id names the
run that kept it (`snap_<run>_<random>`), and that run's record, in the shared store, says
which instance holds it (`snapshot.instance`) and, once it went, why (`snapshot.gone`).
So a gateway asked for a snapshot it does not hold can say which of these it is:

- no such record, or another user's: 404, exactly as for an unknown id;
- the record says it went, or its instance is this gateway (a previous life of it: a
  gateway's snapshots end with it), or no live gateway holds that instance id: 410
  `snapshot_gone`, saying why;
- a live replica holds it: 409 `snapshot_elsewhere` naming the instance, for the client
  to resend there (`X-Gateway-Instance`).

The chain of a snapshot is the code of every run from the first (`code`, then each
`continued_from`'s); with `rebuild: true` a run whose snapshot is gone or elsewhere
replays it in a fresh kernel instead (`continued_by: "replay"`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Callable

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    SnapshotElsewhere,
    SnapshotGone,
)
from gateway.models.notebook import cell_source
from gateway.models.record import RunRecord, SnapshotInfo
from gateway.store.base import UNFINISHED, RecordStore

log = logging.getLogger(__name__)

_RUN_OF = re.compile(r"snap_([0-9a-f]{20})_[A-Za-z0-9_-]{16}")
# a chain is at most this many runs long (a snapshot's continuations nest 30 deep, and a
# rebuilt run's own chain adds to its source's)
MAX_CHAIN = 1000
RESTARTED = "its gateway stopped (a gateway's snapshots end with it)"


def snapshot_name(run_id: str) -> str:
    """A new snapshot id of run `run_id` (`run_` and 20 hex digits)."""
    return f"snap_{run_id.removeprefix('run_')}_{secrets.token_urlsafe(12)}"


def run_of(snapshot_id: str) -> str | None:
    """The id of the run that kept `snapshot_id`, if it is an id this gateway makes."""
    found = _RUN_OF.fullmatch(snapshot_id)
    return None if found is None else f"run_{found.group(1)}"


def kept_by(record: RunRecord) -> list[SnapshotInfo]:
    """The states a record says its run kept: its cells' and its final one."""
    final = [] if record.snapshot is None else [record.snapshot]
    return [*record.snapshots, *final]


def kept_in(record: RunRecord, snapshot_id: str) -> SnapshotInfo | None:
    """The record's snapshot of that id (its final state's, or one of its cells')."""
    return next((info for info in kept_by(record) if info.id == snapshot_id), None)


def say_gone(record: RunRecord, snapshot_id: str, why: str) -> None:
    """The record says that snapshot went (a replay's last cell's state is also its final
    one: both places say it)."""
    for info in kept_by(record):
        if info.id == snapshot_id:
            info.gone = why


class Lineage:
    """Snapshots as the store records them; `went` keeps the records true as they go."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self._writing: set[asyncio.Task[None]] = set()
        # run id -> {snapshot id: why}: what its record is still to say, written by one task
        # per record at a time (two would each write the record as they read it)
        self._pending: dict[str, dict[str, str]] = {}

    async def find(self, snapshot_id: str, user: str) -> tuple[RunRecord, SnapshotInfo]:
        """The record of `user`'s snapshot and its info there; 404 if there is none."""
        run_id = run_of(snapshot_id)
        record = None if run_id is None else await self.store.get(run_id)
        info = None if record is None or record.user != user else kept_in(record, snapshot_id)
        if record is None or info is None:
            raise NotFound(f"There is no snapshot {snapshot_id}.", field="from")
        return record, info

    async def missing(self, snapshot_id: str, user: str) -> GatewayError:
        """Why this gateway does not hold `user`'s snapshot (see the module docstring)."""
        try:
            _, info = await self.find(snapshot_id, user)
        except NotFound as exc:
            return exc
        if info.gone is not None:
            why = info.gone
        elif info.instance == self.store.replica:
            why = RESTARTED
        elif not await self.store.instance_alive(info.instance):
            why = f"its gateway ({info.instance}) stopped"
        else:
            return SnapshotElsewhere(
                f"The snapshot {snapshot_id} is held by the gateway instance {info.instance}: "
                "send the request there (header X-Gateway-Instance), or add `rebuild: true` "
                "to replay its chain's code here.",
                instance=info.instance,
                field="from",
            )
        return SnapshotGone(f"The snapshot {snapshot_id} is gone: {why}.", field="from")

    async def chain(self, snapshot_id: str, user: str, language: str) -> list[str]:
        """The code that made `user`'s snapshot, cell by cell (a run is one), the first
        first; 400 if it is another language's than the run's."""
        codes: list[str] = []
        next_id: str | None = snapshot_id
        runs = 0
        while next_id is not None:
            runs += 1
            if runs > MAX_CHAIN:
                raise SnapshotGone(
                    f"The chain of {snapshot_id} is more than {MAX_CHAIN} runs long; it is "
                    "not replayed.",
                    field="from",
                )
            try:
                record, info = await self.find(next_id, user)
            except NotFound:
                if next_id == snapshot_id:
                    raise
                raise SnapshotGone(
                    f"The snapshot {snapshot_id} cannot be rebuilt: the record of the run "
                    f"that kept {next_id}, on its chain, is gone.",
                    field="from",
                ) from None
            if record.language != language:
                raise InvalidRequest(
                    f"The snapshot {snapshot_id} is of a {record.language} kernel; this run "
                    f"is {language}.",
                    field="language",
                )
            codes[:0] = _code_until(record, info)
            next_id = record.continued_from
        return codes

    def went(self, run_id: str, snapshot_id: str, why: str) -> None:
        """Say in its record that a snapshot went (in the background)."""
        pending = self._pending.get(run_id)
        if pending is not None:  # its record is being written: the same task writes it too
            pending[snapshot_id] = why
            return
        self._pending[run_id] = {snapshot_id: why}
        task = asyncio.create_task(self._amend(run_id))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _amend(self, run_id: str) -> None:
        """Write what is pending for `run_id`'s record until nothing is."""
        try:
            while pending := self._pending.get(run_id):
                self._pending[run_id] = {}
                record = await self.store.get(run_id)
                if record is None or record.status in UNFINISHED:
                    return  # went first (expired, its owner's quota), or not final yet
                for snapshot_id, why in pending.items():
                    say_gone(record, snapshot_id, why)
                await self.store.amend(record)
        except Exception as exc:  # its instance's death says it anyway (`missing`)
            log.warning("the record of run %s could not say its snapshot went: %s", run_id, exc)
        finally:
            self._pending.pop(run_id, None)

    def annotate(self, record: RunRecord, knows: Callable[[str], bool]) -> None:
        """A record read from the store whose snapshot this gateway never kept (`knows`:
        whether it kept an id) though its instance is this one's was kept by a previous
        life of it: say so (a crash wrote nothing)."""
        for info in kept_by(record):
            if info.instance == self.store.replica and info.gone is None and not knows(info.id):
                info.gone = RESTARTED

    @property
    def busy(self) -> bool:
        return bool(self._writing)

    async def settle(self) -> None:
        """Every record told of a snapshot that went has been written."""
        while self._writing:
            await asyncio.gather(*self._writing, return_exceptions=True)


def _code_until(record: RunRecord, info: SnapshotInfo) -> list[str]:
    """The cells a run ran up to the state `info`, in order: a run's code; a replay's code
    cells that ran (those with an execution count), up to `info.cell`."""
    if record.notebook is None:
        return [record.code]
    cells = record.notebook.get("cells", [])
    if info.cell is not None:
        cells = cells[: info.cell + 1]
    return [
        cell_source(c)
        for c in cells
        if c.get("cell_type") == "code" and c.get("execution_count") is not None
    ]
