"""`RunService`: admits runs and notebook replays (capacity, queue, per-user limits),
executes them as tasks, keeps their records in the store, cancels them, and drains on
shutdown. On a store that queues (PostgreSQL), a background run that finds no free slot
here waits in the store's queue for the first replica with one (`gateway.runs.claims`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping

from gateway.budget import ByteBudget, CpuBudget, Hold
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    RateLimited,
    SnapshotElsewhere,
    SnapshotGone,
    StoreUnavailable,
    UnsupportedLanguage,
)
from gateway.execution.events import RunEvents
from gateway.execution.executor import Execution
from gateway.execution.kernel import Wire
from gateway.execution.meter import cpu_of
from gateway.execution.pool import Pools
from gateway.execution.program import Program, from_notebook, from_run
from gateway.execution.session import KernelSession, StartCancelled, start_session
from gateway.metrics import Metrics
from gateway.models.common import RUN_ID_PATTERN, Language, new_run_id
from gateway.models.ipynb import store_notebook
from gateway.models.languages import traits
from gateway.models.record import RunRecord
from gateway.models.request import NotebookRequest, RunRequest
from gateway.runs.attach import archive_files, check_archive, given_upload, keep_given
from gateway.runs.bounds import bound_record
from gateway.runs.carried import READ_FACTOR, VERSION, carried, carry, unpack
from gateway.runs.claims import Claims
from gateway.runs.config import RunServiceConfig
from gateway.runs.lineage import Lineage, say_gone
from gateway.runs.quotas import FAILED_TICKS, STOP_GRACE, TICK, CpuMeter, Quotas
from gateway.runs.slots import RunSlots
from gateway.runs.snapshots import Snapshot, Snapshots
from gateway.sandbox.base import SandboxBackend, SandboxSpec
from gateway.store.base import UNFINISHED, Claimed, QueueFull, RecordStore, UsageRow
from gateway.uploads.service import UploadService

_RUN_ID = re.compile(RUN_ID_PATTERN)
UNBOUNDED = 1 << 62
log = logging.getLogger(__name__)

# How long a cancel asked of another replica waits for that replica's final record; past
# it the answer is the record as it is (still running), and the client polls.
CANCEL_WAIT = 30.0
# A final record that the store cannot take now (PostgreSQL restarting) is tried again
# every second this many times, so that a store restart loses no result.
STORE_RETRIES = 60


@dataclasses.dataclass
class ActiveRun:
    record: RunRecord
    task: asyncio.Task[RunRecord] | None = None
    execution: Execution | None = None
    error: GatewayError | None = None
    # Cancels the run whether it still waits for a slot or already runs; the task itself is
    # never cancelled, so its clean-up and final record always happen.
    cancel: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    stored: bool = False  # admitted by the store: its lease is this gateway's to renew
    source: Snapshot | None = None  # the snapshot it continues, held until it ends
    # what the run does as it happens: front ends subscribe right after `submit`, before
    # the run's task starts (no await between the two)
    events: RunEvents = dataclasses.field(default_factory=RunEvents)
    # the request's room in the bodies budget (its files and code are held until the run
    # ends, also after a background run's 202): released once the record is final
    held: Hold | None = None
    slotted: bool = False  # it holds a run slot from its admission (or claim) on


class RunService:
    def __init__(
        self,
        config: RunServiceConfig,
        backend: SandboxBackend,
        store: RecordStore,
        wire: Wire,
        metrics: Metrics,
        uploads: UploadService | None = None,
        budgets: Mapping[str, CpuBudget] | None = None,
    ) -> None:
        self.config = config
        self.uploads = uploads
        # what each user spends and may (the tokens file's budgets, else the default)
        self.quotas = Quotas(store, config.cpu_budget(), budgets, metrics.user_spent)
        self.backend = backend
        self.store = store
        self.wire = wire
        self.metrics = metrics
        self.active: dict[str, ActiveRun] = {}
        self.pools = Pools(config.execution, backend, wire, metrics, sizes=config.pool_sizes())
        self.lineage = Lineage(store)
        self.snapshots = Snapshots(
            config.snapshots(),
            self._continuation,
            store.replica,
            self._snapshot_went,
            self.quotas.charge,
        )
        self._slots = RunSlots(config.max_concurrent_runs, per_user=config.slots_per_user())
        self.claims = Claims(store, self._slots, self.adopt)
        # the bodies budget a claimed run's request takes room from: the front door's, set
        # by the gateway once it exists (until then, and in tests of the service alone, a
        # budget of its own that never refuses)
        self.bodies = ByteBudget("claimed requests", UNBOUNDED)
        self._draining = False
        self.leased: frozenset[str] = frozenset()  # run_ids, for the heartbeat's thread
        store.on_cancel = self.cancel_here
        metrics.gauge(
            "gateway_queue_length",
            "Runs waiting for a slot: here, and those this replica queued in the store.",
            lambda: self.queued,
        )
        metrics.gauge("gateway_runs_running", "Runs executing now.", lambda: self.running)
        metrics.gauge("gateway_kernels_pooled", "Ready kernels in the pools.", self._pooled)

    async def _continuation(self, snapshot: Snapshot) -> KernelSession:
        """A continuation of `snapshot` with the default limits, made ahead of the run that
        will take it (`Snapshots.prepare`)."""
        spec = SandboxSpec(
            run_id=f"ahead-{snapshot.id[-12:]}",
            language=snapshot.language,
            limits=self.config.execution.limits(),
        )
        return await start_session(
            self.backend, spec, self.config.execution, self.wire, None, snapshot.sandbox
        )

    def _snapshot_went(self, snapshot: Snapshot) -> None:
        """Its record says so: the run's own, if it still runs (the store has not got that
        record yet), else the stored one."""
        why = snapshot.gone or "gone"
        active = self.active.get(snapshot.run_id)
        if active is None:
            self.lineage.went(snapshot.run_id, snapshot.id, why)
            return
        # its final record is still to be stored, from this one (an amend meanwhile would
        # read the record as it was stored when the run began, and write that back)
        say_gone(active.record, snapshot.id, why)

    def _pooled(self) -> float:
        return float(self.pools.ready)

    def start(self) -> None:
        """Start filling the pools (the gateway calls this once it is up)."""
        self.pools.start()
        self.snapshots.start()
        self.claims.start()

    @property
    def settled(self) -> bool:
        """No run is active, no sandbox is being destroyed, no pool kernel is starting."""
        busy = self.pools.busy or self.snapshots.busy or self.lineage.busy
        return not self.active and not busy

    @property
    def queued(self) -> int:
        return len(self.active) - self.running + self.claims.waiting_here

    @property
    def running(self) -> int:
        return self._slots.running

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def _retry(self) -> float:
        return max(1.0, self.config.default_timeout / 4)

    def _admit(self) -> None:
        """This gateway's own capacity (the per-user limit is the store's, fleet-wide)."""
        if self._draining:
            raise RateLimited("The gateway is shutting down.", retry_after=self._retry)
        capacity = self.config.max_concurrent_runs + self.config.max_queued_runs
        if len(self.active) >= capacity:  # running + waiting for a slot
            raise RateLimited(
                "Every run slot is busy and the queue is full; try again shortly.",
                retry_after=self._retry,
            )

    async def submit(self, request: RunRequest, held: Hold | None = None) -> ActiveRun:
        """Admit a run and start it as a task; the returned record is `queued`. Every
        policy that needs more than the body is applied here, whatever front end asked: the
        archive it names must be the caller's and still kept (404 otherwise); the rest was
        applied when the body became a `RunRequest` (`gateway.runs.requests`). `held` is
        the request's room in the bodies budget, released once the run's record is final
        (or at once, if the run is not admitted)."""
        with _given_back_unless_admitted(held):
            await self.quotas.admit(request.user)
            await check_archive(self.uploads, request.archive, request.user)
            program = await self._given(from_run(request), request)
            record = RunRecord(
                id=new_run_id(),
                language=request.language,
                user=request.user,
                code=request.source,
                continued_from=request.continue_from,
            )
            return await self._continuing(record, program, request, held)

    def adopt(self, claimed: Claimed) -> None:
        """Run a run claimed from the store's queue (`gateway.runs.claims`): it holds the
        slot reserved for it, and its lease is this replica's from the claim on."""
        record = claimed.record
        if claimed.origin != self.store.replica:
            record.notes.append(
                f"Queued by gateway replica {claimed.origin}; run by gateway replica "
                f"{self.store.replica}, which had a free slot first."
            )
        active = ActiveRun(record=record, stored=True, slotted=True)
        self.active[record.id] = active
        self._publish_leases()
        active.task = asyncio.create_task(self._run(active, claimed.request))

    async def _given(self, program: Program, request: RunRequest | NotebookRequest) -> Program:
        """`files_from`: the upload that keeps that run's files, checked now (404, 410)."""
        if request.files_from is None:
            return program
        self._admit()  # before the store is read for it
        upload = await given_upload(self.store, self.uploads, request.files_from, request.user)
        return dataclasses.replace(program, given_upload=upload, given_from=request.files_from)

    async def _continuing(
        self,
        record: RunRecord,
        program: Program,
        request: RunRequest | NotebookRequest,
        held: Hold | None,
    ) -> ActiveRun:
        """Start a run or replay, with what `keep` and `from` ask of snapshots."""
        if not (request.keep or request.continue_from):
            return await self._start(record, program, held, request=request)
        if request.keep:
            self._check_snapshots(request.language, "keep")
        source = None
        if request.continue_from is not None:
            self._admit()  # before the store is read for it (a chain may be long)
            source, prelude = await self._continued(request)
            record.continued_by = "replay" if source is None else "fork"
            program = dataclasses.replace(program, prelude=prelude)
        try:
            return await self._start(record, program, held, source)
        except BaseException:
            if source is not None:
                self.snapshots.release(source)
            raise

    def _check_snapshots(self, language: Language, field: str) -> None:
        """400 snapshot_unsupported unless this backend keeps `language`'s kernels."""
        if language not in self.backend.snapshot_languages:
            which = ", ".join(sorted(self.backend.snapshot_languages)) or "none"
            raise InvalidRequest(
                f"The {self.backend.name} backend keeps and continues the state of these "
                f"languages' kernels only: {which}.",
                field=field,
                code="snapshot_unsupported",
            )

    async def _continued(
        self, request: RunRequest | NotebookRequest
    ) -> tuple[Snapshot | None, tuple[str, ...]]:
        """Where a run `from` a snapshot starts: the snapshot, held for it; or, with
        `rebuild` where it cannot be forked here, none and its chain's code to replay.
        Else the error that says why not: 404, 409 elsewhere (also from a backend that
        cannot fork: the replica that holds it can), 410 gone (`gateway.runs.lineage`);
        400 snapshot_unsupported for any other on a backend or language that keeps
        nothing."""
        snapshot_id, user = request.continue_from, request.user
        assert snapshot_id is not None
        supported = request.language in self.backend.snapshot_languages
        error: GatewayError | None = None
        try:
            if supported:
                snapshot = self.snapshots.take(snapshot_id, user)
                if snapshot.language != request.language:
                    self.snapshots.release(snapshot)
                    raise InvalidRequest(
                        f"The snapshot {snapshot_id} is of a {snapshot.language} kernel; this "
                        f"run is {request.language}.",
                        field="language",
                    )
                return snapshot, ()
            if not self.snapshots.knows(snapshot_id):  # else: another language's, here
                error = await self.lineage.missing(snapshot_id, user)
        except SnapshotGone as exc:
            error = exc
        except NotFound:
            error = await self.lineage.missing(snapshot_id, user)
        if request.rebuild and not isinstance(error, NotFound):
            return None, tuple(await self.lineage.chain(snapshot_id, user, request.language))
        if not supported and not isinstance(error, SnapshotElsewhere | SnapshotGone):
            self._check_snapshots(request.language, "from")
        assert error is not None
        raise error

    async def submit_notebook(
        self, request: NotebookRequest, held: Hold | None = None
    ) -> ActiveRun:
        """Admit a notebook replay and start it as a task; the returned record is `queued`."""
        with _given_back_unless_admitted(held):
            await self.quotas.admit(request.user)
            program = await self._given(from_notebook(request), request)
            record = RunRecord(
                id=new_run_id(),
                language=request.language,
                user=request.user,
                code=request.code,
                kind="notebook",
                name=request.name,
            )
            record.continued_from = request.continue_from
            store_notebook(record, request.notebook)
            return await self._continuing(record, program, request, held)

    async def _available(self, language: Language) -> None:
        """A language whose kernel may be missing (R) is refused where the backend's kernels
        do not have it (its environment, read once and kept); unknown: the start tells."""
        if not traits(language).optional:
            return
        found = await self.backend.environment()
        if found is not None and language not in (found.found.get("languages") or {}):
            raise UnsupportedLanguage(
                f"This gateway's kernels have no {language!r} (GET /v1/environment lists the "
                "languages they have; the kernel image's datascience profile has R).",
                field="language",
            )

    async def _start(
        self,
        record: RunRecord,
        program: Program,
        held: Hold | None,
        source: Snapshot | None = None,
        request: RunRequest | NotebookRequest | None = None,
    ) -> ActiveRun:
        admitted = False
        try:
            await self._available(record.language)
            self._admit()
            # a start counts against `runs_per_minute` once every check of this gateway's
            # passed; undone when the store refuses it
            counted = await self.quotas.count_start(record.user)
            slotted = self._slots.take(record.user)  # a free slot: it runs here
            queue = isinstance(request, RunRequest) and carried(request, program)
            if not slotted and self.claims.on and queue:
                assert isinstance(request, RunRequest)
                # its room in the bodies budget is given back (`finally`): the store has it
                return await self._queue(record, request, program, counted)
            active = ActiveRun(record=record, held=held, source=source, slotted=slotted)
            self.active[record.id] = active  # holds its place in this gateway's capacity
            try:
                mine = await self.store.admit(record, self.config.max_runs_per_user)
            except BaseException:
                del self.active[record.id]
                self._give_back(active)
                await self.quotas.uncount_start(record.user, counted)
                raise
            active.stored = mine is None
            self._publish_leases()
            if mine is not None:
                del self.active[record.id]
                self._give_back(active)
                await self.quotas.uncount_start(record.user, counted)
                raise self._over_limit(mine)
            active.task = asyncio.create_task(self._run(active, program))
            admitted = True
            return active
        finally:
            if not admitted and held is not None:
                held.release()

    async def _room_for_claimed(self, active: ActiveRun, nbytes: int) -> Hold | None:
        """Room in the bodies budget for a claimed request (its user's, as the admitting
        replica held it): what reading it back makes (`carried.READ_FACTOR`), waited for in
        turn like any body; None when the run is cancelled meanwhile."""
        taking = asyncio.ensure_future(self.bodies.take(READ_FACTOR * nbytes, active.record.user))
        cancelled = asyncio.ensure_future(active.cancel.wait())
        try:
            await asyncio.wait([taking, cancelled], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if taking.done():
            return taking.result()
        taking.cancel()  # (a grant racing the cancel is handed on: `ByteBudget.take`)
        with contextlib.suppress(asyncio.CancelledError):
            await taking
        return None

    def _give_back(self, active: ActiveRun) -> None:
        """The slot a run took at its admission, if the store then refused it."""
        if active.slotted:
            active.slotted = False
            self._slots.release(active.record.user)

    def _over_limit(self, mine: int) -> RateLimited:
        return RateLimited(
            f"You already have {mine} runs in progress; the limit is "
            f"{self.config.max_runs_per_user}.",
            retry_after=self._retry,
        )

    async def _queue(
        self, record: RunRecord, request: RunRequest, program: Program, counted: float | None
    ) -> ActiveRun:
        """Admit a background run into the store's queue, for the first replica with a free
        slot (this one too); nothing of it stays here. 429 when its user is at their limit
        or this replica has `max_queued_runs` waiting there already."""
        mine: int | None = None
        try:
            text = await carry(request, program)
            mine = await self.store.enqueue(
                record, self.config.max_runs_per_user, text, self.config.max_queued_runs, VERSION
            )
        except QueueFull:
            await self.quotas.uncount_start(record.user, counted)
            raise RateLimited(
                "Every run slot is busy and the queue is full; try again shortly.",
                retry_after=self._retry,
            ) from None
        except BaseException:
            await self.quotas.uncount_start(record.user, counted)
            raise
        if mine is not None:
            await self.quotas.uncount_start(record.user, counted)
            raise self._over_limit(mine)
        self.claims.queued()
        return ActiveRun(record=record)

    async def run(self, request: RunRequest, held: Hold | None = None) -> RunRecord:
        """Run and wait for the final record. Raises the GatewayError that stopped it before
        any code ran (no kernel could start, files could not be staged)."""
        return await self._wait(await self.submit(request, held))

    async def run_notebook(self, request: NotebookRequest, held: Hold | None = None) -> RunRecord:
        """Replay and wait for the final record (raises SandboxError if no kernel started)."""
        return await self._wait(await self.submit_notebook(request, held))

    async def _wait(self, active: ActiveRun) -> RunRecord:
        assert active.task is not None
        record = await asyncio.shield(active.task)
        if active.error is not None:
            raise active.error
        return record

    async def _run(self, active: ActiveRun, program: Program | str) -> RunRecord:
        """The run's task: a slot, then the execution; the record is final on every way out
        (the record's own methods move its status: `gateway.models.record`). A run claimed
        from the store's queue holds its slot already, and its program is still the
        request's text (`gateway.runs.carried`)."""
        record = active.record
        started = time.monotonic()
        meter = self.quotas.meter(record.user)
        try:
            if active.slotted and active.cancel.is_set():  # before its task began
                self._slots.release(record.user)
                record.cancel_unstarted("The run was cancelled before it started.")
                return record
            waited = not active.slotted or isinstance(program, str)  # for a slot, or claimed
            if not active.slotted and not await self._slots.acquire(record.user, active.cancel):
                record.cancel_unstarted("The run was cancelled before it started.")
                return record
            try:
                if waited and meter.watching:  # its user's budget may have gone meanwhile
                    try:
                        await self.quotas.admit(record.user)
                    except QuotaExceeded as exc:
                        record.stop_unstarted("cpu_quota", f"It did not start: {exc.message}")
                        return record
                if isinstance(program, str):  # claimed: its bytes in this replica's budget
                    text_bytes = len(program)
                    active.held = await self._room_for_claimed(active, text_bytes)
                    if active.held is None:
                        record.cancel_unstarted("The run was cancelled before it started.")
                        return record
                    program = await unpack(program)
                    active.held.shrink_to(text_bytes)  # what the program keeps, at most
                record.start()
                record.notes.extend(program.notes)
                await self.store.update(record)  # it holds a slot: so other replicas see it
                files, notes = await archive_files(self.uploads, program)
                await keep_given(self.uploads, record, program, files)
                if record.files_given is not None:  # so `files_from` finds it, anywhere
                    await self.store.update(record)
                execution = Execution(
                    program, record, self.config.execution, active.cancel, active.events
                )
                execution.result.notes.extend(notes)
                active.execution = execution
                source = active.source
                ready = None if source is None else self.snapshots.take_ready(source)
                # the kernels are this block's (a replay that keeps its cells' states has
                # one per cell): each destroyed as it ends, off the answer's path
                try:
                    async with contextlib.AsyncExitStack() as kernels:
                        session = await kernels.enter_async_context(
                            self.pools.kernel(
                                execution.spec,
                                active.cancel,
                                None if source is None else source.sandbox,
                                ready,
                            )
                        )
                        if program.keep_cells:
                            execution.advance = functools.partial(self._advance, active, kernels)
                        async with self._metered(execution, meter):
                            await execution.run(session, files)
                        if program.keep:
                            await self._keep_state(execution.session or session, active, meter)
                except StartCancelled:
                    execution.cancelled_before_start()
            finally:
                self._slots.release(record.user)
        except GatewayError as exc:  # no kernel could start, or the staging was refused
            active.error = exc
            _fail(record, exc.message)
            if exc.status >= 500:
                log.warning("run %s: %s", record.id, exc.message)
        except Exception:
            log.exception("run %s failed inside the gateway", record.id)
            _fail(record, "The gateway failed while running this; the error was logged.")
        finally:
            try:
                bound_record(record, self.config.max_record_bytes)
            except Exception:
                log.exception("run %s: its record could not be bounded", record.id)
            if active.source is not None:
                if active.source.id == record.continued_from:  # not a cell's, kept here
                    self.snapshots.prepare(active.source)  # for the next run from it
                self.snapshots.release(active.source)
            self.metrics.run_finished(record.status, record.language, time.monotonic() - started)
            # it ran: what it spent goes to the ledger, with the final record
            usage = None
            if record.started_at is not None:
                usage = meter.close(record.usage.cpu_ms, record.usage.peak_memory_bytes)
            # still held (its lease renewed) until the store has the final record, however
            # long the store takes to come back
            try:
                if await self._keep(record, usage) and usage is not None:
                    meter.counted()
            finally:
                self.active.pop(record.id, None)
                self._publish_leases()
                if active.held is not None:
                    active.held.release()
        return record

    @contextlib.asynccontextmanager
    async def _metered(self, execution: Execution, meter: CpuMeter) -> AsyncIterator[None]:
        """While the block runs: a run whose user has a CPU budget reports what it spends
        every `TICK`, and is stopped (`cpu_quota`) once a window of its user's is spent."""
        if not meter.watching:
            yield
            return

        async def watch() -> None:
            failed = 0
            while failed < FAILED_TICKS:
                await asyncio.sleep(TICK)
                try:
                    spent = await execution.cpu_spent()
                    spent_window = None if spent is None else await meter.tick(spent)
                    failed = 0
                except Exception as exc:  # the store, say: tried again next tick
                    failed += 1
                    log.warning(
                        "run %s: its CPU could not be counted: %s", execution.record.id, exc
                    )
                    continue
                if spent_window is not None:
                    break
            # spent, or not counted for FAILED_TICKS in a row (a budget held closed)
            execution.stop("cpu_quota")
            await asyncio.sleep(STOP_GRACE)
            await execution.kill()  # still going: what took no cancel ends with its sandbox

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _keep_state(self, session: KernelSession, active: ActiveRun, meter: CpuMeter) -> None:
        """Keep the kernel's final state as a snapshot (`keep`), if the run ended with its
        kernel alive; a note says why not otherwise. Keeping runs the kernel's code (which
        the user's may have replaced): it is metered as the run was."""
        record, execution = active.record, active.execution
        if record.status not in ("succeeded", "failed"):
            record.notes.append(f"The kernel's state was not kept: the run {record.status}.")
            return
        cell = execution.last_cell if execution and execution.program.keep_cells else None
        before = await cpu_of(session.sandbox)
        keeping = asyncio.ensure_future(
            self.snapshots.keep(session, record.user, active.source, record.id, cell)
        )
        spent = before is not None and await _heed_budget(keeping, session, meter, record, before)
        snapshot, note = await keeping
        if spent:
            note = "The kernel's state was not kept: your CPU budget ran out while it was kept."
        # from its reading on, what the sandbox spends is the snapshot's (`Snapshots.watch`)
        after = snapshot.idle.seen if snapshot is not None else await cpu_of(session.sandbox)
        if before is not None and after is not None and record.usage.cpu_ms is not None:
            record.usage.cpu_ms += max(0, after - before)  # keeping runs the kernel's hooks too
        if note is not None:
            record.notes.append(note)
        if snapshot is not None and snapshot.gone is None:
            record.snapshot = self.snapshots.info(snapshot)
            if cell is not None:
                record.snapshots.append(record.snapshot)
            self.snapshots.prepare(snapshot)  # a continuation made ahead, for the next run

    async def _advance(
        self,
        active: ActiveRun,
        kernels: contextlib.AsyncExitStack,
        session: KernelSession,
        index: int,
    ) -> KernelSession:
        """`keep: "cells"`: keep the state after cell `index` and answer a continuation of
        it for the next cell (owned by `kernels`); the run holds it until the next is kept
        from its continuation (which then holds it) or the run ends. Nothing kept (a note
        says why): the same session, and no later cell is kept either."""
        record, execution = active.record, active.execution
        assert execution is not None
        snapshot, note = await self.snapshots.keep(
            session, record.user, active.source, record.id, index, hold=True
        )
        if note is not None:
            record.notes.append(note)
        if snapshot is None:
            execution.advance = None
            return session
        if snapshot.gone is None:
            record.snapshots.append(self.snapshots.info(snapshot))
        previous, active.source = active.source, snapshot
        if previous is not None:
            self.snapshots.release(previous)
        return await kernels.enter_async_context(
            self.pools.kernel(execution.spec, active.cancel, snapshot.sandbox)
        )

    async def _keep(self, record: RunRecord, usage: UsageRow | None = None) -> bool:
        """Store a final record within its owner's quota (their oldest records make room),
        and what the run spent (`usage`) in the ledger; whether the store took them."""
        quota = self.config.records_quota()
        for attempt in range(STORE_RETRIES + 1):
            try:
                finished = await asyncio.shield(self.store.finish(record, quota, usage))
                break
            except StoreUnavailable:  # restarting, or briefly unreachable: try again
                if attempt == 0:
                    log.warning("run %s: the store cannot take its record yet", record.id)
                if attempt == STORE_RETRIES:
                    log.error("run %s: the store stayed unreachable; record lost", record.id)
                    return False
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("run %s: its record could not be stored", record.id)
                return False
        if not finished.kept:
            log.warning(
                "run %s: another replica failed it meanwhile; that record stands", record.id
            )
        if finished.evicted:
            log.info(
                "user %r: %d oldest run record(s) deleted (quota)", record.user, finished.evicted
            )
        return True

    async def get(self, run_id: str, user: str, admin: bool) -> RunRecord:
        if not _RUN_ID.fullmatch(run_id):  # never a lookup: no store is asked about a NUL
            raise NotFound(f"There is no run {run_id[:100]!r}.")
        active = self.active.get(run_id)
        record = active.record if active is not None else await self.store.get(run_id)
        if record is None or (record.user != user and not admin):
            raise NotFound(f"There is no run {run_id!r}.")
        if active is None:
            self.lineage.annotate(record, self.snapshots.knows)
        return record

    async def cancel(self, run_id: str, user: str, admin: bool) -> RunRecord:
        record = await self.get(run_id, user, admin)
        active = self.active.get(run_id)
        if active is None or active.task is None:
            if record.status not in UNFINISHED:
                return record  # already final: cancelling is a no-op
            note = f"Cancelled through gateway replica {self.store.replica}."
            unqueued = await self.store.unqueue(run_id, note)  # still in the store's queue
            if unqueued is not None:
                self.metrics.run_finished(unqueued.status, unqueued.language, 0.0)
                self.claims.wake()  # the queue gauge counts it no more
                return unqueued
            # Another replica runs it: ask that one, and wait (bounded) for its answer.
            if not await self.store.request_cancel(run_id, note):
                return await self.get(run_id, user, admin)
            final = await self.store.wait_final(run_id, CANCEL_WAIT)
            return final if final is not None else record
        active.cancel.set()
        await asyncio.shield(active.task)
        return active.record

    def cancel_here(self, run_id: str, note: str) -> None:
        """Cancel a run of this gateway that another replica was asked to cancel (the
        store heard it); the note says so in its record."""
        active = self.active.get(run_id)
        if active is None or active.cancel.is_set():
            return
        active.record.notes.append(note)
        active.cancel.set()

    def _publish_leases(self) -> None:
        """Swap in a new snapshot of `run_ids`: the heartbeat reads it from a thread of its
        own (gateway/runs/leases.py), where only an immutable value is safe to read."""
        self.leased = frozenset(self.run_ids)

    @property
    def run_ids(self) -> list[str]:
        """The runs this gateway holds now (queued or running): its leases. Not those
        whose admission is still on its way to the store: a heartbeat would find no lease
        and take them for lost."""
        return [run_id for run_id, active in self.active.items() if active.stored]

    async def drain(self) -> None:
        """Refuse new runs, let running ones finish (bounded), cancel what is left, then
        destroy the pools' kernels and wait for every sandbox still being destroyed."""
        self._draining = True
        await self.claims.stop()  # what is still queued in the store waits for another replica
        tasks = [a.task for a in self.active.values() if a.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.drain_timeout)
            for active in list(self.active.values()):
                active.cancel.set()
            if pending:
                await asyncio.wait(pending, timeout=30)
        await self.snapshots.close()
        await self.lineage.settle()  # their records say that they went
        await self.pools.close()  # and every sandbox still being destroyed


def _fail(record: RunRecord, note: str) -> None:
    """Fail a run the gateway could not run; one already final keeps its status (an error
    after its results were written) and gets the note only."""
    if record.final:
        record.notes.append(note)
    else:
        record.fail(note)


@contextlib.contextmanager
def _given_back_unless_admitted(held: Hold | None) -> Iterator[None]:
    """A request not admitted (any error of the block) gives its room in the bodies budget
    back at once (`release` is idempotent: an admitted run's is given back at its end)."""
    try:
        yield
    except BaseException:
        if held is not None:
            held.release()
        raise


async def _heed_budget(
    keeping: asyncio.Future[tuple[Snapshot | None, str | None]],
    session: KernelSession,
    meter: CpuMeter,
    record: RunRecord,
    before: int,
) -> bool:
    """While the kernel is being kept, its user's budget is heeded as during the run
    (`RunService._metered`): spent, the kernel is killed (the keep then fails). Whether it
    was."""
    while meter.watching and not keeping.done():
        await asyncio.wait([keeping], timeout=TICK)
        now = await cpu_of(session.sandbox)
        if keeping.done() or now is None or record.usage.cpu_ms is None:
            continue
        try:
            window = await meter.tick(record.usage.cpu_ms + max(0, now - before))
        except Exception as exc:  # the store: tried again next tick
            log.warning("run %s: its CPU could not be counted: %s", record.id, exc)
            continue
        if window is not None:
            await session.sandbox.kill()
            return True
    return False
