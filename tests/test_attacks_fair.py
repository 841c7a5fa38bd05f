"""Issue 20, row 10: one user's runs never keep another user's run waiting for a run slot.

The attack: a user starts as many background runs as the per-user limit allows (8, above
the gateway's 4 slots), each of which cannot end on its own; another user's `print(1)` then
waited for the first of them to end. API.md promises a share per user (`max_running_per_user`,
by default one slot fewer than `max_concurrent_runs`) and fair order: a free slot goes to
the waiting run of the user who holds the fewest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import api
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, serving, wait_for, write_tokens

pytestmark = [pytest.mark.attack, pytest.mark.serial]  # times answers, measures memory

ANN, BOB = "ann-token-0123456789", "bob-token-0123456789"
FOREVER = {"code": "import time; time.sleep(3600)", "timeout": 300}  # outlives the test
UNFINISHED = ("queued", "running")


def two_users(tmp_path: Path, **settings: object) -> GatewayThread:
    tokens = write_tokens(tmp_path, {ANN: ("ann", "user"), BOB: ("bob", "user")})
    return start_gateway("local", tokens=tokens, pool_bash=0, pool_deno=0, **settings)


def statuses(client: Client, run_ids: list[str]) -> list[str]:
    return [client.request("GET", f"/v1/runs/{r}").json()["status"] for r in run_ids]


def cancel(client: Client, run_ids: list[str]) -> None:
    for run_id in run_ids:
        record = client.request("DELETE", f"/v1/runs/{run_id}").json()
        assert record["status"] == "cancelled", record


def cancel_all(server: GatewayThread, client: Client, run_ids: list[str]) -> None:
    cancel(client, run_ids)
    assert wait_for(server.idle, timeout=60)


@pytest.fixture
def defaults(tmp_path: Path) -> Iterator[GatewayThread]:
    """The default slots (4) and per-user limit (8): the attack as it was reported."""
    yield from serving(two_users(tmp_path))


def test_a_user_at_the_per_user_limit_leaves_a_slot_for_another(defaults: GatewayThread) -> None:
    ann, bob = defaults.client(ANN), defaults.client(BOB)
    settings = defaults.settings
    assert (settings.max_concurrent_runs, settings.max_runs_per_user) == (4, 8)
    share = settings.max_concurrent_runs - 1  # API.md: max_running_per_user's default
    mine = [api.submit(ann, FOREVER) for _ in range(settings.max_runs_per_user)]
    try:
        # ann's runs take every slot they may: her share (or, before the fix, all four)
        assert wait_for(lambda: statuses(ann, mine).count("running") >= share, timeout=60)
        theirs = api.submit(bob, {"code": "print(1)"})
        record = api.poll_run(bob, theirs, timeout=60)
        assert (record["status"], record["stdout"]) == ("succeeded", "1\n"), record
        now = statuses(ann, mine)
        assert all(status in UNFINISHED for status in now), now  # none of hers ended
        assert now.count("running") == share, now  # never more than her share
    finally:
        cancel_all(defaults, ann, mine)


@pytest.fixture
def two_slots(tmp_path: Path) -> Iterator[GatewayThread]:
    """Two slots, and a share as large: the order alone decides who gets a free slot."""
    yield from serving(two_users(tmp_path, max_concurrent_runs=2, max_running_per_user=2))


def test_a_free_slot_goes_to_the_user_running_fewest(two_slots: GatewayThread) -> None:
    ann, bob = two_slots.client(ANN), two_slots.client(BOB)
    running = [api.submit(ann, FOREVER) for _ in range(2)]
    queued: list[str] = []
    try:
        for run_id in running:
            api.poll_run(ann, run_id, until=lambda r: r["status"] == "running")
        queued = [api.submit(ann, FOREVER) for _ in range(2)]  # waiting first
        theirs = api.submit(bob, {"code": "print(1)"})  # waiting last
        assert statuses(ann, queued) == ["queued", "queued"]
        assert statuses(bob, [theirs]) == ["queued"]
        cancel(ann, running[:1])  # one slot frees: bob holds none, ann one
        record = api.poll_run(bob, theirs, timeout=60)
        assert (record["status"], record["stdout"]) == ("succeeded", "1\n"), record
        # then ann's waiting runs in their own order
        api.poll_run(ann, queued[0], until=lambda r: r["status"] == "running")
        assert statuses(ann, queued[1:]) == ["queued"]
    finally:
        cancel_all(two_slots, ann, running[1:] + queued)
