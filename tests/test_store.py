"""The store contract, on both stores: SQLite (the default) and a real PostgreSQL
(tests/postgres.py). Then what only a store shared by replicas does: the per-user limit
decided atomically for the whole fleet, leases that run out, cancels between replicas,
versioned migrations, and a database that cannot be reached."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway import settings as settings_module
from gateway.budget import Quota
from gateway.errors import StoreUnavailable
from gateway.models.record import RunRecord
from gateway.store.base import RecordStore, UsageRow
from gateway.store.config import StoreConfig
from gateway.store.instance import InstanceTaken, instance_lock_key
from gateway.store.migrate import migrations
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import SQLiteStore
from gateway.store_url import parse_store_url
from tests.postgres import Server
from tests.support import free_port, part_config

pytestmark = pytest.mark.fast

Make = Callable[..., RecordStore]


@pytest.fixture(params=["sqlite", "postgres"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    """A factory of (unopened) stores on one database: SQLite in a temp folder, or a fresh
    PostgreSQL database. Every store made on one database is one replica."""
    if request.param == "sqlite":
        with tempfile.TemporaryDirectory(prefix="store-") as tmp:
            path = Path(tmp) / "runs.sqlite3"
            yield lambda replica="a", lease=30.0: SQLiteStore(path, replica)
        return
    server: Server = request.getfixturevalue("postgres_server")
    with server.database() as dsn:
        yield lambda replica="a", lease=30.0: PostgresStore(dsn, replica, lease=lease)


def run(main: Callable[..., Awaitable[Any]], *stores: RecordStore) -> Any:
    """Open the stores, run `main(*stores)`, close them."""

    async def body() -> Any:
        for store in stores:
            await store.open()
        try:
            return await main(*stores)
        finally:
            for store in stores:
                await store.close()

    return asyncio.run(body())


def record(run_id: str, user: str = "ann", status: str = "queued") -> RunRecord:
    return RunRecord(id=run_id, language="python", user=user, code="1", status=status)  # type: ignore[arg-type]


def test_a_final_record_brings_what_its_run_spent_to_the_ledger(make: Make) -> None:
    """`finish` adds the run's usage to the ledger in the same trip (a run's end costs the
    store one call): added to what a tick of the minute spent, the peak the highest."""

    async def main(store: RecordStore) -> None:
        await store.admit(record("run_1"), limit=10)
        assert await store.spend("ann", 1000, 300, (60,)) == (300,)  # a tick of the run's
        done = record("run_1", status="succeeded")
        assert (await store.finish(done, usage=UsageRow("ann", 1000, 200, 1, 4096))).kept
        assert await store.usage("ann", 0) == [UsageRow("ann", 1000, 500, 1, 4096)]
        assert await store.finish(record("run_1", status="succeeded"))  # none: nothing added
        assert await store.spent("ann", 1000, (60,)) == (500,)

    run(main, make())


def test_admit_stores_a_queued_record_up_to_the_users_limit(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        assert await store.admit(record("run_1"), limit=2) is None
        assert await store.admit(record("run_2"), limit=2) is None
        assert await store.admit(record("run_3"), limit=2) == 2  # refused, nothing stored
        assert await store.get("run_3") is None
        assert await store.admit(record("run_4", user="bob"), limit=2) is None  # not ann's
        got = await store.get("run_1")
        assert got is not None and (got.status, got.user, got.code) == ("queued", "ann", "1")
        # a finished run no longer counts
        done = record("run_1", status="succeeded")
        assert (await store.finish(done)).kept
        assert await store.admit(record("run_5"), limit=2) is None

    run(main, make())


def test_update_finish_and_the_quota_of_finished_records(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        for i in range(4):
            assert await store.admit(record(f"run_{i}"), limit=10) is None
        running = record("run_0", status="running")
        assert await store.update(running)
        got = await store.get("run_0")
        assert got is not None and got.status == "running"
        evicted = []
        for i in (1, 2, 3):
            finished = await store.finish(
                record(f"run_{i}", status="succeeded"), Quota(count=3, bytes=10**9)
            )
            evicted.append(finished.evicted)
        # four records, at most three: nothing finished to delete at first (the one just
        # finished stays), then the oldest finished one went; the unfinished one stayed
        assert evicted == [0, 1, 0]
        assert await store.get("run_1") is None
        assert [await store.get(f"run_{i}") is not None for i in (0, 2, 3)] == [True] * 3

    run(main, make())


def test_expire_deletes_old_finished_records_only(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        await store.admit(record("run_old"), limit=10)
        await store.finish(record("run_old", status="failed"))
        await store.admit(record("run_live"), limit=10)
        assert await store.expire(3600) == 0
        assert await store.expire(0) == 1
        assert await store.get("run_old") is None and await store.get("run_live") is not None

    run(main, make())


def test_recover_fails_what_this_replica_left_unfinished(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        await store.admit(record("run_q"), limit=10)
        await store.admit(record("run_r"), limit=10)
        await store.update(record("run_r", status="running"))
        await store.admit(record("run_d"), limit=10)
        await store.finish(record("run_d", status="succeeded"))
        assert await store.recover("gone") == 2
        for run_id in ("run_q", "run_r"):
            got = await store.get(run_id)
            assert got is not None and got.status == "failed" and got.notes == ["gone"]
        done = await store.get("run_d")
        assert done is not None and done.status == "succeeded"

    run(main, make())


def test_a_cancel_request_is_answered_by_the_final_record(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        await store.admit(record("run_1"), limit=10)
        assert await store.request_cancel("run_1", "cancel please")
        assert not await store.request_cancel("run_missing", "cancel please")
        waiting = asyncio.ensure_future(store.wait_final("run_1", timeout=30))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await store.finish(record("run_1", status="cancelled"))
        final = await waiting
        assert final is not None and final.status == "cancelled"
        assert not await store.request_cancel("run_1", "again")  # final: nothing to ask
        # a run that stays unfinished: its record as it is, after the timeout
        await store.admit(record("run_2"), limit=10)
        late = await store.wait_final("run_2", timeout=0.2)
        assert late is not None and late.status == "queued"

    run(main, make())


def test_a_large_record_is_stored_and_read_back_intact(make: Make) -> None:
    """A record far past the size encoded inline (store/records.py: in the heavy-work pool,
    in turns) comes back exactly as it went in: 2 MiB of outputs, a 20,000-cell notebook,
    text that JSON must escape."""

    async def main(store: RecordStore) -> None:
        big = record("run_big")
        big.outputs = [{"output_type": "display_data", "data": {"text/plain": 'é"\n' * 350_000}}]
        big.notebook = {
            "cells": [{"cell_type": "markdown", "source": str(i)} for i in range(20_000)]
        }
        big.result = {"nested": [1.5, None, True, "\u0000"]}
        assert await store.admit(big, limit=10) is None
        big.status = "succeeded"
        assert (await store.finish(big)).kept
        got = await store.get("run_big")
        assert got is not None and got.to_storage() == big.to_storage()

    run(main, make())


def test_ping_and_describe(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        await store.ping()
        shown = store.describe()
        assert shown["kind"] in ("sqlite", "postgresql")
        assert "password" not in str(shown) and "secret" not in str(shown)

    run(main, make())


# --- PostgreSQL: a store shared by replicas -------------------------------------------------


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    return postgres_dsn


def test_the_per_user_limit_holds_across_replicas_admitting_at_once(dsn: str) -> None:
    """Two replicas, 40 admissions of one user at once, a limit of 3: exactly 3 admitted
    (without the store's per-user lock, several replicas' counts see the same 2 and each
    inserts: checked by removing `_lock_user` from admit: 4 admitted)."""

    async def main(a: RecordStore, b: RecordStore) -> None:
        results = await asyncio.gather(
            *((a if i % 2 else b).admit(record(f"run_{i}", user="ann"), limit=3) for i in range(40))
        )
        assert sum(r is None for r in results) == 3
        assert all(r == 3 for r in results if r is not None)

    run(main, PostgresStore(dsn, "a", pool_size=8), PostgresStore(dsn, "b", pool_size=8))


def test_a_replica_whose_lease_ran_out_has_its_runs_failed_by_another(dsn: str) -> None:
    async def main(a: RecordStore, b: RecordStore) -> None:
        await a.admit(record("run_a"), limit=10)
        await b.admit(record("run_b"), limit=10)
        assert await b.fail_expired("{replica} died") == 0  # a's lease still holds
        for _ in range(100):  # a does not renew: after its 0.5 s lease, b fails its run
            renewed = await b.renew(["run_b"])  # b's own run stays b's
            assert not renewed.lost
            if await b.fail_expired("{replica} died"):
                break
            await asyncio.sleep(0.1)
        failed = await a.get("run_a")
        assert failed is not None and failed.status == "failed" and failed.notes == ["a died"]
        assert await b.fail_expired("{replica} died") == 0  # once
        mine = await b.get("run_b")
        assert mine is not None and mine.status == "queued"
        # the replica that comes back: it lost the run, and its late result is not kept
        assert (await a.renew(["run_a"])).lost == {"run_a"}
        spent = UsageRow("ann", 1000, 700, 1, 5)
        assert not (await a.finish(record("run_a", status="succeeded"), usage=spent)).kept
        # what it spent was spent all the same: the ledger has it
        assert [(r.cpu_ms, r.runs) for r in await b.usage("ann", 0)] == [(700, 1)]
        still = await b.get("run_a")
        assert still is not None and still.status == "failed"

    run(main, PostgresStore(dsn, "a", lease=0.5), PostgresStore(dsn, "b", lease=30))


def test_a_cancel_reaches_the_owning_replica_by_notify_and_by_heartbeat(dsn: str) -> None:
    heard: list[tuple[str, str, str]] = []

    async def main(a: PostgresStore, b: PostgresStore) -> None:
        got = asyncio.Event()

        def on_cancel(replica: str) -> Callable[[str, str], None]:
            def handler(run_id: str, note: str) -> None:
                heard.append((replica, run_id, note))
                got.set()

            return handler

        a.on_cancel, b.on_cancel = on_cancel("a"), on_cancel("b")
        await asyncio.wait_for(a.listening.wait(), 30)
        await asyncio.wait_for(b.listening.wait(), 30)
        await a.admit(record("run_1"), limit=10)
        assert await b.request_cancel("run_1", "through b")
        await asyncio.wait_for(got.wait(), 30)
        assert heard == [("a", "run_1", "through b")]  # only the owner heard it
        # the heartbeat tells the owner too (a notification missed while disconnected)
        assert (await a.renew(["run_1"])).cancels == {"run_1": "through b"}

    run(main, PostgresStore(dsn, "a"), PostgresStore(dsn, "b"))


def test_migrations_are_versioned_and_applied_once(dsn: str) -> None:
    run(lambda store: store.ping(), PostgresStore(dsn, "a"))
    run(lambda store: store.ping(), PostgresStore(dsn, "b"))  # a second start: nothing new
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version, name FROM schema_version ORDER BY version")
        assert [tuple(r) for r in rows] == [(m.version, m.name) for m in migrations()]
        conn.execute("INSERT INTO schema_version (version, name) VALUES (999, 'future')")
    with pytest.raises(RuntimeError, match="version 999, newer than this gateway"):
        run(lambda store: store.ping(), PostgresStore(dsn, "a"))


def test_an_unreachable_database_is_a_clear_error_at_start() -> None:
    dsn = f"postgresql://gateway:secret@127.0.0.1:{free_port()}/gateway?connect_timeout=2"
    store = PostgresStore(dsn, "a", open_timeout=3)

    async def main() -> None:
        try:
            await store.open()
        finally:
            await store.close()

    with pytest.raises(RuntimeError, match="cannot be reached") as caught:
        asyncio.run(asyncio.wait_for(main(), 120))
    assert "secret" not in str(caught.value)


def test_a_database_gone_after_start_is_store_unavailable(postgres_server: Server) -> None:
    """A store that loses its database answers StoreUnavailable (503), never a driver error."""

    async def main() -> None:
        with postgres_server.database() as dsn:
            store = PostgresStore(dsn, "a", wait_timeout=2)
            await store.open()
            try:
                await store.ping()
                with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
                    name = dsn.rsplit("/", 1)[1]
                    conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
                with pytest.raises(StoreUnavailable):
                    await store.ping()
                with pytest.raises(StoreUnavailable):
                    await store.get("run_1")
            finally:
                await store.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://x/y", "sqlite:///PATH or postgresql://"),
        ("sqlite://relative.db", "absolute path"),
        ("sqlite:///", "absolute path"),
        ("postgresql://u:hunter2@h/d?bogus=1", "not a PostgreSQL URL"),
        ("runs.sqlite3", "sqlite:///PATH or postgresql://"),
        ("host=db user=gw password=hunter2", "sqlite:///PATH or postgresql://"),  # libpq's form
        ("postgresql://gw@db/x?password=hunter2&foo=1", "not a PostgreSQL URL"),
    ],
)
def test_a_bad_store_url_is_refused_at_start_without_its_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^store: ") as caught:
        settings_module.load(environ={}, overrides={"store": url})
    assert message in str(caught.value) and "hunter2" not in str(caught.value)


def test_a_sqlite_url_names_the_file() -> None:
    settings = settings_module.load(environ={}, overrides={"store": "sqlite:///tmp/x/r.db"})
    assert parse_store_url(str(settings.store)) == ("sqlite", Path("/tmp/x/r.db"))


# --- uploads: on disk beside SQLite, in the database beside PostgreSQL ----------------------


@pytest.fixture(params=["disk", "postgres"])
def shelves(request: pytest.FixtureRequest) -> Iterator[Callable[[float], Any]]:
    """A factory of (store, shelf) pairs on one place: `ttl` -> an async context."""
    import contextlib

    from gateway.uploads.disk import DiskShelf

    if request.param == "disk":
        with tempfile.TemporaryDirectory(prefix="shelf-") as tmp:

            @contextlib.asynccontextmanager
            async def disk(ttl: float) -> Any:
                yield DiskShelf(Path(tmp) / "uploads", ttl)

            yield disk
        return
    server: Server = request.getfixturevalue("postgres_server")
    with server.database() as dsn:

        @contextlib.asynccontextmanager
        async def database(ttl: float) -> Any:
            store = PostgresStore(dsn, "a")
            await store.open()
            try:
                yield store.upload_shelf(part_config(StoreConfig, upload_ttl=ttl))
            finally:
                await store.close()

        yield database


def test_an_upload_is_kept_found_read_and_its_users_oldest_make_room(
    shelves: Callable[[float], Any],
) -> None:

    quota = Quota(count=2, bytes=10**6)

    async def main() -> None:
        async with shelves(3600.0) as shelf:
            first = await shelf.keep("ann", b"one", 1, 3, quota)
            second = await shelf.keep("ann", b"two", 2, 6, quota)
            bobs = await shelf.keep("bob", b"bob", 1, 3, quota)
            found = await shelf.find(first.id)
            assert found is not None and (found.user, found.entries, found.bytes) == (
                "ann",
                1,
                3,
            )
            assert await shelf.read(second.id) == b"two"
            third = await shelf.keep("ann", b"three", 1, 5, quota)  # ann's oldest goes
            assert await shelf.find(first.id) is None and await shelf.read(first.id) is None
            assert await shelf.read(third.id) == b"three"
            assert await shelf.read(bobs.id) == b"bob"  # nobody else's
            big = Quota(count=10, bytes=8)
            await shelf.keep("ann", b"12345678", 1, 8, big)  # alone it fits the bytes
            assert await shelf.find(second.id) is None and await shelf.find(third.id) is None
            assert await shelf.find("upl_" + "0" * 32) is None
        async with shelves(0.2) as shelf:  # expired uploads are gone
            old = await shelf.keep("cat", b"old", 1, 3, quota)
            await asyncio.sleep(1.2)  # the disk shelf's clock has whole seconds at worst
            assert await shelf.find(old.id) is None and await shelf.read(old.id) is None

    asyncio.run(main())


def test_the_upload_quota_holds_across_replicas_uploading_at_once(dsn: str) -> None:
    """Two replicas, 20 uploads of one user at once, at most 3 kept: 3 remain (without the
    per-user lock, concurrent keeps each see room: checked by removing it: 5 remained)."""

    config = part_config(StoreConfig)

    async def main(a: PostgresStore, b: PostgresStore) -> None:
        shelves = [a.upload_shelf(config), b.upload_shelf(config)]
        quota = Quota(count=3, bytes=10**6)
        await asyncio.gather(
            *(shelves[i % 2].keep("ann", b"x" * 10, 1, 10, quota) for i in range(20))
        )
        async with a.connection() as conn:
            cursor = await conn.execute("SELECT count(*) FROM uploads WHERE owner = 'ann'")
            row = await cursor.fetchone()
        assert row is not None and row[0] == 3

    run(main, PostgresStore(dsn, "a", pool_size=8), PostgresStore(dsn, "b", pool_size=8))


# --- the heartbeat's link: its own connection, which holds the instance id -----------------


def holders(dsn: str, replica: str) -> list[str]:
    """application_name of the sessions that hold `replica`'s instance id."""
    key = instance_lock_key(replica) & 0xFFFF_FFFF_FFFF_FFFF
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND l.classid = %s::oid AND l.objid = %s::oid",
            (key >> 32, key & 0xFFFF_FFFF),
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_link_holds_the_instance_id_while_connected(dsn: str) -> None:
    """One live link per instance id on a database: a second one (another process with the
    same id) is refused naming the holder, until the first disconnects; another id is free."""

    async def main() -> None:
        first = PostgresStore(dsn, "a").lease_link()
        second = PostgresStore(dsn, "a").lease_link()
        other = PostgresStore(dsn, "b").lease_link()
        try:
            await first.connect()
            assert holders(dsn, "a") == [first.name]
            with pytest.raises(InstanceTaken, match=r"instance id 'a' is held by") as taken:
                await second.connect()
            assert f"{os.getpid()}@" in str(taken.value)
            await other.connect()
            await first.close()
            await second.connect()
            assert holders(dsn, "a") == [second.name]
        finally:
            for link in (first, second, other):
                await link.close()
        assert holders(dsn, "a") == []

    asyncio.run(main())


