"""Queued runs: they wait for a slot, can be cancelled while waiting, and never get stuck."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Client, GatewayThread, wait_for


@pytest.fixture
def one_slot() -> Iterator[GatewayThread]:
    server = GatewayThread(backend="local", max_concurrent_runs=1, max_queued_runs=4).start()
    try:
        yield server
    finally:
        server.stop()


def submit(client: Client, code: str) -> str:
    response = client.request("POST", "/v1/runs", {"code": code, "background": True})
    assert response.status == 202
    return str(response.json()["id"])


def test_a_queued_run_waits_and_can_be_cancelled_before_it_starts(one_slot: GatewayThread) -> None:
    client = one_slot.client()
    first = submit(client, "import time; time.sleep(30)")
    queued = submit(client, "print('never')")
    assert client.request("GET", f"/v1/runs/{queued}").json()["status"] == "queued"
    cancelled = client.request("DELETE", f"/v1/runs/{queued}").json()
    assert cancelled["status"] == "cancelled" and cancelled["stdout"] == ""
    assert any("before it started" in note for note in cancelled["notes"])
    assert client.request("GET", f"/v1/runs/{first}").json()["status"] == "running"
    client.request("DELETE", f"/v1/runs/{first}")
    assert wait_for(one_slot.idle, timeout=30)
    assert client.run(code="print('slot free')")["stdout"] == "slot free\n"


def test_cancel_right_after_submit_never_leaves_a_run_stuck(one_slot: GatewayThread) -> None:
    client = one_slot.client()
    for _ in range(5):
        run_id = submit(client, "print(1)")
        record = client.request("DELETE", f"/v1/runs/{run_id}").json()
        assert record["status"] in ("cancelled", "succeeded")
    assert wait_for(one_slot.idle, timeout=30)
    health = client.request("GET", "/v1/health").json()
    assert health["kernels"]["running"] == 0
