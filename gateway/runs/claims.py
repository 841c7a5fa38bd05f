"""`Claims`: a replica with a free run slot takes the oldest background run queued in the
store by any replica (DESIGN.md decision 27), so that work goes where there is room.

A background run that finds no free slot of its replica, and needs nothing of that
replica (`gateway.runs.carried`), is admitted into the store's queue with its request,
unleased (`RecordStore.enqueue`); the replica gives back its room in the bodies budget
and keeps nothing of it. Every replica's claims loop then, while a slot of its own is
free (`RunSlots.reserve`: after the runs waiting here, which need their client), claims
the oldest queued run whose user is below their share of its slots, the user holding
fewest first (`RecordStore.claim`, `FOR UPDATE SKIP LOCKED`: each run once), and runs it
under a lease of its own (`RunService.adopt`).

The loop wakes when a slot here is left free, when any replica queues a run (the store's
notification), and every `POLL` seconds (a notification missed, a slot reserved by
nothing). A store that cannot be reached is logged once and tried again at the next wake.
It stops claiming when the gateway drains: what is still queued waits for another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gateway.errors import GatewayError
from gateway.runs.carried import VERSION
from gateway.runs.slots import RunSlots
from gateway.store.base import Claimed, RecordStore

log = logging.getLogger(__name__)

POLL = 1.0  # seconds between looks at the store's queue when nothing woke the loop


class Claims:
    """Started with `start()` (a store that queues: `RecordStore.queues`), stopped with
    `await stop()`, which lets a claim under way end first (its run is then adopted)."""

    def __init__(
        self, store: RecordStore, slots: RunSlots, adopt: Callable[[Claimed], None]
    ) -> None:
        self.store = store
        self.slots = slots
        self.adopt = adopt
        # runs this replica queued that still wait in the store, as last seen (the queue
        # gauge's share of this replica)
        self.waiting_here = 0
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        slots.on_free = self.wake
        store.on_queued = self.wake

    @property
    def on(self) -> bool:
        return self.store.queues

    def wake(self) -> None:
        self._wake.set()

    def queued(self) -> None:
        """This replica has just queued a run in the store."""
        self.waiting_here += 1
        self.wake()

    def start(self) -> None:
        if self.on and self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        self._stopping = True
        self.wake()
        task, self._task = self._task, None
        if task is not None:
            await task

    async def _loop(self) -> None:
        failing = False
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL)
            self._wake.clear()
            try:
                await self._claim_while_free()
            except GatewayError as exc:  # the store is restarting or unreachable
                if not failing:
                    log.warning("claims: the store's queue cannot be read: %s", exc.message)
                failing = True
            except Exception:
                log.exception("claims: a claim failed")
                failing = True
            else:
                if failing:
                    log.info("claims: the store's queue can be read again")
                failing = False

    async def _claim_while_free(self) -> None:
        while not self._stopping and self.slots.reserve():
            try:
                claimed = await self.store.claim(self.slots.held, self.slots.per_user, VERSION)
            except BaseException:
                self.slots.unreserve()
                raise
            if claimed is None:
                self.slots.unreserve()
                break
            self.slots.assign(claimed.record.user)
            self.adopt(claimed)
        if self.waiting_here:
            self.waiting_here = await self.store.queued_from()
