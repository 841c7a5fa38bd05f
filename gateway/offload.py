"""Work too heavy for the event loop: encoding or parsing megabytes of JSON, converting and
validating notebooks, cutting large records, checking a large kernel message's signature;
shared fairly between the users it is done for.

It runs in a small pool of threads of its own (`WORKERS`), never in asyncio's default
executor, which the Docker SDK's calls and file staging share: a burst of heavy requests
then waits for a worker instead of taking every thread the engine calls need.

Whose work it is (`OWNER`, a context variable: a handler sets it to its caller once
authenticated, and the tasks a request starts, its run's among them, inherit it) decides
when it runs: each owner's work waits in a queue of its own, the queues take turns, and an
owner has at most `PER_OWNER` pieces of work running at once. With `PER_OWNER` below
`WORKERS`, however much one user sends, a worker is left for everybody else's (another
user's record is read within the time of one piece of work, not behind a queue of yours).
Work whose caller has gone (a cancelled task) is dropped while it waits; once running, it
is waited for before the cancellation goes on, so that what it holds (a body's room in
its budget) is counted until it ends.

The threads share the GIL with the loop. Python code there only slows the loop (CPython
hands the GIL back every switch interval, 5 ms), but one long call into C that keeps the
GIL (a `json.dumps` or `json.loads` of tens of megabytes) freezes it for that call's
length: such work is cut into pieces of about a megabyte (`handlers/encode.py` encodes
answers so, `jsoncodec.scan` scans bodies so), or kept small by the bounds upstream (a
body's values, `jsoncodec.JsonLimits`). Small work (`SMALL` bytes or less) runs inline: a
thread hop costs more than it saves.

The pool is made on first use and lives as long as the process, as asyncio's own default
executor does; it serves every event loop of the process (tests run several gateways).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any, ParamSpec, TypeVar

from gateway.errors import GatewayError

WORKERS = 3
PER_OWNER = 1  # pieces of one owner's work running at once
SMALL = 256 * 1024  # bytes of input below which work runs inline

P = ParamSpec("P")
T = TypeVar("T")

# Whose work this is: a user's name, or None for the gateway's own.
OWNER: contextvars.ContextVar[Hashable] = contextvars.ContextVar("heavy_work_owner", default=None)


@dataclasses.dataclass(eq=False)
class _Job:
    owner: Hashable
    call: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class HeavyWork:
    """`workers` threads taking their owners' queued work in turns, at most `per_owner`
    pieces of one owner's at once. Thread-safe: any event loop may submit."""

    def __init__(self, workers: int = WORKERS, per_owner: int = PER_OWNER) -> None:
        self.workers = workers
        self.per_owner = per_owner
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="gateway-heavy"
        )
        self._lock = threading.Lock()
        self._queues: dict[Hashable, collections.deque[_Job]] = {}
        self._turns: collections.deque[Hashable] = collections.deque()  # owners with work queued
        self._running: collections.Counter[Hashable] = collections.Counter()
        self._busy = 0

    def waiting(self, owner: Hashable) -> int:
        """Pieces of `owner`'s work queued, not yet running."""
        with self._lock:
            return len(self._queues.get(owner, ()))

    def running(self, owner: Hashable) -> int:
        with self._lock:
            return self._running[owner]

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`function(*args, **kwargs)` in a worker, in its owner's turn; its result or its
        exception. Cancelled while it waits, it never runs; cancelled while it runs, it is
        waited for first."""
        loop = asyncio.get_running_loop()
        call = functools.partial(function, *args, **kwargs)
        # What the work is given (a body's megabytes) is the job's alone, and the job lets go
        # of it once the work is done or given up: an exception's traceback keeps its frames
        # and their locals alive until the cycle collector runs, which may be much later.
        del args, kwargs
        job = _Job(OWNER.get(), call, loop, loop.create_future())
        del call
        with self._lock:
            self._queues.setdefault(job.owner, collections.deque()).append(job)
            if job.owner not in self._turns:
                self._turns.append(job.owner)
            self._dispatch()
        try:
            result: T = await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not self._unqueue(job):
                await _wait_out(job.future)
            raise
        return result

    def _unqueue(self, job: _Job) -> bool:
        """Take `job` out of its queue; False when it has started already."""
        with self._lock:
            queue = self._queues.get(job.owner)
            if queue is None or job not in queue:
                return False
            queue.remove(job)
            if not queue:
                del self._queues[job.owner]
                self._turns.remove(job.owner)
            job.call = _done
            return True

    def _dispatch(self) -> None:
        """Start queued work while a worker is free: the next owner in turn that is under
        its cap (called with the lock held)."""
        while self._busy < self.workers and self._turns:
            for _ in range(len(self._turns)):
                owner = self._turns[0]
                self._turns.rotate(-1)  # its turn is taken: to the back of the line
                if self._running[owner] < self.per_owner:
                    break
            else:
                return  # every owner with work queued is at its cap
            queue = self._queues[owner]
            job = queue.popleft()
            if not queue:
                del self._queues[owner]
                self._turns.remove(owner)
            self._running[owner] += 1
            self._busy += 1
            self._executor.submit(self._work, job)

    def _work(self, job: _Job) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = job.call()
        except GatewayError as exc:  # an answer on purpose: its frames are nobody's concern
            error = exc.with_traceback(None)
        except BaseException as exc:  # handed to the caller, whatever it is
            error = exc
        finally:
            # What the work was given (a body of megabytes) goes now, not with the job: an
            # exception's frames refer to the job in a cycle only the collector breaks.
            job.call = _done
        with self._lock:
            self._running[job.owner] -= 1
            if not self._running[job.owner]:
                del self._running[job.owner]
            self._busy -= 1
            self._dispatch()
        with contextlib.suppress(RuntimeError):  # the caller's loop has closed
            job.loop.call_soon_threadsafe(_settle, job.future, result, error)


def _done() -> None:
    raise RuntimeError("this work has been done")


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


async def _wait_out(future: asyncio.Future[Any]) -> None:
    """Wait until `future` is done, through any number of cancellations (the caller
    re-raises its own)."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({future})
    if not future.cancelled():
        future.exception()  # retrieved: the caller is gone, nobody else will


_pool: HeavyWork | None = None
_pool_lock = threading.Lock()


def heavy_work() -> HeavyWork:
    """The process's heavy-work pool (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = HeavyWork()
        return _pool


async def offload(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in the heavy-work pool, in its owner's turn; its result
    or its exception."""
    try:
        return await heavy_work().run(function, *args, **kwargs)
    finally:
        del args, kwargs  # not kept by a traceback's frames (`HeavyWork.run`)


async def offload_if(size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """As `offload`, but inline when the work's input is `SMALL` bytes or less."""
    if size <= SMALL:
        return function(*args, **kwargs)
    return await offload(function, *args, **kwargs)
