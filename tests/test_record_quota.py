"""Per-user quota on stored run records (issue 8, item 7): records were kept for days with
no limit per user. Past the quota a user's oldest finished records are deleted; runs in
progress and other users' records are never touched."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.budget import Quota
from gateway.models.record import RunRecord
from gateway.store.sqlite import SQLiteStore
from tests.conftest import BACKENDS, start_gateway
from tests.support import Client, GatewayThread, serving

pytestmark = pytest.mark.attack

TOKENS = {
    "alice-token-0123456789": ("alice", "user"),
    "bob-token-0123456789ab": ("bob", "user"),
    "carol-token-0123456789": ("carol", "user"),
}


@pytest.fixture(scope="module", params=BACKENDS)
def quota_gateway(request: pytest.FixtureRequest) -> Iterator[GatewayThread]:
    server = start_gateway(
        request.param,
        users=TOKENS,
        max_records_per_user=3,
        max_record_store_bytes_per_user=400_000,
    )
    yield from serving(server)


def client_of(server: GatewayThread, user: str) -> Client:
    token = next(t for t, (name, _) in TOKENS.items() if name == user)
    return server.client(token)


def kept(client: Client, run_ids: list[str]) -> list[bool]:
    return [client.request("GET", f"/v1/runs/{i}").status == 200 for i in run_ids]


def test_a_user_keeps_at_most_the_quota_count_newest_first(quota_gateway: GatewayThread) -> None:
    alice, bob = client_of(quota_gateway, "alice"), client_of(quota_gateway, "bob")
    bobs = [bob.run(code="print('bob')")["id"]]
    alices = [alice.run(code=f"print({i})")["id"] for i in range(5)]
    assert kept(alice, alices) == [False, False, True, True, True]
    assert alice.request("GET", f"/v1/runs/{alices[0]}").json()["error"]["code"] == "not_found"
    assert kept(bob, bobs) == [True]  # another user's flood costs bob nothing


def test_a_user_keeps_at_most_the_quota_bytes(quota_gateway: GatewayThread) -> None:
    """Each record holds its 60 kB three times (stdout, output, outputs): two fit in the
    400 kB quota, the third pushes the oldest out."""
    carol = client_of(quota_gateway, "carol")
    ids = [carol.run(code=f"print('{i}' * 60_000)")["id"] for i in range(3)]
    assert kept(carol, ids) == [False, True, True]


def test_a_run_in_progress_is_never_deleted(quota_gateway: GatewayThread) -> None:
    bob = client_of(quota_gateway, "bob")
    started = bob.request(
        "POST",
        "/v1/runs",
        {"code": "import time\ntime.sleep(120)", "background": True, "timeout": 150},
    )
    assert started.status == 202
    slow = started.json()["id"]
    quick = [bob.run(code=f"print({i})")["id"] for i in range(4)]
    record = bob.request("GET", f"/v1/runs/{slow}").json()
    assert record["status"] in ("queued", "running")
    cancelled = bob.request("DELETE", f"/v1/runs/{slow}").json()
    assert cancelled["status"] == "cancelled"
    # the slow run ended last: it is the newest, and the oldest quick ones made room
    assert kept(bob, [slow, *quick]) == [True, False, False, True, True]


def test_a_data_dir_of_an_older_gateway_gets_sizes(tmp_path: Path) -> None:
    """Records stored before the quota existed count with their real size."""
    path = tmp_path / "runs.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE runs (id TEXT PRIMARY KEY, user TEXT NOT NULL, status TEXT NOT NULL, "
        "created REAL NOT NULL, record TEXT NOT NULL);"
    )
    old = RunRecord(id="run_old", language="python", user="dan", status="succeeded")
    old.stdout = "x" * 50_000
    db.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?)",
        ("run_old", "dan", "succeeded", time.time() - 10, json.dumps(old.to_storage())),
    )
    db.commit()
    db.close()

    async def main() -> tuple[RunRecord | None, RunRecord | None, int]:
        store = SQLiteStore(path)
        await store.open()
        try:
            new = RunRecord(id="run_new", language="python", user="dan", status="succeeded")
            finished = await store.finish(new, Quota(count=10, bytes=30_000))
            return await store.get("run_old"), await store.get("run_new"), finished.evicted
        finally:
            await store.close()

    before, after, evicted = asyncio.run(main())
    assert before is None and after is not None and evicted == 1