def test_a_link_whose_connection_was_cut_takes_the_id_again(dsn: str) -> None:
    """The server ends the link's session (a restart, a network cut): the id is free, the
    next beat fails (StoreUnavailable: nothing renewed), and the one after connects and
    holds it again. A session of the link's own that the server has not yet seen die (the
    network dropped it silently) is ended, not taken for another holder."""

    async def main() -> None:
        store = PostgresStore(dsn, "a")
        await store.open()
        link = store.lease_link()
        try:
            await store.admit(record("run_1"), limit=10)
            await link.connect()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (link.name,),
                )
            with pytest.raises(StoreUnavailable):
                await link.renew(["run_1"])
            assert not (await link.renew(["run_1"])).lost  # connected again, still ours
            assert holders(dsn, "a") == [link.name]
            # forgotten without a goodbye: the server still holds the id for that session
            stale = link._conn
            link._conn = None
            await link.connect()
            assert holders(dsn, "a") == [link.name]
            await stale.close()
        finally:
            await link.close()
            await store.close()

    asyncio.run(main())


def test_health_reaches_the_store_while_the_pool_is_exhausted(dsn: str) -> None:
    """Every pooled connection held (row 5: uploads waiting for their user's lock): the
    store still answers its readiness ping at once, on a connection of its own. Before: the
    ping waited for a pooled one, and /v1/health answered 503 after its 3 s."""

    async def main(store: PostgresStore) -> None:
        both = asyncio.Barrier(3)  # the two holders and this test
        release = asyncio.Event()

        async def hold() -> None:
            async with store.connection() as conn:
                await conn.execute("SELECT 1")
                await both.wait()
                await release.wait()

        holders = [asyncio.ensure_future(hold()) for _ in range(2)]
        await both.wait()
        try:
            assert await store.answers(1.0)
            assert await store.answers(1.0)  # again, on the same connection
        finally:
            release.set()
            await asyncio.gather(*holders)

    run(main, PostgresStore(dsn, "a", pool_size=2, wait_timeout=5))
