"""`SQLiteStore`: run records in SQLite under the data dir (or the file `--store
sqlite:///PATH` names), so they survive a restart (DESIGN.md decision 9). One gateway per
file: it owns every run in it, so it has no leases and no other replica to ask; while open
it holds an exclusive lock on `<file>.lock`, so a second gateway on the same file (which
would fail the first one's runs as leftovers at its start) is refused.

sqlite3 is synchronous: every call runs on one dedicated thread, which also serialises
access to the single connection.

Records are kept for `record_ttl`, and each user may keep at most a `Quota` of them
(a count and a total size). When a finished record would pass it, the user's **oldest
finished records are deleted** to make room; records of runs still queued or running are
never deleted. Refusing new runs instead would let a user's own past flood lock them out
for the whole TTL, and nobody else's records are touched either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

from gateway.budget import Quota
from gateway.models.record import RunRecord
from gateway.store.base import (
    START_WINDOW,
    USAGE_KEPT_MINUTES,
    Finished,
    InvalidPosition,
    Listed,
    RecordStore,
    RunQuery,
    UsageRow,
)
from gateway.store.config import StoreConfig
from gateway.store.instance import FileLock
from gateway.store.records import decode, dump, encode, load, summary, summary_of_stored
from gateway.uploads.disk import DiskShelf
from gateway.uploads.shelf import UploadShelf

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    user TEXT NOT NULL,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
"""
# Added later: the stored size of each record, for the per-user quota.
_SIZE_COLUMN = "ALTER TABLE runs ADD COLUMN size INTEGER NOT NULL DEFAULT 0"
_SIZE_INDEX = "CREATE INDEX IF NOT EXISTS runs_user_created ON runs (user, created)"
# Added later: each run's language and summary, for `GET /v1/runs` (a page reads these,
# never the records); the language of older rows is read from their records once.
_LISTING_COLUMNS = (
    "ALTER TABLE runs ADD COLUMN language TEXT",
    "ALTER TABLE runs ADD COLUMN summary TEXT",
    "UPDATE runs SET language = json_extract(record, '$.language')",
)
_LISTING_INDEX = "CREATE INDEX IF NOT EXISTS runs_user_listing ON runs (user, created, id)"
# Added later: what each user spent, a row a minute, and the runs they started lately.
_USAGE = """
CREATE TABLE IF NOT EXISTS usage (
    user TEXT NOT NULL,
    minute INTEGER NOT NULL,
    cpu_ms INTEGER NOT NULL DEFAULT 0,
    runs INTEGER NOT NULL DEFAULT 0,
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user, minute)
);
CREATE INDEX IF NOT EXISTS usage_minute ON usage (minute);
CREATE TABLE IF NOT EXISTS starts (user TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS starts_user_at ON starts (user, at);
"""


