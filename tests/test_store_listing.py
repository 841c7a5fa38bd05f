"""`RecordStore.list_runs` (GET /v1/runs) on both stores: one owner's runs newest first, a
page at a time to the end, filtered by status and language, from the summaries kept beside
the records; rows an older gateway wrote (no summary, no language column) are listed after
the migration; a position the store cannot have written is refused."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import psycopg
import psycopg.sql
import pytest

from gateway.models.listing import RunSummary
from gateway.models.record import RunRecord
from gateway.store.base import InvalidPosition, Listed, RecordStore, RunQuery
from gateway.store.migrate import migrations
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import SQLiteStore
from tests.postgres import Server
from tests.test_store import Make, make, run

pytestmark = pytest.mark.fast

__all__ = ["make"]  # the fixture, on both stores


def made(
    run_id: str, user: str = "ann", language: str = "python", code: str = "x = 1"
) -> RunRecord:
    return RunRecord(id=run_id, language=language, user=user, code=code)  # type: ignore[arg-type]


async def page_through(store: RecordStore, query: RunQuery) -> list[list[str]]:
    """Every page of a listing, by following each page's last position."""
    pages: list[list[str]] = []
    after = None
    while True:
        listed = await store.list_runs(
            RunQuery(query.owner, query.limit, query.status, query.language, after)
        )
        if not listed:
            return pages
        pages.append([item.summary["id"] for item in listed])
        after = listed[-1].after


def test_a_listing_is_newest_first_paged_to_the_end_filtered_and_one_owners(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        # admitted in this order: later ones are newer (and have larger ids, for ties)
        for number in range(1, 8):
            language = "bash" if number % 3 == 0 else "python"
            await store.admit(made(f"run_{number:02d}", language=language), limit=100)
        await store.admit(made("run_50", user="bob"), limit=100)
        for number in (2, 5):  # two finish: one succeeded, one failed
            record = await store.get(f"run_{number:02d}")
            assert record is not None
            record.start()
            await store.update(record)
            record.exit_code = 0 if number == 2 else 1
            record.status = "succeeded" if number == 2 else "failed"
            record.finished_at = "2026-01-05T10:00:00.000Z"
            await store.finish(record)
        ann = RunQuery("ann", 3)
        assert await page_through(store, ann) == [
            ["run_07", "run_06", "run_05"],
            ["run_04", "run_03", "run_02"],
            ["run_01"],
        ]
        assert await page_through(store, RunQuery("ann", 2, language="bash")) == [
            ["run_06", "run_03"]
        ]
        assert await page_through(store, RunQuery("ann", 5, status="queued")) == [
            ["run_07", "run_06", "run_04", "run_03", "run_01"]
        ]
        assert await page_through(store, RunQuery("bob", 100)) == [["run_50"]]
        assert await store.list_runs(RunQuery("nobody", 10)) == []
        (failed,) = await store.list_runs(RunQuery("ann", 10, status="failed"))
        summary = RunSummary.model_validate(failed.summary)  # the API's shape
        assert (summary.id, summary.status, summary.exit_code) == ("run_05", "failed", 1)
        assert summary.kind == "run" and summary.first_line == "x = 1"
        assert summary.started_at is not None and summary.finished_at is not None

    run(main, make())


def test_a_position_the_store_did_not_write_is_refused(make: Make) -> None:
    async def main(store: RecordStore) -> None:
        await store.admit(made("run_01"), limit=10)
        (listed,) = await store.list_runs(RunQuery("ann", 10))
        created, run_id = listed.after
        # the store's own position works, also after the last run
        assert await store.list_runs(RunQuery("ann", 10, after=(created, run_id))) == []
        forgeries = ["yesterday", "", "1e999", "nan", created + "\x00", created + "0 "]
        forgeries += ["2026-01-01T00:00:00+23:59", "2026-01-01T00:00:00", "9" * 400]
        for forged in forgeries:
            with pytest.raises(InvalidPosition):
                await store.list_runs(RunQuery("ann", 10, after=(forged, run_id)))
        # an owner's name is a value, never SQL
        hostile = "ann' OR '1'='1"
        assert await store.list_runs(RunQuery(hostile, 10)) == []
        assert await store.list_runs(RunQuery("ann", 10, status="x' OR 1=1 --")) == []

    run(main, make())


# --- rows of an older gateway -------------------------------------------------------------

OLD_SQLITE_SCHEMA = """
CREATE TABLE runs (id TEXT PRIMARY KEY, user TEXT NOT NULL, status TEXT NOT NULL,
    created REAL NOT NULL, record TEXT NOT NULL, size INTEGER NOT NULL DEFAULT 0);
"""


def stored(record: RunRecord) -> str:
    return json.dumps(record.to_storage())


def old_rows() -> list[RunRecord]:
    rows = [made("run_01", code="\n\nprint('old')\nmore"), made("run_02", language="bash")]
    rows[0].kind = "notebook"
    return rows


def check_old_rows(listed: list[Listed], bash: list[Listed]) -> None:
    summaries = [RunSummary.model_validate(item.summary) for item in listed]
    assert [s.id for s in summaries] == ["run_02", "run_01"]
    assert summaries[1].first_line == "print('old')" and summaries[1].kind == "notebook"
    assert [item.summary["id"] for item in bash] == ["run_02"]  # the language was read back


def test_sqlite_rows_of_an_older_gateway_are_listed() -> None:
    with tempfile.TemporaryDirectory(prefix="store-") as tmp:
        path = Path(tmp) / "runs.sqlite3"
        db = sqlite3.connect(path)
        db.executescript(OLD_SQLITE_SCHEMA)
        for created, record in enumerate(old_rows()):
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, 0)",
                (record.id, record.user, record.status, float(created), stored(record)),
            )
        db.commit()
        db.close()

        async def main(store: RecordStore) -> tuple[list[Listed], list[Listed]]:
            listed = await store.list_runs(RunQuery("ann", 10))
            return listed, await store.list_runs(RunQuery("ann", 10, language="bash"))

        check_old_rows(*run(main, SQLiteStore(path)))


def test_postgres_rows_of_an_older_gateway_are_listed(postgres_server: Server) -> None:
    with postgres_server.database() as dsn:
        with psycopg.connect(dsn) as conn:
            conn.execute(
                "CREATE TABLE schema_version (version integer PRIMARY KEY, name text NOT NULL, "
                "applied timestamptz NOT NULL DEFAULT now())"
            )
            for migration in migrations()[:2]:  # the schema before listings
                conn.execute(psycopg.sql.SQL(migration.sql))  # type: ignore[arg-type]
                conn.execute(
                    "INSERT INTO schema_version (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
            for seconds, record in enumerate(old_rows()):
                conn.execute(
                    "INSERT INTO runs (id, owner, status, created, record, size, replica) "
                    "VALUES (%s, %s, %s, now() - make_interval(secs => %s), %s, 0, 'old')",
                    (record.id, record.user, record.status, 100 - seconds, stored(record)),
                )

        async def main(store: RecordStore) -> tuple[list[Listed], list[Listed]]:
            listed = await store.list_runs(RunQuery("ann", 10))
            return listed, await store.list_runs(RunQuery("ann", 10, language="bash"))

        check_old_rows(*run(main, PostgresStore(dsn, "a")))
