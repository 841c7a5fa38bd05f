"""`gateway.budget.ByteBudget`: the total and the per-key share hold, waiters are served in
order, a hold is given back once, and an item larger than the budget passes only alone."""

from __future__ import annotations

import asyncio

import pytest

from gateway.budget import ByteBudget

pytestmark = pytest.mark.fast


def test_try_take_refuses_past_the_total_and_past_a_share() -> None:
    budget = ByteBudget("test", total=100, per_key=60)
    a = budget.try_take(60, "ann")
    assert a is not None
    assert budget.try_take(1, "ann") is None  # ann's share is full
    b = budget.try_take(40, "bob")
    assert b is not None
    assert budget.try_take(1, "cy") is None  # the total is full
    assert budget.used == 100 and budget.refused == 2
    a.release()
    a.release()  # a second release gives nothing back twice
    assert budget.used == 40
    assert budget.try_take(60, "cy") is not None


def test_an_oversized_item_passes_only_when_nothing_else_is_held() -> None:
    budget = ByteBudget("test", total=100)
    small = budget.try_take(1)
    assert small is not None
    assert budget.try_take(500) is None
    small.release()
    big = budget.try_take(500)
    assert big is not None and budget.used == 500
    assert budget.try_take(1) is None
    big.release()
    assert budget.used == 0


def test_grow_takes_more_only_within_the_budget() -> None:
    budget = ByteBudget("test", total=100, per_key=50)
    hold = budget.try_take(10, "ann")
    other = budget.try_take(10, "ann")
    assert hold is not None and other is not None
    assert hold.grow(30)
    assert not hold.grow(1)  # ann's share
    assert hold.nbytes == 40 and budget.used == 50
    other.release()
    # all ann holds: like a first taking, it may pass her share (her one body progresses)
    assert hold.grow(20) and budget.held_by("ann") == 60
    bob = budget.try_take(30, "bob")
    assert bob is not None
    assert not hold.grow(20)  # the total, with bob's room taken
    bob.release()
    assert hold.grow(60)  # all the budget holds: it may pass the total too
    with hold:
        pass
    assert budget.used == 0 and budget.held_by("ann") == 0


def test_shrink_gives_back_what_is_no_longer_held() -> None:
    budget = ByteBudget("test", total=100, per_key=50)
    hold = budget.try_take(40, "ann")
    assert hold is not None
    hold.shrink_to(50)  # never grows
    assert hold.nbytes == 40 and budget.used == 40
    hold.shrink_to(15)
    assert hold.nbytes == 15 and budget.used == 15 and budget.held_by("ann") == 15
    hold.release()
    hold.shrink_to(0)  # released: nothing more given back
    assert budget.used == 0


def test_waiters_are_served_in_order_when_room_comes_back() -> None:
    async def scenario() -> list[str]:
        budget = ByteBudget("test", total=10)
        first = await budget.take(10)
        served: list[str] = []

        async def wait(name: str, nbytes: int) -> None:
            hold = await budget.take(nbytes)
            served.append(name)
            await asyncio.sleep(0)
            hold.release()

        tasks = [asyncio.create_task(wait(n, 6)) for n in ("one", "two", "three")]
        await asyncio.sleep(0.01)
        assert served == [] and budget.try_take(1) is None  # no barging past waiters
        first.release()
        await asyncio.gather(*tasks)
        assert budget.used == 0
        return served

    assert asyncio.run(scenario()) == ["one", "two", "three"]


def test_a_waiter_blocked_by_its_own_share_does_not_hold_back_others() -> None:
    async def scenario() -> None:
        budget = ByteBudget("test", total=100, per_key=10)
        ann = await budget.take(10, "ann")
        blocked = asyncio.create_task(budget.take(5, "ann"))
        await asyncio.sleep(0.01)
        bob = await asyncio.wait_for(budget.take(5, "bob"), 1)
        assert not blocked.done()
        ann.release()
        (await asyncio.wait_for(blocked, 1)).release()
        bob.release()
        assert budget.used == 0

    asyncio.run(scenario())


def test_a_waiter_that_times_out_takes_nothing() -> None:
    async def scenario() -> None:
        budget = ByteBudget("test", total=10)
        hold = await budget.take(10)
        with pytest.raises(TimeoutError):
            await budget.take(5, timeout=0.05)
        hold.release()
        assert budget.used == 0
        assert (await budget.take(10, timeout=0.05)).nbytes == 10

    asyncio.run(scenario())
