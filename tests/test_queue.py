"""Queued runs: they wait for a slot, can be cancelled while waiting, and never get stuck."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import api, census
from tests.support import Client, GatewayThread, serving, wait_for, wrote


@pytest.fixture
def one_slot() -> Iterator[GatewayThread]:
    yield from serving(
        GatewayThread(backend="local", max_concurrent_runs=1, max_queued_runs=4).start()
    )


def submit(client: Client, code: str) -> str:
    return api.submit(client, {"code": code})


def test_a_queued_run_waits_and_can_be_cancelled_before_it_starts(one_slot: GatewayThread) -> None:
    client = one_slot.client()
    first = submit(client, "import time\nopen('started', 'w').close()\ntime.sleep(120)")
    queued = submit(client, "print('never')")
    assert client.request("GET", f"/v1/runs/{queued}").json()["status"] == "queued"
    cancelled = client.request("DELETE", f"/v1/runs/{queued}").json()
    assert cancelled["status"] == "cancelled" and cancelled["stdout"] == ""
    assert any("before it started" in note for note in cancelled["notes"])
    assert client.request("GET", f"/v1/runs/{first}").json()["status"] == "running"
    # the first run's code runs (not its kernel's start) when it is cancelled, and its kernel
    # ends with it: no sandbox of a run is left long before the code's 120 s are up
    assert wait_for(lambda: wrote(one_slot, "started"), timeout=60)
    ended = client.request("DELETE", f"/v1/runs/{first}").json()
    assert (ended["status"], ended["kill_reason"]) == ("cancelled", "cancelled"), ended
    assert census.after_teardown(timeout=60) == []
    assert client.run(code="print('slot free')")["stdout"] == "slot free\n"


def test_cancel_right_after_submit_never_leaves_a_run_stuck(one_slot: GatewayThread) -> None:
    client = one_slot.client()
    for _ in range(5):  # the cancel lands while queued, creating the sandbox, or running
        run_id = submit(client, "import time; time.sleep(60)")  # it cannot finish on its own
        record = client.request("DELETE", f"/v1/runs/{run_id}").json()
        assert (record["status"], record["kill_reason"]) == ("cancelled", "cancelled"), record
    assert wait_for(one_slot.idle, timeout=30)
    health = client.request("GET", "/v1/health").json()
    assert health["kernels"]["running"] == 0


def gauges(client: Client) -> tuple[float, float, int]:
    text = client.request("GET", "/metrics").body.decode()
    values = dict(
        line.split(" ", 1)
        for line in text.splitlines()
        if line.startswith("gateway_") and "{" not in line
    )
    health = client.request("GET", "/v1/health").json()
    return (
        float(values["gateway_runs_running"]),
        float(values["gateway_queue_length"]),
        health["kernels"]["running"],
    )


def test_the_gauges_count_a_running_and_a_queued_run(one_slot: GatewayThread) -> None:
    client = one_slot.client()
    assert gauges(client) == (0, 0, 0)
    first = submit(client, "import time\nopen('started', 'w').close()\ntime.sleep(120)")
    api.poll_run(client, first, until=lambda r: r["status"] == "running")
    assert wait_for(lambda: wrote(one_slot, "started"), timeout=60)  # its kernel runs the code
    queued = submit(client, "print('waits')")
    assert client.request("GET", f"/v1/runs/{queued}").json()["status"] == "queued"
    assert gauges(client) == (1, 1, 1)  # running, queue length; health's running kernels
    second_queued = submit(client, "print('waits too')")
    assert gauges(client) == (1, 2, 1)
    ids = (second_queued, queued, first)
    records = [client.request("DELETE", f"/v1/runs/{run_id}").json() for run_id in ids]
    assert [(r["status"], r["kill_reason"]) for r in records] == [("cancelled", "cancelled")] * 3
    assert census.after_teardown(timeout=60) == []  # the running one's kernel ended too
    assert gauges(client) == (0, 0, 0)
