"""Snapshots: a run's final kernel state, kept for later runs to start from (issue 32,
DESIGN decision 24).

A run with `keep` ends with its kernel told to become a snapshot (`KEEP`): the kernel
process stops serving and waits, idle, in its own sandbox, which this registry then owns
instead of the run. A run `from` a snapshot gets a fresh sandbox of its own, into which
the snapshot forks a copy-on-write continuation (`SandboxBackend.branch`). The snapshot
itself never runs again.

A snapshot is its owner's alone: another user's id is 404, as an unknown one. One that
went (its idle TTL passed, its owner's limits evicted it, it was deleted) is 410
`snapshot_gone` for as long as this gateway remembers it (`GONE_REMEMBERED`).

A continuation's processes live in a PID namespace inside its snapshot's (a namespace
can be joined only from above), so a snapshot cannot end before the runs continuing from
it, nor before the snapshots kept from those: each of them holds it (`holders`). Deleted
or evicted meanwhile, it is gone for every caller at once and ends when the last holder
lets go.

A kept snapshot and a continuation made ahead are idle: what their sandboxes spend is read
every `IDLE_CHECK` and charged to their owner (`charge`: the usage ledger, DESIGN decision
26). It also fills a bucket that leaks `IDLE_LEAK_MS` a check (an idle kernel's wakeups);
one whose bucket passes `IDLE_CPU_MS` goes (or, made ahead, is closed): its kernel did not
stop when asked (the user's code replaced what stops it), and would spin, unheld and on a
loaded machine however slowly, until its TTL. A snapshot's own sandbox spends CPU on the
forks of its continuations: what it spends within two checks of one is only charged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from gateway.errors import GatewayError, NotFound, SnapshotGone
from gateway.execution.kernel_code import keep_code
from gateway.execution.meter import cpu_of
from gateway.execution.session import KernelSession
from gateway.models.common import Language
from gateway.models.record import SnapshotInfo
from gateway.runs.config import SnapshotsConfig
from gateway.runs.lineage import snapshot_name
from gateway.sandbox.base import Sandbox

log = logging.getLogger(__name__)

# Run silently in the kernel after its run (no name is bound in the user's namespace): it is
# marked to be kept, then its loop is stopped by a request whose reply is not awaited (a
# reply of the request that stops the loop may stay queued: kernels/snapshot.py). Each
# kernel's own two requests: `gateway.execution.kernel_code.keep_code`
KEEP_TIMEOUT = 10.0
GONE_REMEMBERED = 10_000  # ids of snapshots that went, for 410 rather than 404
SWEEP_EVERY = 10.0
IDLE_CHECK = 1.0  # seconds between readings of what kept snapshots spend
IDLE_CPU_MS = 500  # CPU an idle one may spend beyond the leak (spinning: 1000 a check a CPU)
IDLE_LEAK_MS = 50  # what an idle one may spend each check, for ever
# Each continuation is a user and a PID namespace inside its snapshot's; the kernel nests
# them 32 deep at most
MAX_DEPTH = 30


@dataclasses.dataclass
class IdleCpu:
    """What a sandbox no run holds has spent: its last reading charged, and the leaky
    bucket of what it spent idle beyond `IDLE_LEAK_MS` a check."""

    seen: int | None = None
    bucket: int = 0

    def fill(self, spent_ms: int) -> bool:
        """Add a check's CPU; whether the bucket is past `IDLE_CPU_MS` (it spins)."""
        self.bucket = max(0, self.bucket + spent_ms - IDLE_LEAK_MS)
        return self.bucket > IDLE_CPU_MS


@dataclasses.dataclass(eq=False)
class Snapshot:
    id: str
    user: str
    run_id: str  # the run whose kernel it is: its record names it (`gateway.runs.lineage`)
    language: Language
    sandbox: Sandbox
    bytes: int
    parent: Snapshot | None
    depth: int = 0  # how many continuations deep (a run's own kernel: 0)
    used: float = dataclasses.field(default_factory=time.monotonic)  # last kept or started from
    holders: int = 0  # runs continuing from it now, snapshots kept from those, `ready`
    gone: str | None = None  # why it went: it then ends when its last holder lets go
    # a continuation made ahead, for the next run from it (`prepare`), and its making
    ready: KernelSession | None = None
    readying: asyncio.Task[None] | None = None
    cell: int | None = None  # a replay's (`keep: "cells"`): the cell after which it was kept
    # what its sandbox, and its continuation made ahead, spent idle (`Snapshots.watch`)
    idle: IdleCpu = dataclasses.field(default_factory=IdleCpu)
    ready_idle: IdleCpu = dataclasses.field(default_factory=IdleCpu)
    # when it last forked (a continuation asked of it; kept: its freeze), which its sandbox
    # spends CPU on
    forked: float = dataclasses.field(default_factory=time.monotonic)


