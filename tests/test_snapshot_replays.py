"""Snapshots of notebook replays (issue 32): a replay keeps its final state (`keep: true`),
or the state after each code cell (`keep: "cells"`: each cell after the first runs in a
continuation of the state before it), and starts from a snapshot (`from`); and the
gateway's memory for everyone's snapshots together is bounded. Real forked kernels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, forget_snapshots, serving, wait_for

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


@pytest.fixture(scope="module")
def forked() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver", snapshots_per_user=20))


@pytest.fixture
def client(forked: GatewayThread) -> Iterator[Client]:
    yield forked.client()
    forget_snapshots(forked)


def code(source: str) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "metadata": {},
        "source": source,
        "outputs": [],
        "execution_count": None,
    }


def notebook(*cells: dict[str, Any]) -> dict[str, Any]:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": list(cells)}


MARKDOWN = {"cell_type": "markdown", "metadata": {}, "source": "# steps"}
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def replay(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.request("POST", "/v1/notebooks/run", body)
    assert answer.status == 200, answer.body[:500]
    return dict(answer.json()["run"])


def printed(client: Client, snapshot: str, source: str) -> str:
    answer = client.request("POST", "/v1/runs", {"code": source, "from": snapshot})
    assert answer.status == 200, answer.body[:500]
    return str(answer.json()["stdout"])


def test_keep_cells_keeps_the_state_after_each_code_cell(client: Client) -> None:
    cells = [
        MARKDOWN,
        code("x = 1\n" + SPIN),
        code("x += 1\n" + SPIN),
        code(""),
        code("x += 10\nprint(x)"),
    ]
    record = replay(client, {"notebook": notebook(*cells), "keep": "cells"})
    assert record["status"] == "succeeded", record
    kept = record["snapshots"]
    # one per code cell that ran (the empty one does not run), at its place in `cells`
    assert [s["cell"] for s in kept] == [1, 2, 4]
    assert record["snapshot"] == kept[-1]
    assert [printed(client, s["id"], "print(x)") for s in kept] == ["1\n", "2\n", "12\n"]
    # the run's CPU is every cell's, whichever kernel ran it (two cells spun 0.4 s each)
    assert record["usage"]["cpu_ms"] >= 750, record["usage"]
    assert record["stdout"] == "12\n"
    # the last cell's state is also the final one: once it went, both places say so
    assert client.request("DELETE", f"/v1/snapshots/{kept[-1]['id']}").status == 204

    def stored() -> dict[str, Any]:
        return dict(client.request("GET", f"/v1/runs/{record['id']}").json())

    assert wait_for(lambda: stored()["snapshot"]["gone"] == "deleted", timeout=10)
    assert stored()["snapshots"][-1]["gone"] == "deleted"


def test_a_failed_cell_stops_the_cells_kept_after_it(client: Client) -> None:
    cells = [code("x = 1"), code("raise ValueError('no')"), code("x = 3")]
    record = replay(client, {"notebook": notebook(*cells), "keep": "cells"})
    assert record["status"] == "failed"
    assert [s["cell"] for s in record["snapshots"]] == [0, 1]
    assert printed(client, record["snapshot"]["id"], "print(x)") == "1\n"


def test_a_replay_starts_from_a_snapshot_and_keeps_its_own(client: Client) -> None:
    first = replay(client, {"notebook": notebook(code("import math\nr = 2")), "keep": True})
    assert first["snapshots"] == [] and first["snapshot"]["cell"] is None
    body = {
        "notebook": notebook(code("area = math.pi * r * r\nprint(round(area, 2))")),
        "from": first["snapshot"]["id"],
        "keep": True,
    }
    second = replay(client, body)
    assert second["stdout"] == "12.57\n" and second["continued_by"] == "fork", second
    assert printed(client, second["snapshot"]["id"], "print(r, round(area))") == "2 13\n"
    # rebuilt: a replay's chain is its cells that ran, up to the state asked for
    for record in (second, first):
        client.request("DELETE", f"/v1/snapshots/{record['snapshot']['id']}")
    answer = client.request(
        "POST",
        "/v1/runs",
        {"code": "print(round(area), r)", "from": second["snapshot"]["id"], "rebuild": True},
    )
    assert answer.json()["stdout"] == "13 2\n", answer.json()


def test_what_a_replay_with_snapshots_refuses(client: Client) -> None:
    body = {"notebook": notebook(code("1")), "keep": True, "network": True}
    answer = client.request("POST", "/v1/notebooks/run", body)
    assert answer.status == 400 and answer.json()["error"]["code"] == "conflicting_fields"
    body = {"notebook": notebook(code("1")), "keep": "every"}
    assert client.request("POST", "/v1/notebooks/run", body).status == 400
    body = {"notebook": notebook(code("console.log(1)")), "keep": "cells"}
    body["notebook"]["metadata"] = {
        "kernelspec": {"name": "deno", "language": "typescript", "display_name": "Deno"}
    }
    answer = client.request("POST", "/v1/notebooks/run", body)
    assert answer.status == 400 and answer.json()["error"]["code"] == "snapshot_unsupported"


@pytest.mark.attack
def test_everyones_snapshots_together_stay_within_the_gateways_memory() -> None:
    """A snapshot fill: users each within their own limits cannot together take more than
    the operator's `snapshot_bytes_total`; past it nothing more is kept, and nobody's
    snapshot goes for another's."""
    users = {ALICE: ("alice", "user"), BOB: ("bob", "user")}
    # one kept python kernel holds about 23 MB of its own: two fit, three do not
    server = start_gateway("forkserver", users=users, snapshot_bytes_total=60 << 20)
    try:
        alice, bob = server.client(ALICE), server.client(BOB)
        ids = []
        for client in (alice, bob):
            record = client.run(code="x = 1", keep=True)
            assert record["snapshot"] is not None, record["notes"]
            ids.append((client, record["snapshot"]["id"]))
        refused = bob.run(code="x = 2", keep=True)
        assert refused["status"] == "succeeded" and refused["snapshot"] is None
        assert any("memory for snapshots" in n for n in refused["notes"]), refused["notes"]
        for client, snapshot in ids:  # nobody's went for it
            assert printed(client, snapshot, "print(x)") == "1\n"
        services = server.gateway.services
        assert services is not None
        kept = services.runs.snapshots.owned("alice") + services.runs.snapshots.owned("bob")
        assert sum(s.bytes for s in kept) <= 60 << 20
    finally:
        server.stop()


