"""What the store knows of snapshots (issue 32, DESIGN decision 24, "Gone, elsewhere,
rebuilt"): a record says when its snapshot went and why; a gateway restarted says that
its snapshots went with it (410, never a run from nothing); a replica asked for another
replica's snapshot names that instance (409 snapshot_elsewhere) while it lives, and says
it is gone once it stopped; `rebuild: true` replays the chain's code instead
(`continued_by: "replay"`). Real forked kernels, the real store (SQLite; PostgreSQL for
two replicas)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.client import GatewayClient, SnapshotElsewhere
from gateway.models.record import RunRecord, SnapshotInfo
from gateway.runs.lineage import snapshot_name
from tests.conftest import start_gateway
from tests.support import (
    Client,
    GatewayThread,
    forget_snapshots,
    new_instance_id,
    serving,
    wait_for,
)


@pytest.fixture(scope="module")
def forked() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver"))


@pytest.fixture
def client(forked: GatewayThread) -> Iterator[Client]:
    yield forked.client()
    forget_snapshots(forked)


def post(client: Client, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = client.request("POST", "/v1/runs", body)
    return answer.status, answer.json()


def kept(client: Client, code: str, **more: Any) -> dict[str, Any]:
    status, record = post(client, {"code": code, "keep": True, **more})
    assert status == 200 and record["snapshot"] is not None, record
    return record


def snapshot_of(client: Client, run_id: str) -> dict[str, Any]:
    snapshot = client.request("GET", f"/v1/runs/{run_id}").json()["snapshot"]
    assert snapshot is not None
    return dict(snapshot)


def test_a_records_snapshot_says_when_and_why_it_went(client: Client) -> None:
    record = kept(client, "x = 1")
    snapshot = record["snapshot"]
    assert snapshot["gone"] is None and snapshot["cell"] is None
    assert snapshot["instance"]  # the gateway that holds it
    assert client.request("DELETE", f"/v1/snapshots/{snapshot['id']}").status == 204
    assert wait_for(lambda: snapshot_of(client, record["id"])["gone"] == "deleted", timeout=10)


def test_rebuild_replays_the_chain_of_a_snapshot_that_went(client: Client) -> None:
    first = kept(client, "x = 20\nprint('first ran')")
    second = kept(
        client,
        "y = x + 1\nraise ValueError('a failed step is replayed too')",
        **{"from": first["snapshot"]["id"]},
    )
    assert second["status"] == "failed" and second["continued_by"] == "fork"
    tip = second["snapshot"]["id"]
    # while it lives, `rebuild` changes nothing: the run is a fork
    status, forked = post(client, {"code": "print(x + y)", "from": tip, "rebuild": True})
    assert status == 200 and forked["stdout"] == "41\n" and forked["continued_by"] == "fork"
    for record in (second, first):
        client.request("DELETE", f"/v1/snapshots/{record['snapshot']['id']}")
    status, error = post(client, {"code": "print(x + y)", "from": tip})
    assert status == 410 and error["error"]["code"] == "snapshot_gone", error
    status, rebuilt = post(client, {"code": "print(x + y)", "from": tip, "rebuild": True})
    assert status == 200, rebuilt
    # the chain's own output is not the run's; its state is
    assert rebuilt["stdout"] == "41\n" and rebuilt["status"] == "succeeded", rebuilt
    assert rebuilt["continued_by"] == "replay" and rebuilt["continued_from"] == tip
    # a rebuilt run keeps a state of its own, and its chain is its source's and its own
    again = kept(client, "z = x + y", **{"from": tip, "rebuild": True})
    client.request("DELETE", f"/v1/snapshots/{again['snapshot']['id']}")
    status, deeper = post(
        client, {"code": "print(z)", "from": again["snapshot"]["id"], "rebuild": True}
    )
    assert status == 200 and deeper["stdout"] == "41\n", deeper


def test_what_rebuild_refuses(client: Client) -> None:
    status, error = post(client, {"code": "1", "rebuild": True})
    assert (status, error["error"]["field"]) == (400, "rebuild")
    unknown = snapshot_name("run_" + "0" * 20)
    status, error = post(client, {"code": "1", "from": unknown, "rebuild": True})
    assert (status, error["error"]["code"]) == (404, "not_found")
    python = kept(client, "x = 1")["snapshot"]["id"]
    client.request("DELETE", f"/v1/snapshots/{python}")
    body = {"code": "echo $x", "language": "bash", "from": python, "rebuild": True}
    status, error = post(client, body)
    assert (status, error["error"]["field"]) == (400, "language"), error
    # without rebuild a language whose kernels are not kept says so
    body = {"code": "console.log(1)", "language": "javascript", "from": python}
    status, error = post(client, body)
    assert (status, error["error"]["code"]) == (400, "snapshot_unsupported"), error


def test_a_restarted_gateway_says_its_snapshots_went(tmp_path: Path) -> None:
    settings = {"data_dir": tmp_path / "data", "instance_id": new_instance_id("forkserver")}
    first = start_gateway("forkserver", **settings)
    try:
        record = kept(first.client(), "x = 1")
    finally:
        first.stop()
    again = start_gateway("forkserver", **settings)
    try:
        client = again.client()
        status, error = post(client, {"code": "print(x)", "from": record["snapshot"]["id"]})
        assert (status, error["error"]["code"]) == (410, "snapshot_gone"), error
        assert "its gateway stopped" in error["error"]["message"]
        assert "its gateway stopped" in snapshot_of(client, record["id"])["gone"]
        # a gateway that died wrote nothing: its record is read as gone all the same
        services = again.gateway.services
        assert services is not None
        owner = again.call(services.runs.store.get(record["id"])).user
        crashed = RunRecord(id="run_" + "c" * 20, language="python", status="succeeded", user=owner)
        crashed.snapshot = SnapshotInfo(
            id=snapshot_name(crashed.id),
            expires_at="2026-12-06T00:00:00.000Z",
            bytes=1,
            instance=again.settings.instance_id or "",
        )
        again.call(services.runs.store.finish(crashed))
        assert "its gateway stopped" in snapshot_of(client, crashed.id)["gone"]
        status, error = post(client, {"code": "1", "from": crashed.snapshot.id})
        assert (status, error["error"]["code"]) == (410, "snapshot_gone"), error
        status, rebuilt = post(
            client, {"code": "print(x)", "from": record["snapshot"]["id"], "rebuild": True}
        )
        assert status == 200 and rebuilt["stdout"] == "1\n", rebuilt
    finally:
        again.stop()


def test_another_replicas_snapshot_is_elsewhere_until_it_stops(postgres_dsn: str) -> None:
    holder = start_gateway("forkserver", store=postgres_dsn)
    other = GatewayThread(backend="local", store=postgres_dsn).start()
    stopped = None
    try:
        record = kept(holder.client(), "x = 7")
        snapshot = record["snapshot"]["id"]
        instance = holder.settings.instance_id
        assert record["snapshot"]["instance"] == instance
        answer = other.client().request("POST", "/v1/runs", {"code": "x", "from": snapshot})
        assert answer.headers["X-Gateway-Instance"] == instance  # for a balancer to route on
        status, error = post(other.client(), {"code": "print(x)", "from": snapshot})
        assert status == 409, error
        assert error["error"] == {
            "code": "snapshot_elsewhere",
            "message": error["error"]["message"],
            "field": "from",
            "instance": instance,
        }
        with (
            GatewayClient(f"http://127.0.0.1:{other.port}") as typed,
            pytest.raises(SnapshotElsewhere) as raised,
        ):
            typed.run("print(x)", continue_from=snapshot)
        assert raised.value.instance == instance
        status, rebuilt = post(
            other.client(), {"code": "print(x)", "from": snapshot, "rebuild": True}
        )
        assert status == 200 and rebuilt["stdout"] == "7\n", rebuilt
        assert rebuilt["continued_by"] == "replay"
        # a replica that dies writes nothing: the store tells a live instance from a dead one
        services = other.gateway.services
        assert services is not None and instance is not None
        assert other.call(services.runs.store.instance_alive(instance))
        stopped = holder
        holder.stop()
        assert not other.call(services.runs.store.instance_alive(instance))
        status, error = post(other.client(), {"code": "print(x)", "from": snapshot})
        assert (status, error["error"]["code"]) == (410, "snapshot_gone"), error
        assert "stopped" in error["error"]["message"]
    finally:
        if stopped is not holder:
            holder.stop()
        other.stop()
