"""The heartbeat of a gateway replica on a shared store: every third of `lease_seconds` it
renews the leases of the runs it holds, cancels those another replica asked it to cancel
(a notification it missed), stops those it lost (another replica failed them after this
one's lease ran out: they must not run on unseen), and fails the runs of replicas whose
lease ran out (they died). A store that cannot be reached is logged and tried again on the
next beat: the runs here go on meanwhile.

A replica fails others' runs only once it has reached the store at every beat for a whole
lease. After an outage of the store every replica's leases look expired, the owners' too:
this gives each owner a lease's time to renew its own before anyone takes them for dead (a
replica that lost only its own link to the store renews nothing and is still failed)."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from gateway.errors import GatewayError
from gateway.runs.service import RunService
from gateway.settings import Settings
from gateway.store.base import RecordStore

log = logging.getLogger(__name__)

EXPIRED = (
    "The gateway replica {replica} that ran this stopped renewing its lease (it died or lost "
    "its store); the run was failed by another replica and its result is lost."
)
LOST = "Another replica failed this run after this replica's lease on it ran out."


async def keep_leases(store: RecordStore, runs: RunService, settings: Settings) -> None:
    interval = settings.lease_seconds / 3
    reached_since = time.monotonic()  # reaching the store at every beat since then
    while True:
        try:
            steady = time.monotonic() - reached_since >= settings.lease_seconds
            await beat(store, runs, fail_others=steady)
        except GatewayError as exc:
            log.warning("leases: %s", exc.message)
            reached_since = math.inf
        except Exception:
            log.exception("leases: a heartbeat failed")
            reached_since = math.inf
        else:
            reached_since = min(reached_since, time.monotonic())
        await asyncio.sleep(interval)


async def beat(store: RecordStore, runs: RunService, fail_others: bool = True) -> None:
    renewal = await store.renew(runs.run_ids)
    for run_id, note in renewal.cancels.items():
        runs.cancel_here(run_id, note)
    for run_id in renewal.lost:
        runs.cancel_here(run_id, LOST)
    if not fail_others:
        return
    failed = await store.fail_expired(EXPIRED)
    if failed:
        log.warning("leases: failed %d run(s) of replicas whose lease ran out", failed)