class Snapshots:
    def __init__(
        self,
        config: SnapshotsConfig,
        continuation: Callable[[Snapshot], Awaitable[KernelSession]] | None = None,
        instance: str = "",
        on_gone: Callable[[Snapshot], None] | None = None,
        charge: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.instance = instance  # this gateway's, in each snapshot's info
        # told of each snapshot that went, once (its record then says so: `lineage`)
        self._on_gone = on_gone
        # starts a continuation of a snapshot (the run service's): made ahead, one per
        # snapshot, so that the next run from it needs no start (a pool of one)
        self._continuation = continuation
        # (user, CPU milliseconds): what a snapshot or a continuation made ahead spent idle
        self._charge = charge
        self._kept: dict[str, Snapshot] = {}
        self._gone: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self._ending: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever())
        self._watcher = asyncio.create_task(self._watch_forever())

    # --- keeping ----------------------------------------------------------------------------

    async def keep(
        self,
        session: KernelSession,
        user: str,
        parent: Snapshot | None,
        run_id: str,
        cell: int | None = None,
        hold: bool = False,
    ) -> tuple[Snapshot | None, str | None]:
        """Keep `session`'s kernel, run `run_id`'s, as a snapshot of `user`'s (the session
        gives its sandbox up to it), and a note if anything went for it; or None and a note
        saying why it was not kept. With `hold`, the caller holds it (`release` after),
        so it lives on for the caller even if it went at once (over the limits)."""
        if session.dead:
            return None, "The kernel's state was not kept: the kernel had ended."
        depth = 0 if parent is None else parent.depth + 1
        if depth > MAX_DEPTH:
            return None, (
                f"The kernel's state was not kept: a chain of snapshots is at most {MAX_DEPTH} "
                "continuations deep."
            )
        requests = keep_code(session.traits.kernel)
        if requests is None:
            return None, "The kernel's state was not kept: this kernel's cannot be."
        keep, stop = requests
        try:
            reply = await session.client.run_silent(keep, KEEP_TIMEOUT)
        except TimeoutError:
            return None, "The kernel's state was not kept: the kernel did not answer in time."
        except GatewayError as exc:
            return None, f"The kernel's state was not kept: {exc.message}"
        if reply.get("status") != "ok":
            return None, "The kernel's state was not kept: the kernel refused."
        session.client.execute(stop, silent=True)
        sandbox = session.give_away()
        seen = await cpu_of(sandbox)  # the run's until now, the snapshot's after
        snapshot = Snapshot(
            id=snapshot_name(run_id),
            user=user,
            run_id=run_id,
            language=session.language,
            cell=cell,
            sandbox=sandbox,
            bytes=await sandbox.memory_bytes(),
            parent=parent,
            depth=depth,
            holders=int(hold),
            idle=IdleCpu(seen),
        )
        if parent is not None:
            parent.holders += 1
        self._kept[snapshot.id] = snapshot
        return snapshot, self._within_limits(user, snapshot)

    def _within_limits(self, user: str, newest: Snapshot) -> str | None:
        """Refuse `newest` if every user's snapshots together are over the gateway's bytes;
        else evict `user`'s least recently used ones until their count and bytes are within
        the operator's limits (never another user's); a note if any went."""
        # a snapshot that went but is still held (a continuation lives inside it) still holds
        # its memory: it counts until it ends
        total = sum(s.bytes for s in self._kept.values())
        if total > self.config.bytes_total:  # the machine's share: nobody's goes for it
            self._go(newest, "not kept: the gateway's memory for snapshots was full")
            return (
                "The kernel's state was not kept: this gateway's memory for snapshots "
                f"(every user's together, {self.config.bytes_total} bytes) is full."
            )
        evicted = 0
        while True:
            own = sorted(self.owned(user), key=lambda s: s.used)
            count = len(own)
            total = sum(s.bytes for s in self._kept.values() if s.user == user)
            over_count = count > self.config.per_user
            if not over_count and total <= self.config.bytes_per_user:
                break
            # the oldest first, the one just kept last; for bytes only one that nothing
            # holds (a held one keeps its memory until its holders end)
            victim = next(
                (s for s in own if s is not newest and (over_count or s.holders == 0)), newest
            )
            self._go(victim, "evicted: its owner's snapshot limits were reached")
            evicted += 1
            if victim is newest:
                return (
                    "The kernel's state was not kept: with your snapshots still in use, it "
                    "is over this gateway's snapshot limits."
                )
        if evicted:
            return f"{evicted} older snapshot(s) of yours went to keep this one (limits)."
        return None

    # --- using --------------------------------------------------------------------------

    def take(self, snapshot_id: str, user: str) -> Snapshot:
        """Hold `user`'s snapshot for a run that starts from it (`release` after)."""
        self.sweep()
        snapshot = self._kept.get(snapshot_id)
        if snapshot is not None and snapshot.user == user and snapshot.gone is None:
            snapshot.holders += 1
            snapshot.used = snapshot.forked = time.monotonic()
            return snapshot
        went = self._gone.get(snapshot_id)
        if went is not None and went[0] == user:
            raise SnapshotGone(f"The snapshot {snapshot_id} is gone: {went[1]}.", field="from")
        raise NotFound(f"There is no snapshot {snapshot_id}.", field="from")

    # --- a continuation made ahead ------------------------------------------------------------

    def prepare(self, snapshot: Snapshot) -> None:
        """Start a continuation of `snapshot` in the background for the next run from it,
        unless one is ready or on its way (it holds the snapshot until taken or closed)."""
        if self._continuation is None or snapshot.gone is not None:
            return
        if snapshot.ready is not None or snapshot.readying is not None:
            return
        snapshot.holders += 1
        snapshot.forked = time.monotonic()
        snapshot.readying = asyncio.create_task(self._prepare(snapshot, self._continuation))

    async def _prepare(
        self, snapshot: Snapshot, continuation: Callable[[Snapshot], Awaitable[KernelSession]]
    ) -> None:
        session: KernelSession | None = None
        try:
            session = await continuation(snapshot)
        except Exception as exc:  # a run from it starts one itself, and says what failed
            log.warning("a continuation of snapshot %s did not start: %s", snapshot.id, exc)
        finally:
            snapshot.readying = None
        if session is not None and snapshot.gone is None:
            snapshot.ready = session  # with its hold
            # its start is its owner's too; what it spends from now on is idle
            snapshot.ready_idle = IdleCpu(0)
            await self._charge_idle(snapshot.user, session.sandbox, snapshot.ready_idle)
            return
        if session is not None:
            await session.close()
        self.release(snapshot)

    def take_ready(self, snapshot: Snapshot) -> KernelSession | None:
        """The continuation made ahead for `snapshot`, if one is ready (the caller holds the
        snapshot already: `take`)."""
        session, snapshot.ready = snapshot.ready, None
        if session is None:
            return None
        self.release(snapshot)
        if session.sandbox.has_exited():
            self._close(snapshot, session)
            return None
        return session

    def _close(self, snapshot: Snapshot, session: KernelSession) -> None:
        """Close `snapshot`'s continuation made ahead, which it no longer holds, once what
        it spent since the last reading is charged."""

        async def close() -> None:
            try:
                await self._charge_idle(snapshot.user, session.sandbox, snapshot.ready_idle)
            finally:
                await session.close()

        task = asyncio.create_task(close())
        self._ending.add(task)
        task.add_done_callback(self._ended)

    def release(self, snapshot: Snapshot) -> None:
        snapshot.holders -= 1
        snapshot.used = time.monotonic()
        if snapshot.gone is not None and snapshot.holders == 0:
            self._end(snapshot)

    def knows(self, snapshot_id: str) -> bool:
        """Whether this gateway kept it (it may have gone since)."""
        return snapshot_id in self._kept or snapshot_id in self._gone

    def get(self, snapshot_id: str) -> Snapshot:
        return self._kept[snapshot_id]

    def owned(self, user: str) -> list[Snapshot]:
        self.sweep()
        return [s for s in self._kept.values() if s.user == user and s.gone is None]

    def info(self, snapshot: Snapshot) -> SnapshotInfo:
        left = snapshot.used + self.config.ttl - time.monotonic()
        expires = datetime.now(UTC) + timedelta(seconds=max(0.0, left))
        return SnapshotInfo(
            id=snapshot.id,
            expires_at=expires.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            bytes=snapshot.bytes,
            instance=self.instance,
            cell=snapshot.cell,
        )

    def delete(self, snapshot_id: str, user: str) -> None:
        snapshot = self._kept.get(snapshot_id)
        if snapshot is None or snapshot.user != user or snapshot.gone is not None:
            self.take(snapshot_id, user)  # raises: 410 for one that went, else 404
        assert snapshot is not None
        self._go(snapshot, "deleted")

    # --- going ----------------------------------------------------------------------------

    def _go(self, snapshot: Snapshot, why: str) -> None:
        """Gone for every caller from now; ended once nothing holds it."""
        snapshot.gone = why
        if self._on_gone is not None:
            self._on_gone(snapshot)
        ready, snapshot.ready = snapshot.ready, None
        if ready is not None:  # its continuation made ahead goes first
            self._close(snapshot, ready)
            snapshot.holders -= 1
        self._gone[snapshot.id] = (snapshot.user, why)
        while len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)
        if snapshot.holders == 0:
            self._end(snapshot)

    def _end(self, snapshot: Snapshot) -> None:
        if self._kept.pop(snapshot.id, None) is None:
            return
        task = asyncio.create_task(self._destroy(snapshot))
        self._ending.add(task)
        task.add_done_callback(self._ended)
        if snapshot.parent is not None:
            self.release(snapshot.parent)

    async def _destroy(self, snapshot: Snapshot) -> None:
        try:
            await self._charge_idle(snapshot.user, snapshot.sandbox, snapshot.idle)
        finally:
            await snapshot.sandbox.destroy()

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._ending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a snapshot's sandbox could not be destroyed", exc_info=task.exception())

    def sweep(self) -> None:
        """Every snapshot idle past its TTL goes."""
        now = time.monotonic()
        for snapshot in list(self._kept.values()):
            # held by nothing but its continuation made ahead
            held = snapshot.holders - (snapshot.ready is not None)
            idle = snapshot.gone is None and held == 0 and snapshot.readying is None
            if idle and now - snapshot.used > self.config.ttl:
                self._go(snapshot, "expired: no run started from it within its TTL")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            self.sweep()

    # --- what the idle spend ----------------------------------------------------------------

    async def _watch_forever(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK)
            try:
                await self.watch()
            except Exception:
                log.exception("what snapshots spent could not be read")

    async def watch(self) -> None:
        """Charge what every snapshot and continuation made ahead spent since the last
        reading; one that spent more than `IDLE_CPU_MS` idle goes (see the module's doc)."""
        now = time.monotonic()
        for snapshot in list(self._kept.values()):
            if self._kept.get(snapshot.id) is not snapshot:
                continue  # ended meanwhile: its last reading was charged then
            spent = await self._charge_idle(snapshot.user, snapshot.sandbox, snapshot.idle)
            forking = now - snapshot.forked < 2 * IDLE_CHECK  # its spend is a continuation's
            if not forking and snapshot.idle.fill(spent) and snapshot.gone is None:
                log.warning("snapshot %s spent CPU idle: it goes", snapshot.id)
                self._go(snapshot, "ended: its kernel kept running after it was kept")
                continue
            ready = snapshot.ready
            if ready is None:
                continue
            spent = await self._charge_idle(snapshot.user, ready.sandbox, snapshot.ready_idle)
            if not snapshot.ready_idle.fill(spent):
                continue
            if snapshot.ready is ready:  # not taken meanwhile: closed, the next run starts one
                log.warning("snapshot %s's continuation spent CPU idle", snapshot.id)
                snapshot.ready = None
                self._close(snapshot, ready)
                self.release(snapshot)

    async def _charge_idle(self, user: str, sandbox: Sandbox, idle: IdleCpu) -> int:
        """Charge `user` what `sandbox` (a snapshot's, or its continuation made ahead's)
        spent since `idle`'s last reading: that much (none where it cannot tell)."""
        reading = await cpu_of(sandbox)
        if idle.seen is None or reading is None or reading <= idle.seen:
            return 0
        spent, idle.seen = reading - idle.seen, reading
        if self._charge is not None:
            try:
                await self._charge(user, spent)
            except Exception as exc:  # the store: a snapshot is not ended for it
                log.warning(
                    "%d ms of %s's snapshots' CPU could not be counted: %s", spent, user, exc
                )
        return spent

    @property
    def busy(self) -> bool:
        """A snapshot's sandbox is being destroyed, or a continuation made ahead."""
        return bool(self._ending) or any(s.readying for s in self._kept.values())

    async def close(self) -> None:
        """Every snapshot ends (a gateway's snapshots do not outlive it)."""
        for task in (self._sweeper, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.clear("its gateway stopped")

    async def clear(self, why: str) -> None:
        """Every snapshot goes now, held or not, and has ended when this returns."""
        making = [s.readying for s in self._kept.values() if s.readying is not None]
        if making:
            await asyncio.gather(*making, return_exceptions=True)
        for snapshot in list(self._kept.values()):
            ready, snapshot.ready = snapshot.ready, None
            if ready is not None:
                self._close(snapshot, ready)
        for snapshot in list(self._kept.values()):
            if snapshot.gone is None:
                self._gone[snapshot.id] = (snapshot.user, why)
                snapshot.gone = why
                if self._on_gone is not None:
                    self._on_gone(snapshot)
            snapshot.parent = None
            snapshot.holders = 0
            self._end(snapshot)
        if self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)
