"""The one store interface: run records, admission against the per-user limit, leases and
cancel requests between replicas. Two implementations, `SQLiteStore` (one gateway, the
default: nothing to install) and `PostgresStore` (any number of gateway replicas on one
database). The run service never knows which one it has (DESIGN.md decision 9).

Who calls what, in order:

    Gateway.start        open(), then recover(note): fail what a previous life of this
                         replica left unfinished (its kernels died with it)
    RunService.submit    admit(record, limit): store the new `queued` record, owned by this
                         replica, unless its user already has `limit` runs unfinished
                         anywhere; the store decides atomically
    a run's task         update(record) when it starts running; finish(record, quota) once
                         final (the owner's oldest finished records make room)
    requests             get(run_id); request_cancel(run_id, note) for a run this replica
                         does not run, then wait_final(run_id, timeout); list_runs(query)
                         for a page of one user's runs (`GET /v1/runs`)
    the heartbeat        (shared stores only) lease_link(): a connection of the
                         heartbeat's own, in a thread of its own (gateway/runs/leases.py),
                         that holds this replica's instance id while it lives; through it
                         renew(run_ids) every beat: this replica's leases, and the cancel
                         requests it may have missed; fail_expired(note) fails the runs of
                         replicas whose lease ran out
    the claims loop      (stores that queue: `queues`) enqueue(record, limit, request, cap)
                         admits a background run no slot of this replica could take, with
                         its request, into the store's queue; claim(...) takes the oldest
                         one a free slot here may run (`gateway/runs/claims.py`);
                         unqueue(run_id, note) cancels one still queued
    the expiry loop      expire(ttl)
    /v1/health           answers(timeout) -> ping(), on a connection of its own
    Gateway.stop         close()

Uploads are kept where `upload_shelf()` says: files under the data dir beside SQLite, a
table of the PostgreSQL store (visible from every replica).

`on_cancel` (set by the run service before `open`) is called with (run_id, note) when
another replica asks this one to cancel a run it owns; `on_queued` (set by the claims loop)
when any replica put a run in the store's queue. Times that decide anything between
replicas (leases, record ages) are the database's clock, never a replica's.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gateway.budget import Quota
from gateway.models.record import RunRecord
from gateway.store.config import StoreConfig
from gateway.uploads.shelf import UploadShelf

UNFINISHED = ("queued", "running")


@dataclasses.dataclass(frozen=True)
class Renewal:
    """What a heartbeat learned: cancel requests for runs of this replica (run id -> note),
    and runs this replica no longer owns (another replica failed them: the lease ran out)."""

    cancels: dict[str, str] = dataclasses.field(default_factory=dict)
    lost: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Finished:
    """The outcome of storing a final record: how many of the owner's oldest records made
    room, and whether it was kept (False: the run had already been failed elsewhere, after
    this replica's lease on it ran out, and that record stands)."""

    evicted: int = 0
    kept: bool = True


@dataclasses.dataclass(frozen=True)
class RunQuery:
    """A page of one owner's runs, newest first: at most `limit`, only of `status` and
    `language` when given, and only those after `after` (the `Listed.after` of the previous
    page's last run) in that order."""

    owner: str
    limit: int
    status: str | None = None
    language: str | None = None
    after: tuple[str, str] | None = None

    def parameters(self, position: Callable[[str], object]) -> dict[str, object]:
        """The page's SQL parameters by name: `created` and `after` the run to continue
        after (None for the first page), its creation time read by the store's `position`
        (which raises `InvalidPosition`)."""
        created, after = (None, None) if self.after is None else self.after
        return {
            "owner": self.owner,
            "status": self.status,
            "language": self.language,
            "created": None if created is None else position(created),
            "after": after,
            "limit": self.limit,
        }


@dataclasses.dataclass(frozen=True)
class Listed:
    """One run of a page: its summary (`gateway.models.listing.summary_json`), and its
    place in the order as the store writes it (its creation time, in the store's own
    text form, and its id), to continue after it."""

    summary: dict[str, Any]
    after: tuple[str, str]


@dataclasses.dataclass(frozen=True)
class UsageRow:
    """What a user's runs spent in one minute (`gateway.runs.quotas`): CPU of runs going
    and done, runs that ended, the largest peak memory of one of them."""

    user: str
    minute: int  # whole minutes since the epoch (UTC)
    cpu_ms: int
    runs: int
    peak_memory_bytes: int


USAGE_KEPT_MINUTES = 35 * 24 * 60  # a user's usage is kept this long (GET /v1/usage: 30 days)
START_WINDOW = 60.0  # seconds: runs started are counted over the last minute


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A run taken from the store's queue: its record (now this replica's, leased), the
    request as it was queued (`gateway.runs.carried`), and the replica that queued it."""

    record: RunRecord
    request: str
    origin: str


class QueueFull(Exception):
    """This replica already has its `max_queued_runs` waiting in the store's queue."""