class SQLiteStore(RecordStore):
    kind = "sqlite"
    shared = False

    def __init__(self, path: Path, replica: str = "") -> None:
        super().__init__(replica)
        self.path = path
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="records")
        self._db: sqlite3.Connection | None = None
        self._lock: FileLock | None = None

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock.take(
            self.path.with_name(self.path.name + ".lock"),
            f"the run store {self.path} (one gateway per SQLite file)",
        )
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
        if "size" not in columns:  # a data dir of an older gateway
            db.execute(_SIZE_COLUMN)
            db.execute("UPDATE runs SET size = length(record)")
        db.execute(_SIZE_INDEX)
        if "summary" not in columns:  # a data dir of a gateway without listings
            with db:
                db.execute("BEGIN")
                for statement in _LISTING_COLUMNS:
                    db.execute(statement)
        db.execute(_LISTING_INDEX)
        db.executescript(_USAGE)
        self._db = db

    async def close(self) -> None:
        await self._call(self._close)
        self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the record store is not open")
        return self._db

    def upload_shelf(self, config: StoreConfig) -> UploadShelf:
        return DiskShelf(config.data_dir / "uploads", config.upload_ttl)

    async def ping(self) -> None:
        await self._call(self._ping)

    def _ping(self) -> None:
        self._conn().execute("SELECT 1").fetchone()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path)}

    async def admit(self, record: RunRecord, limit: int) -> int | None:
        row = await _row(record)
        result: int | None = await self._call(self._admit, row, limit)
        return result

    def _admit(self, row: _Row, limit: int) -> int | None:
        (mine,) = (
            self._conn()
            .execute(
                "SELECT COUNT(*) FROM runs WHERE user = ? AND status IN ('queued', 'running')",
                (row.user,),
            )
            .fetchone()
        )
        if mine >= limit:
            return int(mine)
        self._put(row)
        return None

    async def update(self, record: RunRecord) -> bool:
        await self._call(self._put, await _row(record))
        return True

    async def finish(
        self, record: RunRecord, quota: Quota | None = None, usage: UsageRow | None = None
    ) -> Finished:
        evicted: int = await self._call(self._finish, await _row(record), quota, usage)
        return Finished(evicted=evicted)

    def _finish(self, row: _Row, quota: Quota | None, usage: UsageRow | None) -> int:
        if usage is not None:
            self._add_usage(usage)
        return self._put(row, quota)

    async def amend(self, record: RunRecord) -> bool:
        changed: bool = await self._call(self._amend, await _row(record))
        return changed

    def _amend(self, row: _Row) -> bool:
        cursor = self._conn().execute(
            "UPDATE runs SET record = ?, size = ?, summary = ? "
            "WHERE id = ? AND status NOT IN ('queued', 'running')",
            (row.payload, len(row.payload), row.summary, row.id),
        )
        return cursor.rowcount > 0

    def _put(self, row: _Row, quota: Quota | None = None) -> int:
        self._conn().execute(
            "INSERT INTO runs (id, user, status, created, record, size, language, summary) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "status = excluded.status, record = excluded.record, size = excluded.size, "
            "language = excluded.language, summary = excluded.summary",
            (
                row.id,
                row.user,
                row.status,
                time.time(),
                row.payload,
                len(row.payload),
                row.language,
                row.summary,
            ),
        )
        if quota is None:
            return 0
        return self._enforce(row.user, row.id, quota)

    def _enforce(self, user: str, keep: str, quota: Quota) -> int:
        """Delete `user`'s oldest finished records (never `keep`) until within `quota`."""
        db = self._conn()
        count, total = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM runs WHERE user = ?", (user,)
        ).fetchone()
        if quota.allows(count, total):
            return 0
        oldest = db.execute(
            "SELECT id, size FROM runs WHERE user = ? AND id != ? "
            "AND status NOT IN ('queued', 'running') ORDER BY created, rowid",
            (user, keep),
        )
        doomed: list[tuple[str]] = []
        for run_id, size in oldest:
            if quota.allows(count, total):
                break
            doomed.append((run_id,))
            count -= 1
            total -= size
        db.executemany("DELETE FROM runs WHERE id = ?", doomed)
        return len(doomed)

    async def get(self, run_id: str) -> RunRecord | None:
        row = await self._call(self._get, run_id)
        return None if row is None else await load(row)

    def _get(self, run_id: str) -> str | None:
        row = self._conn().execute("SELECT record FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    async def list_runs(self, query: RunQuery) -> list[Listed]:
        rows = await self._call(self._list, query)
        listed = []
        for created, run_id, kept, payload in rows:
            data = json.loads(kept) if kept is not None else await summary_of_stored(payload)
            listed.append(Listed(data, (repr(created), run_id)))
        return listed

    def _list(self, query: RunQuery) -> list[tuple[float, str, str | None, str | None]]:
        # the record only where no summary was kept (rows of an older gateway)
        rows = self._conn().execute(
            "SELECT created, id, summary, CASE WHEN summary IS NULL THEN record END FROM runs "
            "WHERE user = :owner AND (:status IS NULL OR status = :status) "
            "AND (:language IS NULL OR language = :language) "
            "AND (:created IS NULL OR created < :created OR (created = :created AND id < :after)) "
            "ORDER BY created DESC, id DESC LIMIT :limit",
            query.parameters(_position),
        )
        return [(float(c), str(i), s, r) for c, i, s, r in rows]

    async def recover(self, note: str) -> int:
        """Mark runs left queued or running by a gateway that died as failed: every one in
        the file (a SQLite store has one gateway)."""
        result: int = await self._call(self._fail_unfinished, note)
        return result

    def _fail_unfinished(self, note: str) -> int:
        rows = (
            self._conn()
            .execute("SELECT record FROM runs WHERE status IN ('queued', 'running')")
            .fetchall()
        )
        for (payload,) in rows:
            record = decode(payload)  # in the store's thread, at start
            record.fail(note)
            self._put(_Row.of(record, encode(record.to_storage())))
        return len(rows)

    async def expire(self, ttl: float) -> int:
        result: int = await self._call(self._expire, time.time() - ttl)
        return result

    def _expire(self, before: float) -> int:
        conn = self._conn()
        cursor = conn.execute(
            "DELETE FROM runs WHERE created < ? AND status NOT IN ('queued', 'running')",
            (before,),
        )
        oldest = int(time.time() // 60) - USAGE_KEPT_MINUTES
        conn.execute("DELETE FROM usage WHERE minute < ?", (oldest,))
        conn.execute("DELETE FROM starts WHERE at < ?", (time.time() - START_WINDOW,))
        return cursor.rowcount

    # --- usage ------------------------------------------------------------------------

    async def spend(
        self,
        user: str,
        minute: int,
        cpu_ms: int,
        windows: tuple[int, ...],
        runs: int = 0,
        peak_memory_bytes: int = 0,
    ) -> tuple[int, ...]:
        found: tuple[int, ...] = await self._call(
            self._spend, user, minute, cpu_ms, windows, runs, peak_memory_bytes
        )
        return found

    def _spend(
        self,
        user: str,
        minute: int,
        cpu_ms: int,
        windows: tuple[int, ...],
        runs: int,
        peak: int,
    ) -> tuple[int, ...]:
        self._add_usage(UsageRow(user, minute, cpu_ms, runs, peak))
        return self._spent(user, minute, windows)

    def _add_usage(self, usage: UsageRow) -> None:
        self._conn().execute(
            "INSERT INTO usage (user, minute, cpu_ms, runs, peak_memory_bytes) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (user, minute) DO UPDATE SET "
            "cpu_ms = cpu_ms + excluded.cpu_ms, runs = runs + excluded.runs, "
            "peak_memory_bytes = max(peak_memory_bytes, excluded.peak_memory_bytes)",
            dataclasses.astuple(usage),
        )

    async def spent(self, user: str, minute: int, windows: tuple[int, ...]) -> tuple[int, ...]:
        found: tuple[int, ...] = await self._call(self._spent, user, minute, windows)
        return found

    def _spent(self, user: str, minute: int, windows: tuple[int, ...]) -> tuple[int, ...]:
        conn = self._conn()
        return tuple(
            int(
                conn.execute(
                    "SELECT coalesce(sum(cpu_ms), 0) FROM usage "
                    "WHERE user = ? AND minute > ? AND minute <= ?",
                    (user, minute - window, minute),
                ).fetchone()[0]
            )
            for window in windows
        )

    async def usage(self, user: str | None, since_minute: int) -> list[UsageRow]:
        found: list[UsageRow] = await self._call(self._usage, user, since_minute)
        return found

    def _usage(self, user: str | None, since_minute: int) -> list[UsageRow]:
        query = "SELECT user, minute, cpu_ms, runs, peak_memory_bytes FROM usage WHERE minute >= ?"
        args: tuple[Any, ...] = (since_minute,)
        if user is not None:
            query, args = query + " AND user = ?", (*args, user)
        rows = self._conn().execute(query + " ORDER BY minute, user", args).fetchall()
        return [UsageRow(*row) for row in rows]

    async def uncount_start(self, user: str, at: float) -> None:
        await self._call(self._uncount_start, user, at)

    def _uncount_start(self, user: str, at: float) -> None:
        self._conn().execute(
            "DELETE FROM starts WHERE rowid IN "
            "(SELECT rowid FROM starts WHERE user = ? AND at = ? LIMIT 1)",
            (user, at),
        )

    async def stored_bytes(self, user: str) -> int:
        found: int = await self._call(self._stored_bytes, user)
        return found

    def _stored_bytes(self, user: str) -> int:
        query = "SELECT coalesce(sum(size), 0) FROM runs WHERE user = ?"
        return int(self._conn().execute(query, (user,)).fetchone()[0])

    async def count_start(self, user: str, now: float, per_minute: int) -> float | None:
        wait: float | None = await self._call(self._count_start, user, now, per_minute)
        return wait

    def _count_start(self, user: str, now: float, per_minute: int) -> float | None:
        conn = self._conn()
        conn.execute("DELETE FROM starts WHERE user = ? AND at <= ?", (user, now - START_WINDOW))
        starts = [
            float(at)
            for (at,) in conn.execute(
                "SELECT at FROM starts WHERE user = ? ORDER BY at", (user,)
            ).fetchall()
        ]
        if len(starts) >= per_minute:
            return max(0.0, starts[len(starts) - per_minute] + START_WINDOW - now)
        conn.execute("INSERT INTO starts (user, at) VALUES (?, ?)", (user, now))
        return None


@dataclasses.dataclass(frozen=True)
class _Row:
    """A record as one row: its columns, the stored JSON and the summary beside it."""

    id: str
    user: str
    status: str
    language: str
    payload: str
    summary: str

    @classmethod
    def of(cls, record: RunRecord, payload: str) -> _Row:
        return cls(record.id, record.user, record.status, record.language, payload, summary(record))


async def _row(record: RunRecord) -> _Row:
    return _Row.of(record, await dump(record))


def _position(text: str) -> float:
    """A creation time as `list_runs` wrote it (`repr` of the float)."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidPosition(text) from None
    if not math.isfinite(value) or repr(value) != text:
        raise InvalidPosition(text)
    return value
