"""Warm pools of never-used kernels (DESIGN.md decision 1), and the one owner of a run's
kernel (`Pools.kernel`: acquired, used and destroyed in one `async with`).

A `KernelPool` keeps `size` kernels of one kind started ahead: each in its own fresh
sandbox with the default limits, no network and no workspace, ready (kernel_info
answered, startup code loaded, `preload` modules imported for Python), never sent user
code. A run takes one (a hit) and owns it from then on: the run's environment, `vars`,
files and a lower memory limit are applied when it takes it, never earlier; the kernel is
destroyed after that one run. Runs a pool cannot serve (a workspace, `network: true`, a
kind without a pool, an empty pool) start a kernel of their own (a miss: the cold path).

Refills run in the background, one kernel at a time for all pools together, so refilling
never starves running kernels of CPU; no refill starts while the machine's available
memory is under `pool_min_free_bytes`, and idle kernels are destroyed until it is above
again (runs then start cold: slower, never failed; DESIGN.md decision 14 says why tenants
may cause that, and the start warns where the settings let them). A pooled kernel that
dies while idle is replaced; what it publishes while it waits is read and dropped (our
kernels wait for a slow reader rather than drop output, so unread it would stop
answering). `close()` destroys them all, and waits for every sandbox still being
destroyed (a run's included); after a crash they are reaped like any sandbox of this
instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

from gateway.errors import GatewayError
from gateway.execution.config import ExecutionConfig
from gateway.execution.kernel import Wire
from gateway.execution.session import KernelSession, start_session
from gateway.metrics import Metrics
from gateway.models.common import Language
from gateway.models.languages import TRAITS, Kernel, traits
from gateway.sandbox.base import Sandbox, SandboxBackend, SandboxSpec

log = logging.getLogger(__name__)

RETRY_DELAY = 2.0  # after a kernel of the pool failed to start
WATCH_INTERVAL = 2.0  # how often the pools look at the machine's memory


# the language a pooled kernel of each kind is started as (its kernel serves them all)
STARTED_AS: dict[Kernel, Language] = {
    "ipykernel": "python",
    "bash": "bash",
    "deno": "javascript",
    "irkernel": "r",
}
# A pool of this size holds one kernel when the backend's kernels have its language (R: only
# the kernel image's datascience profile has it), else none: decided once, when it starts.
WHEN_PRESENT = -1
GIVE_UP_AFTER = 3  # a pool whose kernels fail to start this many times in a row is turned off


async def _kill_and_close(session: KernelSession) -> None:
    if session.released:  # its sandbox has a new owner (a snapshot)
        return
    try:
        await session.sandbox.kill()
    finally:
        await session.close()


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    return _meminfo("MemAvailable")


def total_memory() -> int | None:
    """MemTotal from /proc/meminfo, in bytes (None where there is none)."""
    return _meminfo("MemTotal")


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def overcommitted(config: ExecutionConfig, total: int | None) -> str | None:
    """Why runs within their own memory limits could push the machine's available memory
    under `pool_min_free_bytes` (and so empty the pools for everyone), or None when they
    cannot: every run slot's limit plus that reserve fit in the machine's memory."""
    runs = config.max_concurrent_runs * config.memory_bytes
    if total is None or runs + config.pool_min_free_bytes <= total:
        return None
    gib = 1 << 30
    return (
        f"max_concurrent_runs x memory_bytes ({runs / gib:.1f} GiB) plus pool_min_free_bytes "
        f"({config.pool_min_free_bytes / gib:.1f} GiB) exceed this machine's memory "
        f"({total / gib:.1f} GiB): runs that use their memory limits can leave less than "
        "pool_min_free_bytes available, and then the pools are emptied for everyone (runs "
        "start cold: slower, not failed). Lower max_concurrent_runs, memory_bytes or "
        "pool_min_free_bytes to keep them warm."
    )


class KernelPool:
    """Never-used kernels of one kind."""

    def __init__(self, kind: Kernel, size: int, pools: Pools) -> None:
        self.kind = kind
        self.size = size
        self.pools = pools
        self.ready: list[KernelSession] = []
        self.starting = 0
        self.hits = 0
        self.misses = 0
        self.failures = 0  # kernels that failed to start, in a row

    @property
    def wanted(self) -> int:
        return self.size - len(self.ready) - self.starting

    def take(self) -> KernelSession | None:
        """A ready kernel, now the caller's; None when the pool is empty."""
        while self.ready:
            session = self.ready.pop(0)
            self.pools.wake_later()
            if not session.sandbox.has_exited():
                self.hits += 1
                self.pools.metrics.pool_hits.labels(kind=self.kind).inc()
                return session
            self.pools.discard(session)
        self.misses += 1
        self.pools.metrics.pool_misses.labels(kind=self.kind).inc()
        return None

    async def fill_one(self) -> None:
        """Start one kernel for this pool (called by the refiller)."""
        config = self.pools.config
        spec = SandboxSpec(
            run_id=f"pool-{self.kind}-{secrets.token_hex(6)}",
            language=STARTED_AS[self.kind],
            limits=config.limits(),
        )
        self.starting += 1
        try:
            session = await start_session(self.pools.backend, spec, config, self.pools.wire)
            try:
                await self._preload(session)
            except BaseException:  # cancelled (shutdown) or failed: it is nobody's yet
                # destroyed in the background, where shutdown waits for it (`close`)
                self.pools.discard(session)
                raise
        finally:
            self.starting -= 1
        self.pools.metrics.kernel_start_seconds.observe(session.start_seconds)
        if self.pools.closing or len(self.ready) >= self.size:
            await session.close()
            return
        self.ready.append(session)
        self.pools.watch(self, session)

    async def _preload(self, session: KernelSession) -> None:
        modules = self.pools.config.preload
        if self.kind != "ipykernel" or not modules:
            return
        code = (
            "__import__('kernels.python.startup', fromlist=['_'])"
            f".preload({json.dumps(list(modules))!r})"
        )
        reply = await session.run_silent(code, timeout=self.pools.config.kernel_start_timeout)
        if reply is None or reply.get("status") != "ok":
            log.warning("the %s pool's preload failed: %s", self.kind, reply)


