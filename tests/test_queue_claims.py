"""Work goes where there is room (DESIGN.md decision 27): a background run that finds every
slot of its replica busy waits in the PostgreSQL store's queue, and the first replica with a
free slot takes it (`gateway/runs/claims.py`).

The store's own promises first, fast (no kernel): each queued run is claimed once however
many replicas claim at once; a claim keeps to the per-user share of the claimer's slots,
the user holding fewest first; a queued run is not a lease to fail, nor a leftover of its
replica; a cancel takes it out of the queue. Then two real `gateway serve` processes
(local backend, short leases): an idle replica runs a busy one's queued runs, many queued
runs over two claiming replicas each run exactly once (every run appends its id to one
file), a replica killed with SIGKILL loses none of what it queued, and a run queued on one
replica is cancelled from either, claimed or not."""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import dataclasses
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.execution.program import from_run
from gateway.models.request import RunRequest, StagedFile
from gateway.runs.carried import VERSION, NotCarried, carried, carry, unpack
from gateway.store.base import QueueFull, RecordStore
from gateway.store.postgres import PostgresStore
from tests import census
from tests.support import Client, GatewayProcess, wait_for
from tests.test_store import record
from tests.test_store import run as store_run
from tests.ws_client import open_stream, receive

LEASE = 2.0  # seconds: a dead replica's running runs are failed a few seconds after it died
LONG = "import time; time.sleep(600)"


# --- the store's queue ------------------------------------------------------------------


@pytest.mark.fast
def test_each_queued_run_is_claimed_once_by_replicas_claiming_at_once(postgres_dsn: str) -> None:
    """60 queued runs, 3 replicas each claiming with 4 claims at a time until the queue is
    empty: every run is claimed exactly once, by the replica whose lease it then has."""

    async def main(*stores: PostgresStore) -> None:
        ids = [f"run_{i:03d}" for i in range(60)]
        for i, run_id in enumerate(ids):
            assert await stores[i % 3].enqueue(record(run_id), 100, f"request {i}", 100) is None
        claimed: list[tuple[str, str, str]] = []

        async def claimer(store: PostgresStore) -> None:
            while (got := await store.claim({}, 1)) is not None:
                claimed.append((got.record.id, got.request, store.replica))

        await asyncio.gather(*(claimer(store) for store in stores for _ in range(4)))
        counts = collections.Counter(run_id for run_id, _, _ in claimed)
        assert sorted(counts) == ids and set(counts.values()) == {1}, counts
        assert all(request == f"request {int(i[4:])}" for i, request, _ in claimed)
        for run_id, _, replica in claimed:
            owner = {s.replica: s for s in stores}[replica]
            assert not (await owner.renew([run_id])).lost  # its lease is the claimer's
        assert [await s.queued_from() for s in stores] == [0, 0, 0]

    store_run(main, *(PostgresStore(postgres_dsn, name, pool_size=6) for name in "abc"))


@pytest.mark.fast
def test_a_claim_keeps_to_the_users_share_and_takes_the_user_holding_fewest(
    postgres_dsn: str,
) -> None:
    async def main(a: PostgresStore, b: PostgresStore) -> None:
        for run_id, user in (("run_1", "ann"), ("run_2", "ann"), ("run_3", "bob")):
            assert await a.enqueue(record(run_id, user), 10, run_id, 10) is None
        # ann holds 1 of b's slots, bob none: bob's run first, though ann's are older
        first = await b.claim({"ann": 1}, share=2)
        assert first is not None and first.record.id == "run_3"
        # ann holds her whole share of b's slots: nothing of hers is taken
        assert await b.claim({"ann": 2}, share=2) is None
        second = await b.claim({"ann": 1}, share=2)
        assert second is not None and (second.record.id, second.origin) == ("run_1", "a")

    store_run(main, PostgresStore(postgres_dsn, "a"), PostgresStore(postgres_dsn, "b"))


