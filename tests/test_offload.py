"""The heavy-work pool shared fairly (issue 29, row 2 and 5): each owner's work waits in a
queue of its own, the queues take turns, an owner has at most `per_owner` pieces running,
and work whose caller gave up never runs (or, once running, is waited for)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable

import pytest

from gateway.offload import OWNER, HeavyWork

pytestmark = pytest.mark.fast


class Gate:
    """Work that runs until it is let go, saying when it started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._release = threading.Event()
        self._lock = threading.Lock()

    def work(self, name: str) -> Callable[[], str]:
        def run() -> str:
            with self._lock:
                self.started.append(name)
            assert self._release.wait(30), "never let go"
            return name

        return run

    def let_go(self) -> None:
        self._release.set()


async def submit(pool: HeavyWork, owner: Hashable, call: Callable[[], str]) -> str:
    OWNER.set(owner)  # this task's own context
    return await pool.run(call)


async def until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_one_owners_queue_never_holds_back_anothers_work() -> None:
    """Mallory queues ten pieces of slow work; bob's one piece starts at once, in the worker
    her cap leaves free, while nine of hers still wait."""

    async def scenario() -> None:
        pool = HeavyWork(workers=2, per_owner=1)
        gate = Gate()
        mallory = [
            asyncio.create_task(submit(pool, "mallory", gate.work(f"m{i}"))) for i in range(10)
        ]
        await until(lambda: gate.started == ["m0"])
        bob = asyncio.create_task(submit(pool, "bob", lambda: "bob's record"))
        assert await asyncio.wait_for(bob, 5) == "bob's record"
        assert pool.waiting("mallory") == 9 and pool.running("mallory") == 1
        gate.let_go()
        assert await asyncio.gather(*mallory) == [f"m{i}" for i in range(10)]

    asyncio.run(scenario())


def test_owners_take_turns() -> None:
    """With one worker, three owners' queued work runs one piece of each in turn, not each
    owner's whole queue before the next's."""

    async def scenario() -> list[str]:
        pool = HeavyWork(workers=1, per_owner=1)
        order: list[str] = []
        blocker = Gate()
        first = asyncio.create_task(submit(pool, "x", blocker.work("x0")))
        await until(lambda: blocker.started == ["x0"])
        tasks = [
            asyncio.create_task(submit(pool, owner, lambda n=f"{owner}{i}": order.append(n) or n))
            for owner in ("a", "b", "c")
            for i in range(3)
        ]
        await asyncio.sleep(0.05)
        blocker.let_go()
        await asyncio.gather(first, *tasks)
        return order

    assert asyncio.run(scenario()) == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]


def test_work_given_up_while_it_waits_never_runs() -> None:
    async def scenario() -> None:
        pool = HeavyWork(workers=1, per_owner=1)
        gate = Gate()
        ran: list[str] = []
        running = asyncio.create_task(submit(pool, "ann", gate.work("first")))
        await until(lambda: gate.started == ["first"])
        waiting = asyncio.create_task(submit(pool, "ann", lambda: ran.append("second") or ""))
        await until(lambda: pool.waiting("ann") == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pool.waiting("ann") == 0
        gate.let_go()
        assert await running == "first"
        await asyncio.sleep(0.05)
        assert ran == []

    asyncio.run(scenario())


def test_work_given_up_while_it_runs_is_waited_for() -> None:
    """What a running piece holds (a body's room) must stay counted until it ends: the
    cancelled caller returns only after it, through repeated cancellations."""

    async def scenario() -> None:
        pool = HeavyWork(workers=1, per_owner=1)
        gate = Gate()
        task = asyncio.create_task(submit(pool, "ann", gate.work("long")))
        await until(lambda: gate.started == ["long"])
        for _ in range(3):
            task.cancel()
            await asyncio.sleep(0.02)
        assert not task.done()  # still waiting for the piece that runs
        gate.let_go()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.running("ann") == 0

    asyncio.run(scenario())


def test_one_pool_serves_several_event_loops() -> None:
    """Gateways in threads of one process (the tests') share the process's pool."""
    pool = HeavyWork(workers=2, per_owner=1)
    results: list[str] = []

    def loop_in_thread(owner: str) -> None:
        results.append(asyncio.run(submit(pool, owner, lambda: owner)))

    threads = [threading.Thread(target=loop_in_thread, args=(f"u{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == ["u0", "u1", "u2", "u3"]


def test_an_exception_reaches_its_caller_and_frees_the_worker() -> None:
    async def scenario() -> str:
        pool = HeavyWork(workers=1, per_owner=1)

        def fails() -> str:
            raise ValueError("bad notebook")

        with pytest.raises(ValueError, match="bad notebook"):
            await submit(pool, "ann", fails)
        return await submit(pool, "ann", lambda: "next")

    assert asyncio.run(scenario()) == "next"
