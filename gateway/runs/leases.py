"""The heartbeat of a gateway replica on a shared store: every third of `lease_seconds` it
renews the leases of the runs it holds, cancels those another replica asked it to cancel
(a notification it missed), stops those it lost (another replica failed them after this
one's lease ran out: they must not run on unseen), and fails the runs of replicas whose
lease ran out (they died). A store that cannot be reached is logged and tried again on the
next beat: the runs here go on meanwhile.

A replica fails others' runs only once it has reached the store at every beat for a whole
lease. After an outage of the store every replica's leases look expired, the owners' too:
this gives each owner a lease's time to renew its own before anyone takes them for dead (a
replica that lost only its own link to the store renews nothing and is still failed).

**Its own thread, event loop and connection.** Nothing that happens to request handling
may let this replica's leases lapse: not an exhausted connection pool (the heartbeat has a
`LeaseLink` of its own, never the pool), and not a frozen event loop (a bug, a CPU-heavy
request: the heartbeat runs in a thread with its own event loop, and the GIL is handed to
it every switch interval however busy the main thread is; only one long C call that holds
the GIL, such as decoding a huge record's JSON, delays a beat, by well under a second).
It reads the run ids to renew from the snapshot the `RunService` publishes (`leased`, an
immutable frozenset swapped on every change: safe to read from any thread), and hands what
it learns (cancels, lost runs, a taken instance id) to the main loop with
`call_soon_threadsafe`, where the run service acts on it whenever that loop turns again.

**A wedged loop is a dead replica.** The main loop stamps the time every second. If it has
not turned for `WEDGED_LEASES` leases, its runs cannot end on their own (their deadlines
are kept on that loop), and renewing them would keep them "running", and counting against
their users' limits, forever: the heartbeat renews nothing until the loop turns again, so
another replica fails them as it would a dead replica's.

**The instance id.** The link holds this replica's instance id in the store while it is
connected (`gateway/store/postgres_leases.py`). If, after a lost connection, another live
process holds the id, this replica stops serving runs: its runs are cancelled, and the
gateway is told to stop (`on_taken`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

from gateway.errors import GatewayError
from gateway.runs.service import RunService
from gateway.store.base import LeaseLink, Renewal
from gateway.store.instance import InstanceTaken

log = logging.getLogger(__name__)

EXPIRED = (
    "The gateway replica {replica} that ran this stopped renewing its lease (it died or lost "
    "its store); the run was failed by another replica and its result is lost."
)
LOST = "Another replica failed this run after this replica's lease on it ran out."
TAKEN = (
    "This replica lost its instance id to another gateway process (started with the same "
    "id while this one was cut off from the store); the run was cancelled."
)
WEDGED_LEASES = 10  # leases without a turn of the main loop: the replica counts as dead
TICK = 1.0  # seconds between the main loop's stamps


class Heartbeat:
    """The lease loop in a thread of its own. `await start()` (which returns once the link
    holds the instance id, or raises `InstanceTaken`), `attach(runs)` once the run service
    exists, `await stop()` at shutdown (the thread is joined, the connection closed)."""

    def __init__(self, link: LeaseLink, lease: float, on_taken: Callable[[str], None]) -> None:
        self.link = link
        self.lease = lease  # `lease_seconds`
        self.on_taken = on_taken
        self.runs: RunService | None = None
        self._main_loop: asyncio.AbstractEventLoop | None = None
        self._alive = time.monotonic()  # the main loop's last stamp
        self._wedged = False
        self._ticker: asyncio.TimerHandle | None = None
        self._stopping = threading.Event()
        self._wake: asyncio.Event | None = None  # of the heartbeat's loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._holding: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, name="gateway-heartbeat", daemon=True)

    # --- the main loop's side -------------------------------------------------------------

    async def start(self) -> None:
        self._main_loop = asyncio.get_running_loop()
        self._tick()
        self._thread.start()
        try:
            await asyncio.wrap_future(self._holding)
        except GatewayError as exc:  # the store does not answer: nobody can say who holds it
            raise RuntimeError(
                f"cannot take this gateway's instance id in the store: {exc.message}"
            ) from None

    def attach(self, runs: RunService) -> None:
        """Renew the runs this service holds from now on (before: none)."""
        self.runs = runs

    async def stop(self) -> None:
        self._stopping.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                loop.call_soon_threadsafe(wake.set)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _tick(self) -> None:
        self._alive = time.monotonic()
        assert self._main_loop is not None
        self._ticker = self._main_loop.call_later(TICK, self._tick)

    def _deliver(self, renewal: Renewal) -> None:
        """On the main loop: act on what a beat learned."""
        if self.runs is None:
            return
        for run_id, note in renewal.cancels.items():
            self.runs.cancel_here(run_id, note)
        for run_id in renewal.lost:
            self.runs.cancel_here(run_id, LOST)

    def _taken(self, message: str) -> None:
        """On the main loop: the instance id is another process's now. Stop every run here
        and have the gateway stop."""
        log.error("leases: %s", message)
        if self.runs is not None:
            for run_id in list(self.runs.active):
                self.runs.cancel_here(run_id, TAKEN)
        self.on_taken(message)

    def _to_main(self, callback: Callable[..., None], *args: object) -> None:
        assert self._main_loop is not None
        with contextlib.suppress(RuntimeError):  # the main loop closed: nobody to tell
            self._main_loop.call_soon_threadsafe(callback, *args)

    # --- the heartbeat's thread -----------------------------------------------------------

    def _main(self) -> None:
        asyncio.run(self._run())  # a loop of its own, closed with its executor at the end

    async def _run(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        try:
            try:
                await self.link.connect()
            except BaseException as exc:
                self._holding.set_exception(exc)
                return
            self._holding.set_result(None)
            await self._beats()
        finally:
            await self.link.close()

    async def _beats(self) -> None:
        interval = self.lease / 3
        reached_since = time.monotonic()  # reaching the store at every beat since then
        while not self._stopping.is_set():
            try:
                steady = time.monotonic() - reached_since >= self.lease
                await self._beat(fail_others=steady)
            except InstanceTaken as exc:
                self._to_main(self._taken, str(exc))
                return
            except GatewayError as exc:
                log.warning("leases: %s", exc.message)
                reached_since = math.inf
            except Exception:
                log.exception("leases: a heartbeat failed")
                reached_since = math.inf
            else:
                reached_since = min(reached_since, time.monotonic())
            await self._sleep(interval)

    async def _beat(self, fail_others: bool) -> None:
        renewal = await self.link.renew(self._leased())
        if renewal.cancels or renewal.lost:
            self._to_main(self._deliver, renewal)
        if not fail_others:
            return
        failed = await self.link.fail_expired(EXPIRED)
        if failed:
            log.warning("leases: failed %d run(s) of replicas whose lease ran out", failed)

    def _leased(self) -> frozenset[str]:
        """The run ids to renew: the run service's snapshot, unless the main loop is wedged."""
        stalled = time.monotonic() - self._alive
        wedged = stalled > WEDGED_LEASES * self.lease
        if wedged != self._wedged:
            self._wedged = wedged
            if wedged:
                log.error(
                    "leases: the event loop has not turned for %.0f s: renewing no lease "
                    "until it does, so that another replica fails this one's runs",
                    stalled,
                )
            else:
                log.warning("leases: the event loop turns again; renewing leases")
        if wedged or self.runs is None:
            return frozenset()
        return self.runs.leased

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
