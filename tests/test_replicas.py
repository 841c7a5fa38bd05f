"""Two gateway replicas on one PostgreSQL, each a real `gateway serve` process (local
backend, short leases): any replica answers for any run, a cancel reaches the replica that
runs it, the per-user limit holds across both, and a replica killed with SIGKILL has its
runs failed by the other once its lease runs out."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import census
from tests.postgres import Server
from tests.support import Client, GatewayProcess, GatewayThread, wait_for, write_tokens
from tests.ws_client import open_stream, receive

LEASE = 2.0  # seconds: a dead replica's runs are failed a few seconds after it died
SLEEP = {"code": "import time; time.sleep(600)", "background": True}
BG = {"background": True}


class Pair:
    def __init__(self, dsn: str, root: Path, **settings: Any) -> None:
        self.processes: list[GatewayProcess] = []
        for name in ("a", "b"):
            data = root / name
            data.mkdir()
            self.processes.append(
                GatewayProcess("local", data, store=dsn, **{"lease_seconds": LEASE, **settings})
            )

    @property
    def a(self) -> GatewayProcess:
        return self.processes[0]

    @property
    def b(self) -> GatewayProcess:
        return self.processes[1]

    def start(self) -> Pair:
        for process in self.processes:
            process.start()
        return self

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


@pytest.fixture
def pair(postgres_dsn: str, tmp_path: Path) -> Iterator[Pair]:
    replicas = Pair(postgres_dsn, tmp_path, max_runs_per_user=2, allow_uploads=True)
    try:
        yield replicas.start()
    finally:
        replicas.stop()


def status_of(client: Client, run_id: str) -> str:
    return str(client.request("GET", f"/v1/runs/{run_id}").json()["status"])


def submit(client: Client, body: dict[str, Any] = SLEEP) -> str:
    answer = client.request("POST", "/v1/runs", body)
    assert answer.status == 202, answer.body[:500]
    return str(answer.json()["id"])


def test_submit_on_one_replica_poll_and_cancel_on_the_other(pair: Pair) -> None:
    a, b = pair.a.client, pair.b.client
    quick = submit(a, {"code": "result = 6 * 7", "background": True})
    assert wait_for(lambda: status_of(b, quick) == "succeeded", timeout=60)
    assert b.request("GET", f"/v1/runs/{quick}").json()["result"] == 42
    notebook = b.request("GET", f"/v1/runs/{quick}/notebook")
    assert notebook.status == 200 and notebook.json()["nbformat"] == 4

    slow = submit(a)
    assert wait_for(lambda: status_of(b, slow) == "running", timeout=60)
    cancelled = b.request("DELETE", f"/v1/runs/{slow}")
    assert cancelled.status == 200
    record = cancelled.json()
    assert record["status"] == "cancelled", record
    # acknowledged in the record: the replica that ran it says who asked
    assert f"Cancelled through gateway replica {pair.b.instance}." in record["notes"]
    assert a.request("GET", f"/v1/runs/{slow}").json()["status"] == "cancelled"
    assert b.request("GET", "/v1/runs/run_0123456789abcdef0123456789abcdef").status == 404


def test_the_per_user_limit_holds_across_replicas(pair: Pair) -> None:
    a, b = pair.a.client, pair.b.client
    first, second = submit(a), submit(b)  # the limit is 2, whichever replica admits
    for client in (a, b):
        refused = client.request("POST", "/v1/runs", SLEEP)
        assert refused.status == 429, refused.body[:500]
        assert "You already have 2 runs in progress" in refused.json()["error"]["message"]
        assert refused.headers["Retry-After"]
    assert b.request("DELETE", f"/v1/runs/{first}").json()["status"] == "cancelled"
    third = submit(b)  # a place came free
    for run_id in (second, third):
        assert a.request("DELETE", f"/v1/runs/{run_id}").json()["status"] == "cancelled"


def test_a_replica_killed_mid_run_has_its_runs_failed_by_the_other(pair: Pair) -> None:
    a, b = pair.a.client, pair.b.client
    run_id = submit(a)
    assert wait_for(lambda: status_of(b, run_id) == "running", timeout=60)
    assert wait_for(census.sandboxes_exist, timeout=60)
    pair.a.signal(signal.SIGKILL)
    # no replica renews A's lease any more: B fails the run (its heartbeat is a third of it)
    assert wait_for(lambda: status_of(b, run_id) == "failed", timeout=10 * LEASE)
    record = b.request("GET", f"/v1/runs/{run_id}").json()
    assert record["exit_code"] is None
    assert any(pair.a.instance in note and "lease" in note for note in record["notes"])
    # A's replacement on that machine removes what A left behind, as a restart always did
    pair.a.start()
    assert wait_for(lambda: census.census() == [], timeout=30), census.census()
    assert status_of(pair.a.client, run_id) == "failed"


def test_an_upload_made_on_one_replica_is_used_by_a_run_on_the_other(pair: Pair) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("main.py", "print(open('data.txt').read())")
        archive.writestr("data.txt", "from replica a")
    answer = pair.a.client.request(
        "POST", "/v1/uploads", raw=buffer.getvalue(), headers={"Content-Type": "application/zip"}
    )
    assert answer.status == 201, answer.body[:500]
    record = pair.b.client.run(archive=answer.json()["id"], entrypoint="main.py")
    assert (record["status"], record["stdout"]) == ("succeeded", "from replica a\n"), record


def test_health_reports_the_store_and_readiness_fails_without_it(
    postgres_server: Server,
) -> None:
    """The store's database gone: /v1/health answers 503 `store_unavailable` (a load
    balancer stops sending work here) and a new run is a 503 `store_unavailable`, not a 500;
    the gateway still stops cleanly."""
    with postgres_server.database() as dsn:
        server = GatewayThread(backend="local", store=dsn, lease_seconds=LEASE).start()
        try:
            client = server.client()
            health = client.request("GET", "/v1/health")
            assert health.status == 200
            assert health.json()["store"] == {"kind": "postgresql", "ok": True}
            with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE {dsn.rsplit('/', 1)[1]} WITH (FORCE)")
            health = client.request("GET", "/v1/health")
            assert health.status == 503
            body = health.json()
            assert body["status"] == "store_unavailable" and body["store"]["ok"] is False
            refused = client.request("POST", "/v1/runs", {"code": "print(1)"})
            assert refused.status == 503, refused.body[:500]
            assert refused.json()["error"]["code"] == "store_unavailable"
            assert refused.headers["Retry-After"]
        finally:
            server.stop()


def test_health_reports_the_shared_gateways_store(local_client: Client) -> None:
    """SQLite by default; PostgreSQL under GATEWAY_TEST_STORE=postgres (conftest.py)."""
    kind = "postgresql" if os.environ.get("GATEWAY_TEST_STORE") == "postgres" else "sqlite"
    health = local_client.request("GET", "/v1/health")
    assert health.status == 200 and health.json()["store"] == {"kind": kind, "ok": True}


def test_the_store_restarted_under_load_loses_no_record(
    postgres_server: Server, postgres_dsn: str, tmp_path: Path
) -> None:
    """PostgreSQL stops while runs are in flight on both replicas and starts again once a
    run ended meanwhile: every run ends with its result stored (a final record the store
    cannot take yet is tried again; with no retry the test fails: a run stays "running"), the
    gateways reconnect, and new runs work on both. (A lease longer than the restart: a
    store down for longer than the lease fails the runs, as a dead replica's would be.)"""
    pair = Pair(postgres_dsn, tmp_path, lease_seconds=60.0)
    pair.start()
    try:
        runs = {}
        for i in range(4):
            client = (pair.a if i % 2 else pair.b).client
            body = {"code": f"import time; time.sleep({1 + i * 0.7}); result = {i}"}
            runs[submit(client, {**body, "background": True})] = i
        assert wait_for(
            lambda: all(status_of(pair.a.client, r) == "running" for r in runs), timeout=60
        )
        postgres_server.pause()
        try:  # until a run that ended could not store its record
            assert wait_for(
                lambda: any("cannot take its record yet" in p.log() for p in pair.processes),
                timeout=30,
            )
        finally:
            postgres_server.resume()

        def final(client: Client, run_id: str) -> dict[str, Any] | None:
            answer = client.request("GET", f"/v1/runs/{run_id}")
            if answer.status != 200 or answer.json()["status"] in ("queued", "running"):
                return None
            record: dict[str, Any] = answer.json()
            return record

        for run_id, i in runs.items():
            # the owner has the final record first (it holds it until the store takes it)
            for process in pair.processes:
                assert wait_for(lambda r=run_id, c=process.client: final(c, r), timeout=60)
            record = final(pair.a.client, run_id)
            assert record is not None and (record["status"], record["result"]) == (
                "succeeded",
                i,
            ), record
        for process in pair.processes:
            assert process.client.run(code="result = 'after'")["result"] == "after"
            assert process.client.request("GET", "/v1/health").status == 200
    finally:
        pair.stop()


def test_users_see_only_their_own_runs_on_every_replica(postgres_dsn: str, tmp_path: Path) -> None:
    tokens = write_tokens(
        tmp_path / "tokens",
        {"tok-ann-0123456789abcdef": ("ann", "user"), "tok-bob-0123456789abcdef": ("bob", "user")},
    )
    pair = Pair(postgres_dsn, tmp_path, tokens=tokens, allow_local_multi_user=True)
    pair.start()
    try:
        ann_a = Client(pair.a.port, "tok-ann-0123456789abcdef")
        ann_b, bob_b = (
            Client(pair.b.port, "tok-ann-0123456789abcdef"),
            Client(pair.b.port, "tok-bob-0123456789abcdef"),
        )
        run_id = submit(ann_a)
        assert wait_for(lambda: status_of(ann_b, run_id) == "running", timeout=60)
        for method in ("GET", "DELETE"):
            assert bob_b.request(method, f"/v1/runs/{run_id}").status == 404
        assert bob_b.request("GET", f"/v1/runs/{run_id}/notebook").status == 404
        assert status_of(ann_b, run_id) == "running"  # bob's DELETE cancelled nothing
        assert ann_b.request("DELETE", f"/v1/runs/{run_id}").json()["status"] == "cancelled"
    finally:
        pair.stop()


def test_a_store_outage_longer_than_the_lease_fails_no_live_run(
    postgres_server: Server, postgres_dsn: str, tmp_path: Path
) -> None:
    """After an outage every lease looks expired, the owner's own too. A run that ended
    during the outage keeps its result (its owner holds it, renewing its lease, until the
    store takes the record), and a run still going is not failed by the other replica: it
    waits a whole lease of reaching the store before failing anyone's runs, time the owner
    uses to renew. Before: the finished run's result was replaced by "failed ... result is
    lost", and the live run was killed (an attacker's review, 1 time in 4)."""
    pair = Pair(postgres_dsn, tmp_path, lease_seconds=3.0)
    pair.start()
    try:
        short = submit(pair.a.client, {"code": "import time; time.sleep(2); result = 's'", **BG})
        long = submit(pair.a.client, {"code": "import time; time.sleep(20); result = 'l'", **BG})
        assert wait_for(lambda: status_of(pair.b.client, short) == "running", timeout=60)
        postgres_server.pause()
        try:
            assert wait_for(lambda: "cannot take its record yet" in pair.a.log(), timeout=30)
            time.sleep(8)  # an outage of a few leases (a failover)
        finally:
            postgres_server.resume()

        def final(run_id: str) -> dict[str, Any] | None:
            answer = pair.b.client.request("GET", f"/v1/runs/{run_id}")
            if answer.status != 200 or answer.json()["status"] in ("queued", "running"):
                return None
            record: dict[str, Any] = answer.json()
            return record

        for run_id, result in ((short, "s"), (long, "l")):
            assert wait_for(lambda r=run_id: final(r) is not None, timeout=90)
            record = final(run_id)
            assert record is not None
            assert (record["status"], record["result"]) == ("succeeded", result), record
    finally:
        pair.stop()


def test_health_answers_within_its_timeout_when_the_store_hangs(
    postgres_server: Server, postgres_dsn: str
) -> None:
    """A store that accepts connections and answers nothing (stopped, or a network that
    drops packets): readiness says so within its 3 s, and a probe after it too (it does not
    pile up pings). Before: 13 s, the driver's own cancel of the ping awaited."""
    server = GatewayThread(backend="local", store=postgres_dsn).start()
    try:
        assert server.client().request("GET", "/v1/health").status == 200
        with postgres_server.frozen():
            for _ in range(2):
                started = time.monotonic()
                health = server.client().request("GET", "/v1/health", timeout=30)
                assert health.status == 503 and health.json()["store"]["ok"] is False
                assert time.monotonic() - started < 8, "health waited for the driver"
        assert wait_for(
            lambda: server.client().request("GET", "/v1/health").status == 200, timeout=60
        )
    finally:
        server.stop()


def test_a_cancel_naming_no_possible_run_id_is_not_found(postgres_dsn: str) -> None:
    """A WebSocket `cancel` takes any string as `id`, where a URL allows only run ids: a NUL
    reached PostgreSQL's query and came back as an `internal` error. Now an id no run can
    have is not_found before any store is asked."""
    server = GatewayThread(backend="local", store=postgres_dsn).start()

    async def cancel() -> dict[str, Any]:
        async with open_stream(server.port) as ws:
            await ws.write_message(json.dumps({"type": "cancel", "id": "run_\u0000x"}))
            return await receive(ws)

    try:
        event = asyncio.run(cancel())
        assert event["type"] == "error" and event["error"]["code"] == "not_found", event
    finally:
        server.stop()