@pytest.mark.fast
def test_a_queued_run_counts_against_limits_and_is_no_lease_to_fail(postgres_dsn: str) -> None:
    async def main(a: PostgresStore, b: PostgresStore) -> None:
        assert await a.enqueue(record("run_1"), 2, "r1", 5) is None
        assert await a.admit(record("run_2"), 2) is None
        assert await b.enqueue(record("run_3"), 2, "r3", 5) == 2  # ann's limit, fleet-wide
        assert await a.enqueue(record("run_4", "bob"), 9, "r4", 2) is None
        with pytest.raises(QueueFull):  # a's share of the queue: 2
            await a.enqueue(record("run_5", "cid"), 9, "r5", 2)
        assert await b.enqueue(record("run_5", "cid"), 9, "r5", 2) is None  # b's is its own
        await asyncio.sleep(LEASE / 2 + 0.2)  # a's lease of 1 s on run_2 ran out
        assert await b.fail_expired("{replica} died") == 1  # run_2 only
        assert await a.recover("left over") == 0  # a queued run is no leftover of a
        for run_id in ("run_1", "run_4", "run_5"):
            queued = await b.get(run_id)
            assert queued is not None and queued.status == "queued"
        # a cancel takes it out of the queue, from any replica, once
        cancelled = await b.unqueue("run_1", "through b")
        assert cancelled is not None and cancelled.status == "cancelled"
        assert cancelled.notes[-1] == "through b"
        assert await a.unqueue("run_1", "again") is None
        stored = await a.get("run_1")
        assert stored is not None and stored.status == "cancelled"
        claimed = [await b.claim({}, 5), await b.claim({}, 5), await b.claim({}, 5)]
        assert sorted(c.record.id for c in claimed if c is not None) == ["run_4", "run_5"]
        assert await b.unqueue("run_4", "late") is None  # claimed: b's now, to cancel as such

    store_run(main, PostgresStore(postgres_dsn, "a", lease=1.0), PostgresStore(postgres_dsn, "b"))


@pytest.mark.fast
def test_a_replica_claims_only_the_request_forms_it_reads(postgres_dsn: str) -> None:
    """A run queued in a newer form (a newer replica's, mid rolling update) is left to the
    replicas that read it; the older forms are claimed."""

    async def main(a: RecordStore, b: RecordStore) -> None:
        assert await a.enqueue(record("run_new"), 9, "r", 9, version=VERSION + 1) is None
        assert await a.enqueue(record("run_now"), 9, "r", 9, version=VERSION) is None
        first = await b.claim({}, 5, VERSION)
        assert first is not None and first.record.id == "run_now"
        assert await b.claim({}, 5, VERSION) is None
        newer = await b.claim({}, 5, VERSION + 1)
        assert newer is not None and newer.record.id == "run_new"

    store_run(main, PostgresStore(postgres_dsn, "a"), PostgresStore(postgres_dsn, "b"))


# What a carried request holds, in the form `VERSION` names. A change here changes the form:
# give the new field a default, bump `carried.VERSION`, and write the new set here.
CARRIED_FIELDS = {
    1: {
        "language", "code", "entrypoint", "timeout", "files", "archive", "vars", "env",
        "return_files", "background", "network", "working_dir", "user", "notes", "keep",
        "continue_from", "rebuild", "files_from", "keep_files", "memory_bytes",
    },
}  # fmt: skip


@pytest.mark.fast
def test_the_carried_form_changes_only_with_its_version() -> None:
    fields = {f.name for f in dataclasses.fields(RunRequest)}
    assert fields == CARRIED_FIELDS[VERSION], (
        "RunRequest's fields changed: bump gateway/runs/carried.py's VERSION "
        f"(added {fields - CARRIED_FIELDS[VERSION]}, gone {CARRIED_FIELDS[VERSION] - fields})"
    )


@pytest.mark.fast
def test_an_older_form_is_read_with_the_defaults_of_what_it_lacks() -> None:
    request = RunRequest(language="python", code="print(1)", background=True, keep_files=True)
    program = from_run(request)
    text = json.loads(asyncio.run(carry(request, program)))
    del text["request"]["keep_files"]  # a field an older form did not have
    back = asyncio.run(unpack(json.dumps(text)))
    assert back == from_run(dataclasses.replace(request, keep_files=False))
    text["version"] = VERSION + 1  # a newer form is not read (never claimed: above)
    with pytest.raises(NotCarried):
        asyncio.run(unpack(json.dumps(text)))


