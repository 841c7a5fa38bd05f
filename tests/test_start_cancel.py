"""A kernel start given up at any moment leaves nothing behind, on every backend: a run
cancelled while its kernel starts (DELETE, a drain's deadline: `cancel` is set) and a start
whose task is cancelled (shutdown cancels the pools' refiller mid-start), and one cancelled
again and again (a shutdown's cancel on top of a run's, while the first is waited out).

The moment matters (a forked kernel whose answer is on its way when the start is given up
was left running, with its cgroup, after the gateway stopped), and no moment can be chosen
from outside without reaching into a backend: so each way of giving up is tried at
successive moments across a start, and after each the census must be clean."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from gateway.execution.session import StartCancelled, start_session
from gateway.models.request import WorkspaceRef
from gateway.sandbox.base import SandboxSpec
from gateway.sandbox.uids import LEASE_DIR
from tests import census
from tests.conftest import start_gateway
from tests.support import GatewayThread, wait_for

# From at once to past a forked kernel's answer (~20-60 ms) and into a container's start.
MOMENTS = tuple(i * 0.006 for i in range(16))


async def _give_up_after(
    server: GatewayThread, delay: float, how: str, workspace: WorkspaceRef | None = None
) -> str:
    """Start a Python kernel and give up `delay` seconds in: what became of the start."""
    services = server.gateway.services
    assert services is not None
    pools = services.runs.pools
    spec = SandboxSpec(
        run_id=f"cancel-{how}-{int(delay * 1000)}",
        language="python",
        limits=pools.config.limits(),
        workspace=workspace,
    )
    cancel = asyncio.Event()
    start = asyncio.ensure_future(
        start_session(pools.backend, spec, pools.config, pools.wire, cancel)
    )
    loop = asyncio.get_running_loop()
    loop.call_later(delay, cancel.set if how == "event" else start.cancel)
    if how == "again":  # while the first cancellation waits for what the start was making
        for later in range(1, 100):  # every millisecond: into every wait of the clean-up
            loop.call_later(delay + later / 1000, start.cancel)
    try:
        session = await start
    except StartCancelled:
        return "cancelled while the sandbox started"
    except asyncio.CancelledError:
        if not start.cancelled():
            raise  # this test's own task was cancelled
        return "task cancelled"
    await session.close()  # it was ready, or had begun getting ready, first
    return "started"


def _held() -> list[str]:
    """What this process (the gateways' and the tests') holds open of sandboxes: folders,
    process descriptors and uid leases (not sockets or pipes: HTTP connection pools grow as
    they like)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if (
                target == "anon_inode:[pidfd]"
                or target.startswith(f"{LEASE_DIR}/")
                or (target.startswith("/") and os.path.isdir(f"/proc/self/fd/{fd}"))
            ):
                held.append(target)
    return sorted(held)


@pytest.mark.parametrize("how", ["event", "task", "again", "workspace"])
def test_a_start_given_up_at_any_moment_leaves_nothing(
    backend_name: str, how: str, tmp_path: Path
) -> None:
    """Given up by the run's cancel event, by cancelling the start's task once, or again and
    again; and a start with a workspace folder (opened first, in a thread: the moment 0 gives
    up while it is opened), its task cancelled once."""
    server = start_gateway(backend_name)  # no pools: every start is the test's
    workspace = WorkspaceRef(tmp_path, ("w",)) if how == "workspace" else None
    try:
        start = _give_up_after(server, 60.0, how, workspace)
        assert server.call(start, timeout=120) == "started"
        before = _held()  # after one whole start: what a backend keeps open for good
        outcomes = []
        for delay in MOMENTS:
            outcome = server.call(_give_up_after(server, delay, how, workspace), timeout=120)
            outcomes.append(outcome)
            # everything the start made is gone when it returns or raises: no waiting
            assert census.census() == [], (delay, outcome)
            assert _held() == before, (delay, outcome)
        # the moments spanned the start: given up before the sandbox was made, and later
        assert outcomes[0] != "started", outcomes
    finally:
        with contextlib.suppress(Exception):
            wait_for(server.idle, timeout=60)
        server.stop()


def test_a_forked_start_given_up_while_its_parent_starts_again_leaves_nothing() -> None:
    """A fork needs its warm parent; one that died is started again by the next fork (a
    pool's refill, at shutdown too). Given up while that parent starts, the start leaves
    neither the parent it was starting nor a kernel (a parent's process made in a thread
    after its start was cancelled was nobody's, and outlived the gateway)."""
    server = start_gateway("forkserver")
    backend = server.gateway.services.backend  # type: ignore[union-attr]
    parent = backend.parents["ipykernel"]
    try:
        for delay in MOMENTS[::2]:
            if parent.alive:  # else the last try gave up before its fork started one
                assert parent.pid is not None
                os.kill(parent.pid, signal.SIGKILL)
                assert wait_for(lambda: not parent.alive, timeout=30)
            outcome = server.call(_give_up_after(server, delay, "task"), timeout=180)
            # a parent it started is the backend's (in its footprint), else a stray process
            assert census.census() == [], (delay, outcome)
    finally:
        with contextlib.suppress(Exception):
            wait_for(server.idle, timeout=60)
        server.stop()
