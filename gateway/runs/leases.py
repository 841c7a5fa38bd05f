"""The heartbeat of a gateway replica on a shared store: every third of `lease_seconds` it
renews the leases of the runs it holds, cancels those another replica asked it to cancel
(a notification it missed), stops those it lost (another replica failed them after this
one's lease ran out: they must not run on unseen), and fails the runs of replicas whose
lease ran out (they died). A store that cannot be reached is logged and tried again on the
next beat: the runs here go on meanwhile."""

from __future__ import annotations

import asyncio
import logging

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
    while True:
        try:
            await beat(store, runs)
        except GatewayError as exc:
            log.warning("leases: %s", exc.message)
        except Exception:
            log.exception("leases: a heartbeat failed")
        await asyncio.sleep(interval)


async def beat(store: RecordStore, runs: RunService) -> None:
    renewal = await store.renew(runs.run_ids)
    for run_id, note in renewal.cancels.items():
        runs.cancel_here(run_id, note)
    for run_id in renewal.lost:
        runs.cancel_here(run_id, LOST)
    failed = await store.fail_expired(EXPIRED)
    if failed:
        log.warning("leases: failed %d run(s) of replicas whose lease ran out", failed)