@pytest.mark.fast
def test_a_request_carried_by_the_queue_is_the_program_admitted() -> None:
    request = RunRequest(
        language="python",
        code="print(1)",
        timeout=12.5,
        files=(StagedFile("data/x.bin", bytes(range(256))),),
        vars={"n": [1, {"a": None}]},
        env={"K": "v"},
        return_files=("out/*",),
        background=True,
        user="ann",
        notes=("clamped",),
        memory_bytes=1 << 28,
        files_from="run_abc",
    )
    program = from_run(request)
    assert carried(request, program)
    back = asyncio.run(unpack(asyncio.run(carry(request, program))))
    assert back == program
    for stays in (
        RunRequest(language="python", code="1"),  # not in the background: its client waits
        RunRequest(language="python", code="1", background=True, continue_from="snap_1"),
        RunRequest(language="python", code="1", background=True, keep=True),
    ):
        assert not carried(stays, from_run(stays))


# --- two replicas -----------------------------------------------------------------------


def start(dsn: str, root: Path, name: str, **settings: Any) -> GatewayProcess:
    (root / name).mkdir()
    defaults = {"lease_seconds": LEASE, "max_concurrent_runs": 1, "max_runs_per_user": 64}
    return GatewayProcess("local", root / name, store=dsn, **{**defaults, **settings}).start()