def test_a_user_holds_no_more_memory_than_their_limit_after_a_chain() -> None:
    """A snapshot evicted while a continuation still lives inside it keeps its memory until
    that ends: it counts against its owner's bytes, so a chain of cells cannot hold more
    than `snapshot_bytes_per_user` once its run is over (and nothing held is evicted for
    bytes: that would free none)."""
    server = start_gateway("forkserver", snapshot_bytes_per_user=50 << 20)
    try:
        cells = [code(f"x{i} = {i}") for i in range(4)]
        record = replay(server.client(), {"notebook": notebook(*cells), "keep": "cells"})
        assert record["status"] == "succeeded", record
        assert any("snapshot limits" in note for note in record["notes"]), record["notes"]
        services = server.gateway.services
        assert services is not None
        held = list(services.runs.snapshots._kept.values())
        assert [s.cell for s in held] == [0, 1], [(s.cell, s.bytes) for s in held]
        assert sum(s.bytes for s in held) <= 50 << 20
    finally:
        server.stop()


def test_a_record_says_which_of_its_cells_states_went_during_its_run() -> None:
    """The states a replay keeps are in its record before the store has that record: one
    evicted during the run (its owner's count) is said gone in the answer and stored."""
    server = start_gateway("forkserver", snapshots_per_user=2)
    try:
        client = server.client()
        cells = [code(f"x{i} = {i}") for i in range(4)]
        record = replay(client, {"notebook": notebook(*cells), "keep": "cells"})
        states = record["snapshots"]
        assert [s["cell"] for s in states] == [0, 1, 2, 3], states
        assert [bool(s["gone"]) for s in states] == [True, True, False, False], states
        assert all("evicted" in s["gone"] for s in states[:2])
        stored = client.request("GET", f"/v1/runs/{record['id']}").json()["snapshots"]
        assert [s["gone"] for s in stored] == [s["gone"] for s in states]
    finally:
        server.stop()
