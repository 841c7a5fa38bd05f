"""A forkserver gateway that stops at any moment leaves nothing, and neither does a warm parent
that dies at any moment (DESIGN.md decisions 14 and 23).

Forkserver pools refill at once (a fork costs no core's second), so a stop usually finds a
refill under way: a cgroup being made, a fork on its way, a kernel getting ready. And a warm
parent may die in the middle of a fork (killed, out of memory), leaving a first child or a
pid 1 that nobody waits for any more: that child carried on, joined the sandbox's cgroup
after the gateway had found it empty, and started a kernel nobody knew, which looked like a
pooled one (a fresh kernel) for as long as its gateway lived and was found by the leak
census only after it had stopped. As in test_start_cancel.py, no moment can be chosen from
outside, so each is tried at many: stops at random moments (the seed is in every message),
deaths at successive moments from the take that starts a refill."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import pytest

from gateway.sandbox.base import SandboxSpec
from gateway.sandbox.forkserver.parent import Parent
from tests import census
from tests.conftest import start_gateway
from tests.support import GatewayThread, wait_for

pytestmark = pytest.mark.slow

STOPS = 100
# Small pools of both imported kinds, and no preload: each stop costs a gateway's start
# (about a second), and a refill is a fork either way.
POOLS = {"pool_python": 1, "pool_bash": 1, "preload": ()}
POOLED = 2
# a run that takes a kernel of each pool: both refill at once
TAKES = ({"code": "print(1)"}, {"code": "echo 1", "language": "bash"})


@pytest.mark.timeout(600)
def test_a_forkserver_gateway_stopped_at_any_moment_of_its_refills_leaves_nothing() -> None:
    """Stopped at 100 random moments: while its pools fill for the first time (one stop in
    four), or once they are full, just after background runs took a kernel from each (the
    refills then start at once, and the drain waits for the runs). When `stop()` returns,
    nothing of the gateway is left: no process (kernel, warm parent), cgroup or mount."""
    seed = random.randrange(1 << 32)
    moments = random.Random(seed)
    in_flight = 0
    for stop in range(STOPS):
        server = start_gateway("forkserver", **POOLS)
        pools = server.gateway.services.runs.pools  # type: ignore[union-attr]
        try:
            if stop % 4:
                full = lambda held=pools: held.ready == POOLED  # noqa: E731
                assert wait_for(full, timeout=60, interval=0.01), pools.describe()
                for body in TAKES[: moments.randint(1, 2)]:
                    taken = server.client().request(
                        "POST", "/v1/runs", {**body, "background": True}
                    )
                    assert taken.status == 202, taken.body
            moment = moments.uniform(0.0, 0.3)
            time.sleep(moment)
            starting = sum(pool["starting"] for pool in pools.describe().values())
        finally:
            server.stop()
        left = census.census()
        assert left == [], f"seed {seed}: stop {stop}, {moment:.3f} s in: left {left}"
        in_flight += starting > 0
    # the moments were those of refills: a kernel was being started at many of the stops
    assert in_flight >= STOPS // 5, f"seed {seed}: only {in_flight} stops found a refill"


# From the take to past a forked kernel's answer (a fork and its sandbox: ~20-40 ms here).
DEATHS = tuple(i * 0.002 for i in range(24))


async def _take_and_kill(server: GatewayThread, parent: Parent, moment: float) -> None:
    """Take the pool's kernel (its refill starts at once) and kill the warm parent `moment`
    seconds later; the kernel taken is destroyed meanwhile."""
    pools = server.gateway.services.runs.pools  # type: ignore[union-attr]
    await parent.ensure()  # started again if the last kill came after its fork's answer
    spec = SandboxSpec(run_id="taken", language="python", limits=pools.config.limits())
    session = pools.take("python", spec)  # as a run takes it
    assert session is not None, pools.describe()
    assert parent.pid is not None
    asyncio.get_running_loop().call_later(moment, os.kill, parent.pid, signal.SIGKILL)
    await session.close()
    await asyncio.sleep(moment)


def _groups(instance: str) -> set[str]:
    """The names of a gateway's forked kernels' cgroups (one per sandbox)."""
    root = Path("/sys/fs/cgroup")
    mark = f"gateway-gwfs{instance[:6]}-*"
    return {p.name for p in [*root.glob(f"*/{mark}"), *root.glob(mark)]}


@pytest.mark.timeout(300)
def test_a_warm_parent_killed_while_it_forks_leaves_no_kernel() -> None:
    """The parent is killed at successive moments from the take that starts a refill: before
    the fork, during it (its first child, the sandbox's pid 1 being set up) and after its
    answer. Once the pool is full again (the refill is tried again, by a parent started
    anew), the gateway's only forked kernel is the pooled one: one pid 1, one cgroup."""
    server = start_gateway("forkserver", pool_python=1, preload=())
    services = server.gateway.services
    assert services is not None
    pools, parent = services.runs.pools, services.backend.parents["ipykernel"]  # type: ignore[attr-defined]
    instance = server.settings.instance_id or ""
    settled = lambda: pools.ready == 1 and not pools.busy  # noqa: E731
    try:
        for moment in DEATHS:
            assert wait_for(settled, timeout=60, interval=0.01), pools.describe()
            server.call(_take_and_kill(server, parent, moment), timeout=60)
            assert wait_for(settled, timeout=60, interval=0.01), pools.describe()
            roots, groups = census.forked_roots(instance), _groups(instance)
            assert len(roots) == 1 and len(groups) == 1, (moment, roots, groups)
    finally:
        server.stop()
    assert census.census() == []