class InvalidPosition(ValueError):
    """A `RunQuery.after` this store cannot have written."""


CancelHandler = Callable[[str, str], None]
QueuedHandler = Callable[[], None]


class LeaseLink(abc.ABC):
    """The heartbeat's own way to a shared store: one connection, never the pool that
    requests use, made and used in the heartbeat's thread and event loop only. While it is
    connected it holds this replica's instance id in the store, so that no other live
    process can start with that id."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Connect (again, if the connection was lost) and take the instance id; a no-op
        while connected. Raises `InstanceTaken` naming the holder if another live process
        holds the id, `StoreUnavailable` if the store cannot be reached."""

    @abc.abstractmethod
    async def renew(self, run_ids: Collection[str]) -> Renewal:
        """As `RecordStore.renew`, on this link's connection."""

    @abc.abstractmethod
    async def fail_expired(self, note: str) -> int:
        """As `RecordStore.fail_expired`, on this link's connection."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Disconnect, which gives the instance id up; safe to call more than once."""


class RecordStore(abc.ABC):
    """Where everything that outlives a request is kept; see the module docstring."""

    kind: str  # "sqlite" or "postgresql", as /v1/health reports it
    shared: bool  # may other replicas use it (then leases and remote cancels matter)
    # does it keep a queue of runs any replica may take (`enqueue`, `claim`)? A store of one
    # gateway has no other replica to take them: its runs wait in the run service's own queue
    queues: bool = False

    def __init__(self, replica: str) -> None:
        self.replica = replica  # this gateway's instance id: it owns the runs it executes
        self.on_cancel: CancelHandler | None = None
        self.on_queued: QueuedHandler | None = None
        self._late_ping: asyncio.Future[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and bring the schema to this gateway's version (migrations)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Disconnect; safe to call on a store that opened only partly."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Return if the store answers now; raise `StoreUnavailable` if not."""

    async def answers(self, timeout: float) -> bool:
        """Whether a ping succeeds within `timeout` (readiness). A ping that takes longer is
        left to end on its own (cancelling it would wait for the driver's own cancel, which
        can take longer still); until it has, the store is taken as not answering and no
        other ping starts."""
        if self._late_ping is not None:
            return False
        ping = asyncio.ensure_future(self.ping())
        done, _ = await asyncio.wait({ping}, timeout=timeout)
        if not done:
            self._late_ping = ping
            ping.add_done_callback(self._ping_ended)
            return False
        return ping.exception() is None

    def _ping_ended(self, ping: asyncio.Future[None]) -> None:
        self._late_ping = None
        if not ping.cancelled():
            ping.exception()  # retrieved: a late failure is expected, not an unhandled error

    def describe(self) -> dict[str, Any]:
        """What /v1/health shows of the store (never a password)."""
        return {"kind": self.kind}

    @abc.abstractmethod
    def upload_shelf(self, config: StoreConfig) -> UploadShelf:
        """Where uploaded archives are kept: beside this store, so that every gateway that
        shares the store sees them (DESIGN.md decision 9)."""

    # --- run records --------------------------------------------------------------------

    @abc.abstractmethod
    async def admit(self, record: RunRecord, limit: int) -> int | None:
        """Store a new unfinished record owned by this replica, unless its user already has
        `limit` unfinished runs (on any replica): then store nothing and return how many."""

    # --- usage (`gateway.runs.quotas`) ---------------------------------------------------

    @abc.abstractmethod
    async def spend(
        self,
        user: str,
        minute: int,
        cpu_ms: int,
        windows: tuple[int, ...],
        runs: int = 0,
        peak_memory_bytes: int = 0,
    ) -> tuple[int, ...]:
        """Add to `user`'s usage of `minute` and answer, atomically with the addition (on
        every replica), their CPU milliseconds in each window: the `w` minutes up to
        `minute`, that one included."""

    @abc.abstractmethod
    async def spent(self, user: str, minute: int, windows: tuple[int, ...]) -> tuple[int, ...]:
        """`user`'s CPU milliseconds in each window (as `spend` answers, adding nothing)."""

    @abc.abstractmethod
    async def usage(self, user: str | None, since_minute: int) -> list[UsageRow]:
        """The minutes of `user`'s usage (None: every user's) from `since_minute` on,
        oldest first."""

    @abc.abstractmethod
    async def uncount_start(self, user: str, at: float) -> None:
        """Forget the start `count_start` counted at `at` (the run was not admitted)."""

    @abc.abstractmethod
    async def stored_bytes(self, user: str) -> int:
        """The bytes `user`'s run records take in the store (GET /v1/usage)."""

    @abc.abstractmethod
    async def count_start(self, user: str, now: float, per_minute: int) -> float | None:
        """Count a run started by `user` at `now` (seconds since the epoch) unless
        `per_minute` already started in the `START_WINDOW` before it (fleet-wide): then
        count nothing and answer the seconds until one may start."""

    @abc.abstractmethod
    async def update(self, record: RunRecord) -> bool:
        """Store the progress of an unfinished run this replica owns (False: not ours)."""

    @abc.abstractmethod
    async def finish(
        self, record: RunRecord, quota: Quota | None = None, usage: UsageRow | None = None
    ) -> Finished:
        """Store a run's final record; with a quota, delete the owner's oldest finished
        records while they keep more than it allows; add `usage` (what the run spent) to the
        ledger as `spend` does, in the same trip to the store, whether the record is kept
        or not."""

    @abc.abstractmethod
    async def get(self, run_id: str) -> RunRecord | None: ...

    @abc.abstractmethod
    async def list_runs(self, query: RunQuery) -> list[Listed]:
        """A page of `query.owner`'s runs (see `RunQuery`), from the summaries kept beside
        the records (a record itself is read only for a summary an older gateway did not
        keep). Raises `InvalidPosition` for an `after` it cannot have written."""

    @abc.abstractmethod
    async def amend(self, record: RunRecord) -> bool:
        """Store a final record again, changed after it was final (its snapshot went); False
        if it is gone meanwhile (never stored again: expired or evicted stays deleted)."""

    @abc.abstractmethod
    async def expire(self, ttl: float) -> int:
        """Delete finished records older than `ttl` seconds; how many."""

    # --- replicas -----------------------------------------------------------------------

    def lease_link(self) -> LeaseLink | None:
        """A new link for the heartbeat (not yet connected); None for a store of one gateway,
        which has no leases."""
        return None

    @abc.abstractmethod
    async def recover(self, note: str) -> int:
        """At start: fail the runs this replica left unfinished when it last stopped (its
        kernels are gone), each with `note`; how many."""

    async def renew(self, run_ids: Collection[str]) -> Renewal:
        """Extend this replica's leases on `run_ids`; report cancel requests and lost runs.
        A store of one gateway has no leases."""
        return Renewal()

    async def fail_expired(self, note: str) -> int:
        """Fail every unfinished run whose lease ran out (its replica died), at most once
        whichever replicas ask; `note` may name the replica as `{replica}`. How many."""
        return 0

    async def instance_alive(self, instance: str) -> bool:
        """Whether a gateway of this instance id is live on this store now. A store of one
        gateway has no other: only its own id is."""
        return instance == self.replica

    async def request_cancel(self, run_id: str, note: str) -> bool:
        """Ask the replica that owns an unfinished run to cancel it (False: it is final or
        missing). A store of one gateway has no other replica to ask."""
        record = await self.get(run_id)
        return record is not None and record.status in UNFINISHED

    # --- the queue of runs any replica may take (`queues`) ---------------------------------

    async def enqueue(
        self, record: RunRecord, limit: int, request: str, cap: int, version: int = 1
    ) -> int | None:
        """As `admit`, and put the run in the store's queue with its `request` (of the form
        `version`; unleased: no replica runs it yet). Raises `QueueFull` when this replica
        already has `cap` runs waiting there."""
        raise NotImplementedError(f"the {self.kind} store keeps no queue of runs")

    async def claim(self, held: Mapping[str, int], share: int, version: int = 1) -> Claimed | None:
        """Take the oldest queued run that a free slot here may run: of a user holding fewer
        than `share` of this replica's slots (`held`: by user), the user holding fewest
        first, whose request's form is at most `version` (one this replica reads); at most
        once, whichever replicas claim at the same time. Its record is then this
        replica's, leased. None when no such run waits."""
        return None

    async def queued_from(self) -> int:
        """How many runs this replica queued that still wait in the store's queue."""
        return 0

    async def unqueue(self, run_id: str, note: str) -> RunRecord | None:
        """Cancel a run still waiting in the store's queue (`note` added to its record):
        its final record, or None when it is not there (never queued, or claimed)."""
        return None

    async def wait_final(self, run_id: str, timeout: float) -> RunRecord | None:
        """The run's record once it is final, or as it is after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            record = await self.get(run_id)
            if record is None or record.status not in UNFINISHED:
                return record
            if time.monotonic() >= deadline:
                return record
            await asyncio.sleep(0.1)
