"""`gateway.runs.slots.RunSlots`: a user's share holds, a free slot goes to the user holding
the fewest (then the longest waiting), and a cancelled waiter never keeps a slot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.runs.config import RunServiceConfig
from gateway.runs.slots import RunSlots
from tests.support import part_config

pytestmark = pytest.mark.fast


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class Queue:
    """Waiters started in order; `served` lists them as they get their slot."""

    def __init__(self, slots: RunSlots) -> None:
        self.slots = slots
        self.served: list[str] = []
        self.tasks: dict[str, asyncio.Task[bool]] = {}
        self.cancels: dict[str, asyncio.Event] = {}

    async def wait(self, name: str, user: str) -> None:
        cancel = self.cancels[name] = asyncio.Event()

        async def acquire() -> bool:
            got = await self.slots.acquire(user, cancel)
            if got:
                self.served.append(name)
            return got

        self.tasks[name] = asyncio.create_task(acquire())
        await settle()


async def ann_holds_the_slot_bob_waits() -> tuple[RunSlots, Queue]:
    """One slot in all: ann's a0 holds it, bob's b0 waits for it."""
    slots = RunSlots(total=1, per_user=1)
    queue = Queue(slots)
    await queue.wait("a0", "ann")
    await queue.wait("b0", "bob")
    return slots, queue


def test_a_user_gets_at_most_the_share_and_others_the_rest() -> None:
    async def main() -> None:
        slots = RunSlots(total=4, per_user=3)
        queue = Queue(slots)
        for n in range(5):
            await queue.wait(f"a{n}", "ann")
        assert queue.served == ["a0", "a1", "a2"]  # a slot stays free for someone else
        assert (slots.running, slots.waiting) == (3, 2)
        await queue.wait("b0", "bob")
        assert queue.served[-1] == "b0" and slots.running == 4
        slots.release("ann")
        await settle()
        assert queue.served[-1] == "a3" and slots.held_by("ann") == 3
        queue.cancels["a4"].set()
        await settle()
        assert slots.waiting == 0

    asyncio.run(main())


def test_a_free_slot_goes_to_the_user_holding_fewest_then_by_arrival() -> None:
    async def main() -> None:
        slots = RunSlots(total=2, per_user=2)
        queue = Queue(slots)
        await queue.wait("a0", "ann")
        await queue.wait("a1", "ann")
        await queue.wait("a2", "ann")
        await queue.wait("a3", "ann")
        await queue.wait("b0", "bob")
        await queue.wait("b1", "bob")
        await queue.wait("c0", "cy")
        slots.release("ann")  # ann holds 1, bob and cy none: bob waited longer than cy
        await settle()
        assert queue.served[2:] == ["b0"]
        slots.release("ann")  # ann 0, bob 1, cy 0: ann's waiters came before cy's
        await settle()
        assert queue.served[3:] == ["a2"]
        slots.release("bob")  # ann 1, bob 0, cy 0: bob's b1 waited longer than cy's c0
        await settle()
        assert queue.served[4:] == ["b1"]
        slots.release("ann")  # ann 0, bob 1, cy 0: ann's a3 arrived before cy's c0
        await settle()
        assert queue.served[5:] == ["a3"]
        slots.release("bob")
        await settle()
        assert queue.served[6:] == ["c0"]

    asyncio.run(main())


def test_cancel_while_waiting_takes_no_slot_and_after_the_grant_gives_it_back() -> None:
    async def main() -> None:
        slots, queue = await ann_holds_the_slot_bob_waits()
        queue.cancels["b0"].set()
        await settle()
        assert queue.tasks["b0"].result() is False and slots.waiting == 0
        await queue.wait("c0", "cy")
        # granted and cancelled in one step: the waiter never runs, the slot moves on
        queue.cancels["c0"].set()
        slots.release("ann")
        await settle()
        assert queue.tasks["c0"].result() is False
        assert slots.running == 0 and slots.waiting == 0
        assert await slots.acquire("dee", asyncio.Event()) is True
        cancelled = asyncio.Event()
        cancelled.set()
        assert await slots.acquire("ed", cancelled) is False  # cancelled before it asked

    asyncio.run(main())


def test_a_waiting_task_that_is_cancelled_leaves_the_queue() -> None:
    async def main() -> None:
        slots, queue = await ann_holds_the_slot_bob_waits()
        queue.tasks["b0"].cancel()
        await settle()
        assert slots.waiting == 0
        slots.release("ann")
        assert slots.running == 0
        with pytest.raises(RuntimeError):
            slots.release("ann")  # a slot given back twice is a bug, said loudly

    asyncio.run(main())


def test_the_share_is_at_least_one_and_at_most_every_slot() -> None:
    assert RunSlots(total=1, per_user=0).per_user == 1
    assert RunSlots(total=4, per_user=9).per_user == 4


def test_the_default_share_leaves_a_slot_only_where_there_are_other_users() -> None:
    def share(**settings: object) -> int:
        config = part_config(RunServiceConfig, **settings)
        return RunSlots(config.max_concurrent_runs, config.slots_per_user()).per_user

    tokens = Path("/srv/tokens.json")
    assert share(tokens=tokens, max_concurrent_runs=4) == 3
    assert share(tokens=tokens, max_concurrent_runs=1) == 1
    assert share(max_concurrent_runs=4) == 4  # single-user
    assert share(tokens=tokens, max_running_per_user=2) == 2