@pytest.fixture
def replicas(postgres_dsn: str, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    try:
        started.append(start(postgres_dsn, tmp_path, "a"))
        started.append(start(postgres_dsn, tmp_path, "b"))
        yield started
    finally:
        for process in started:
            process.stop()


def submit(client: Client, code: str) -> str:
    answer = client.request("POST", "/v1/runs", {"code": code, "background": True})
    assert answer.status == 202, answer.body[:500]
    return str(answer.json()["id"])


def record_of(client: Client, run_id: str) -> dict[str, Any]:
    return dict(client.request("GET", f"/v1/runs/{run_id}").json())


def status_of(client: Client, run_id: str) -> str:
    return str(record_of(client, run_id)["status"])


def ran_by(record: dict[str, Any], process: GatewayProcess) -> bool:
    return any(f"run by gateway replica {process.instance}" in n for n in record["notes"])


def test_an_idle_replica_runs_the_runs_a_busy_one_queued(replicas: list[GatewayProcess]) -> None:
    a, b = replicas
    busy = submit(a.client, LONG)  # a's one slot
    assert wait_for(lambda: status_of(a.client, busy) == "running", timeout=60)
    queued = [submit(a.client, f"result = {n} * 7") for n in range(3)]
    for run_id in queued:
        assert wait_for(lambda i=run_id: status_of(b.client, i) == "succeeded", timeout=90)
    for n, run_id in enumerate(queued):
        done = record_of(a.client, run_id)  # either replica answers
        assert done["result"] == n * 7 and ran_by(done, b), done
    assert status_of(a.client, busy) == "running"  # a's slot was never free meanwhile
    assert record_of(b.client, busy)["status"] == "running"


def test_a_websocket_run_waits_for_its_client_even_when_it_asks_for_the_background(
    replicas: list[GatewayProcess],
) -> None:
    """`background` has no effect on a WebSocket run (API.md): it is never carried to the
    store's queue, where its events would reach no one. It waits for a's slot, then streams
    its output and `done` to its client."""
    a, b = replicas
    busy = submit(a.client, LONG)
    assert wait_for(lambda: status_of(a.client, busy) == "running", timeout=60)

    async def stream() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with open_stream(a.port) as ws:
            message = {"type": "run", "ref": "r", "code": "print('here')", "background": True}
            await ws.write_message(json.dumps(message))
            events.append(await receive(ws))  # accepted
            await asyncio.sleep(3)  # b is idle all along: it must not take this run
            assert a.client.request("DELETE", f"/v1/runs/{busy}").status in (200, 202)
            while (event := await receive(ws)) is not None:
                events.append(event)
                if event["type"] == "done":
                    break
        return events

    events = asyncio.run(stream())
    assert events[0]["type"] == "accepted" and events[-1]["type"] == "done", events
    done = events[-1]["run"]
    assert done["status"] == "succeeded" and done["stdout"] == "here\n", done
    assert not ran_by(done, b), done


def bodies_in_flight(process: GatewayProcess) -> float:
    """The replica's bodies budget in use (`/metrics`), in bytes."""
    text = process.client.request("GET", "/metrics").body.decode()
    [line] = [ln for ln in text.splitlines() if ln.startswith("gateway_body_bytes_in_flight ")]
    return float(line.split()[1])


def test_a_claimed_run_holds_its_request_in_the_claimers_bodies_budget(
    replicas: list[GatewayProcess],
) -> None:
    """What a replica holds on a user's behalf counts against its budget: a run b claimed
    from a's queue holds its request's bytes (4 MiB of files) in b's bodies budget while it
    runs, as a's did for a background run it ran itself, and gives them back at its end."""
    a, b = replicas
    busy = submit(a.client, LONG)
    assert wait_for(lambda: status_of(a.client, busy) == "running", timeout=60)
    data = base64.b64encode(bytes(4 * 1024 * 1024)).decode()
    body = {
        "code": "import time; time.sleep(4); print(len(open('zeros.bin', 'rb').read()))",
        "files": [{"path": "zeros.bin", "content": data, "encoding": "base64"}],
        "background": True,
    }
    answer = a.client.request("POST", "/v1/runs", body)
    assert answer.status == 202, answer.body[:500]
    run_id = str(answer.json()["id"])
    assert wait_for(lambda: status_of(b.client, run_id) == "running", timeout=60)
    assert bodies_in_flight(b) >= 4 * 1024 * 1024
    assert bodies_in_flight(a) < 1024 * 1024  # a gave its room back when it queued the run
    assert wait_for(lambda: status_of(b.client, run_id) == "succeeded", timeout=60)
    assert record_of(b.client, run_id)["stdout"] == f"{4 * 1024 * 1024}\n"
    assert wait_for(lambda: bodies_in_flight(b) == 0, timeout=10)


def runs_ended(dsn: str) -> int:
    """Runs that ended after they started, on any replica, as the usage ledger counts them
    (each replica that runs a run counts it when it ends: a run run twice counts twice)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(runs), 0) FROM usage").fetchone()
    assert row is not None
    return int(row[0])


def test_many_queued_runs_over_two_claiming_replicas_each_run_once(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """Both replicas' slots are held by short runs while 30 more are queued on both; then
    both claim at once. Each run is counted once in the usage ledger, and says its number
    once in its own record."""
    processes = []
    try:
        for name in "ab":
            processes.append(start(postgres_dsn, tmp_path, name, max_concurrent_runs=2))
        a, b = processes
        hold = "import time; time.sleep(4)"
        for client in (a.client, a.client, b.client, b.client):
            submit(client, hold)
        code = "import os, time; print(os.environ['RUN']); time.sleep(0.3)"
        ids = []
        for i in range(30):
            client = (a if i % 2 else b).client
            answer = client.request(
                "POST", "/v1/runs", {"code": code, "background": True, "env": {"RUN": str(i)}}
            )
            assert answer.status == 202, answer.body[:500]
            ids.append(str(answer.json()["id"]))
        for run_id in ids:
            assert wait_for(lambda i=run_id: status_of(a.client, i) != "queued", timeout=60)
            assert wait_for(lambda i=run_id: status_of(a.client, i) != "running", timeout=60)
            done = record_of(a.client, run_id)
            assert done["status"] == "succeeded", str(done)[:1500]
        records = [record_of(b.client, run_id) for run_id in ids]
        assert [r["stdout"] for r in records] == [f"{i}\n" for i in range(30)]
        assert wait_for(lambda: runs_ended(postgres_dsn) >= 34, timeout=30)
        time.sleep(2)  # a run taken twice would end and be counted by now
        assert runs_ended(postgres_dsn) == 4 + 30
        assert any(ran_by(r, a) for r in records) and any(ran_by(r, b) for r in records)
    finally:
        for process in processes:
            process.stop()


def test_runs_queued_by_a_replica_killed_with_sigkill_are_run_by_another(
    replicas: list[GatewayProcess],
) -> None:
    a, b = replicas
    running = submit(a.client, LONG)
    assert wait_for(lambda: status_of(a.client, running) == "running", timeout=60)
    b_busy = submit(b.client, LONG)  # b takes nothing while its one slot is held
    assert wait_for(lambda: status_of(b.client, b_busy) == "running", timeout=60)
    queued = [submit(a.client, f"result = {n} + 1") for n in range(2)]
    a.signal(signal.SIGKILL)
    # a's running run is failed once its lease ran out, with the reason; what a queued is not
    assert wait_for(lambda: status_of(b.client, running) == "failed", timeout=10 * LEASE)
    failed = record_of(b.client, running)
    assert any(a.instance in note and "lease" in note for note in failed["notes"]), failed
    assert [status_of(b.client, run_id) for run_id in queued] == ["queued"] * 2
    cancelled = b.client.request("DELETE", f"/v1/runs/{b_busy}").json()
    assert cancelled["status"] == "cancelled"  # b's slot is free: it takes a's queued runs
    for n, run_id in enumerate(queued):
        assert wait_for(lambda i=run_id: status_of(b.client, i) == "succeeded", timeout=60)
        done = record_of(b.client, run_id)
        assert done["result"] == n + 1 and ran_by(done, b), done
    # a's replacement on that machine removes what a left behind (its running run's sandbox)
    a.start()
    assert wait_for(lambda: census.census() == [], timeout=30), census.census()


def test_a_queued_run_is_cancelled_from_either_replica_claimed_or_not(
    replicas: list[GatewayProcess], postgres_dsn: str
) -> None:
    a, b = replicas
    a_busy, b_busy = submit(a.client, LONG), submit(b.client, LONG)
    for client, run_id in ((a.client, a_busy), (b.client, b_busy)):
        assert wait_for(lambda c=client, i=run_id: status_of(c, i) == "running", timeout=60)
    first, second = submit(a.client, "print('never')"), submit(a.client, "print('never')")
    assert status_of(b.client, first) == "queued"
    for client, run_id in ((b.client, first), (a.client, second)):  # not a's, and a's own
        record = client.request("DELETE", f"/v1/runs/{run_id}").json()
        assert (record["status"], record["kill_reason"]) == ("cancelled", "cancelled"), record
        assert any("before it started" in note for note in record["notes"]), record
    # b's slot comes free: it claims a run queued on a, which a then cancels through b
    claimed = submit(a.client, LONG)
    assert b.client.request("DELETE", f"/v1/runs/{b_busy}").json()["status"] == "cancelled"
    assert wait_for(lambda: status_of(b.client, claimed) == "running", timeout=60)
    record = a.client.request("DELETE", f"/v1/runs/{claimed}").json()
    assert record["status"] == "cancelled", record
    assert f"Cancelled through gateway replica {a.instance}." in record["notes"]
    assert ran_by(record, b)
    # the cancelled ones never ran, on any replica, though b's slot is free again
    later = submit(a.client, "result = 1")
    assert wait_for(lambda: status_of(b.client, later) == "succeeded", timeout=60)
    for run_id in (first, second):
        record = record_of(a.client, run_id)
        assert (record["status"], record["started_at"]) == ("cancelled", None)
    assert wait_for(lambda: runs_ended(postgres_dsn) == 3, timeout=30)  # b_busy, claimed, later
    a.client.request("DELETE", f"/v1/runs/{a_busy}")


def test_the_queue_is_bounded_per_replica(postgres_dsn: str, tmp_path: Path) -> None:
    a = start(postgres_dsn, tmp_path, "a", max_queued_runs=2)
    try:
        busy = submit(a.client, LONG)
        assert wait_for(lambda: status_of(a.client, busy) == "running", timeout=60)
        queued = [submit(a.client, "1") for _ in range(2)]
        refused = a.client.request("POST", "/v1/runs", {"code": "1", "background": True})
        assert refused.status == 429 and "queue is full" in refused.json()["error"]["message"]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda i: a.client.request("DELETE", f"/v1/runs/{i}"), queued))
        assert submit(a.client, "1")  # room again
        a.client.request("DELETE", f"/v1/runs/{busy}")
    finally:
        a.stop()