class Pools:
    """Every pool of a gateway, their refiller, and the cold path for runs they cannot serve."""

    def __init__(
        self,
        config: ExecutionConfig,
        backend: SandboxBackend,
        wire: Wire,
        metrics: Metrics,
        sizes: Mapping[Kernel, int],
    ) -> None:
        self.config = config
        self.backend = backend
        self.wire = wire
        self.metrics = metrics
        self.pools = {kind: KernelPool(kind, size, self) for kind, size in sizes.items() if size}
        self.closing = False
        self._wake = asyncio.Event()
        self._refiller: asyncio.Task[None] | None = None
        self._watchers: dict[int, tuple[asyncio.Future[None], ...]] = {}
        self._closing_tasks: set[asyncio.Task[None]] = set()
        self._memory_short = False
        self._wake_timer: asyncio.TimerHandle | None = None

    # --- life -----------------------------------------------------------------------------

    def start(self) -> None:
        if self.pools:
            why = overcommitted(self.config, total_memory())
            if why is not None:
                log.warning("the pools can be emptied by runs under memory pressure: %s", why)
            self._refiller = asyncio.create_task(self._refill())

    def wake(self) -> None:
        self._wake.set()

    def wake_later(self) -> None:
        """Wake the refiller the backend's `refill_delay` from now (once, however many
        takes): with a kernel start of about a second of CPU on 2 cores, a short run answers
        before the start competes with it (bench/README.md, "The warm path")."""
        delay = self.backend.refill_delay
        if delay <= 0:
            self.wake()
        elif self._wake_timer is None:
            loop = asyncio.get_running_loop()
            self._wake_timer = loop.call_later(delay, self._timer_wake)

    def _timer_wake(self) -> None:
        self._wake_timer = None
        self._wake.set()

    async def close(self) -> None:
        """Stop refilling and destroy every pooled kernel (shutdown): the one being started
        (its start is given up and waited out: what it made is destroyed), the idle ones
        and those being destroyed already, however the destruction of each ends (a failure
        is logged): the backend shuts down next, and what is left then outlives the gateway."""
        self.closing = True
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        self._wake.set()
        if self._refiller is not None:
            self._refiller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refiller
        for tasks in list(self._watchers.values()):
            for task in tasks:
                task.cancel()
        for pool in self.pools.values():
            while pool.ready:
                self.discard(pool.ready.pop())
        await self.destroyed()

    async def destroyed(self) -> None:
        """Wait until no sandbox is being destroyed (each in a task of its own: `discard`,
        `end`; some maybe added meanwhile)."""
        while closing := [task for task in self._closing_tasks if not task.done()]:
            await asyncio.wait(closing)

    # --- taking ---------------------------------------------------------------------------

    def take(self, language: Language, spec: SandboxSpec) -> KernelSession | None:
        """A pooled kernel for a run with this spec, or None (then it starts its own)."""
        pool = self.pools.get(traits(language).kernel)
        if pool is None or spec.workspace is not None or spec.network:
            return None
        session = pool.take()
        if session is not None:
            self._unwatch(session)
        return session

    @contextlib.asynccontextmanager
    async def kernel(
        self,
        spec: SandboxSpec,
        cancel: asyncio.Event,
        source: Sandbox | None = None,
        ready: KernelSession | None = None,
    ) -> AsyncIterator[KernelSession]:
        """A run's kernel for the length of a block: from its pool when one is ready, else
        started now (StartCancelled when `cancel` is set first). However the block ends,
        every process of its sandbox is killed and the sandbox destroyed: the destruction
        starts in the block's `finally` and goes on off the caller's path (`end`), so the
        run's record is answered without waiting for the engine; `close()` waits for it.
        With `source` (a kept snapshot's sandbox), a continuation of its kernel, never
        pooled: `ready` if one was made ahead (`gateway.runs.snapshots`), else started now."""
        if ready is not None and not await self._fits(ready, spec):
            self.discard(ready)
            ready = None
        if ready is not None:
            session = ready
        elif source is not None:
            session = await start_session(
                self.backend, spec, self.config, self.wire, cancel, source
            )
        else:
            session = await self.acquire(spec, cancel)
        try:
            yield session
        finally:
            self.end(session)

    async def acquire(self, spec: SandboxSpec, cancel: asyncio.Event) -> KernelSession:
        """The run's kernel: from its pool when one is ready, else started now."""
        session = self.take(spec.language, spec)
        if session is None:
            return await self._start_cold(spec, cancel)
        if not await self._fits(session, spec):  # a kernel of the run's own
            self.discard(session)
            return await self._start_cold(spec, cancel)
        return session

    async def _fits(self, session: KernelSession, spec: SandboxSpec) -> bool:
        """Whether a kernel started ahead with the default limits has the run's (a lower
        memory limit is set now; a sandbox that cannot lower it does not fit). Cancelled
        or failed meanwhile, the kernel is discarded (it is in no one's hands)."""
        if spec.limits.memory_bytes >= self.config.memory_bytes:
            return True
        try:
            return await session.sandbox.set_memory_limit(spec.limits.memory_bytes)
        except BaseException:
            self.discard(session)
            raise

    async def _start_cold(self, spec: SandboxSpec, cancel: asyncio.Event) -> KernelSession:
        session = await start_session(self.backend, spec, self.config, self.wire, cancel)
        # every start is timed once, where it happens (a pooled one when it fills its pool)
        self.metrics.kernel_start_seconds.observe(session.start_seconds)
        return session

    # --- keeping them full, and alive -----------------------------------------------------

    async def _refill(self) -> None:
        """One kernel at a time for all pools, the emptiest first; never under memory
        pressure."""
        await self._size_when_present()
        while not self.closing:
            self._wake.clear()
            self._check_memory()
            pool = max(self.pools.values(), key=lambda p: p.wanted / max(p.size, 1))
            if pool.wanted > 0 and not self._memory_short:
                try:
                    await pool.fill_one()
                    pool.failures = 0
                    continue
                except (GatewayError, OSError) as exc:
                    pool.failures += 1
                    log.warning("the %s pool could not start a kernel: %s", pool.kind, exc)
                    if pool.failures >= GIVE_UP_AFTER:
                        log.warning("the %s pool is off: its kernels do not start", pool.kind)
                        pool.size = 0
                    await asyncio.sleep(RETRY_DELAY)
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), WATCH_INTERVAL)

    async def _size_when_present(self) -> None:
        """Pools of size `WHEN_PRESENT`: one kernel if the backend's kernels have its
        language (their environment, which the backend reads once), else none."""
        waiting = [pool for pool in self.pools.values() if pool.size == WHEN_PRESENT]
        if not waiting:
            return
        found = await self.backend.environment()
        languages = {} if found is None else found.found.get("languages") or {}
        for pool in waiting:
            present = any(TRAITS[name].kernel == pool.kind for name in languages if name in TRAITS)
            pool.size = 1 if present else 0
            log.info("the %s pool holds %d: %s", pool.kind, pool.size, _why(present))

    def _check_memory(self) -> None:
        free = available_memory()
        short = free is not None and free < self.config.pool_min_free_bytes
        if short and not self._memory_short:
            log.warning("memory is short (%s bytes available): the pools shrink", free)
        self._memory_short = short
        if short:
            for pool in self.pools.values():
                if pool.ready:
                    self.discard(pool.ready.pop())
                    return

    def watch(self, pool: KernelPool, session: KernelSession) -> None:
        """Replace a pooled kernel that dies while it waits; read (and drop) what it
        publishes meanwhile, so that it never blocks on its output (`discard_iopub`)."""

        async def watch() -> None:
            await session.sandbox.wait_exit()
            if session in pool.ready:
                log.warning("an idle %s kernel of the pool died; replacing it", pool.kind)
                pool.ready.remove(session)
                self.discard(session)
                self.wake()

        drain = asyncio.ensure_future(session.client.discard_iopub())
        self._watchers[id(session)] = (asyncio.create_task(watch()), drain)

    def _unwatch(self, session: KernelSession) -> None:
        # Cancelled here, before the taker reads: a cancelled drain never takes another
        # message (a receive under way stays the client's, for the run).
        for task in self._watchers.pop(id(session), ()):
            task.cancel()

    def discard(self, session: KernelSession) -> None:
        """Destroy a pooled kernel in the background (shutdown waits for it)."""
        self._unwatch(session)
        self._destroy(session.close())

    def end(self, session: KernelSession) -> None:
        """A run's last two steps, the same on every backend, in the background (shutdown
        waits for them): every process of its sandbox ends, then everything it made goes
        (and the kernel client is closed)."""
        self._destroy(_kill_and_close(session))

    def _destroy(self, destroying: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(destroying)
        self._closing_tasks.add(task)
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a sandbox could not be destroyed", exc_info=task.exception())

    # --- reports --------------------------------------------------------------------------

    @property
    def ready(self) -> int:
        return sum(len(pool.ready) for pool in self.pools.values())

    @property
    def busy(self) -> bool:
        """A kernel is being started or destroyed, or the refiller is about to start one
        (a pool is short: a take's delayed wake, or the next look at the pools)."""
        refilling = self._refiller is not None and not self._refiller.done()
        wanted = (
            refilling
            and not self._memory_short
            and any(pool.wanted > 0 for pool in self.pools.values())
        )
        return wanted or any(p.starting for p in self.pools.values()) or bool(self._closing_tasks)

    def describe(self) -> dict[str, dict[str, int]]:
        return {
            kind: {
                "size": max(pool.size, 0),  # WHEN_PRESENT until the environment is read
                "ready": len(pool.ready),
                "starting": pool.starting,
                "hits": pool.hits,
                "misses": pool.misses,
            }
            for kind, pool in self.pools.items()
        }


def _why(present: bool) -> str:
    return "its kernel is in the backend's kernels" if present else "no kernel of its kind"
