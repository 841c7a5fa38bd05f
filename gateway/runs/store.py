"""Run records in SQLite under the data dir, so they survive a restart (DESIGN.md decision 9).

sqlite3 is synchronous: every call runs on one dedicated thread, which also serialises
access to the single connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from gateway.runs.models import RunRecord

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


class RecordStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="records")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        self._db = db

    async def close(self) -> None:
        await self._call(self._close)
        self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the record store is not open")
        return self._db

    async def put(self, record: RunRecord) -> None:
        payload = json.dumps(record.to_storage(), separators=(",", ":"))
        await self._call(self._put, record.id, record.user, record.status, payload)

    def _put(self, run_id: str, user: str, status: str, payload: str) -> None:
        self._conn().execute(
            "INSERT INTO runs (id, user, status, created, record) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET status = excluded.status, record = excluded.record",
            (run_id, user, status, time.time(), payload),
        )

    async def get(self, run_id: str) -> RunRecord | None:
        row = await self._call(self._get, run_id)
        return None if row is None else RunRecord.from_storage(json.loads(row))

    def _get(self, run_id: str) -> str | None:
        row = self._conn().execute("SELECT record FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    async def fail_unfinished(self, note: str) -> int:
        """Mark runs left queued or running by a gateway that died as failed."""
        result: int = await self._call(self._fail_unfinished, note)
        return result

    def _fail_unfinished(self, note: str) -> int:
        rows = (
            self._conn()
            .execute("SELECT record FROM runs WHERE status IN ('queued', 'running')")
            .fetchall()
        )
        for (payload,) in rows:
            record = RunRecord.from_storage(json.loads(payload))
            record.status = "failed"
            record.exit_code = None
            record.notes.append(note)
            self._put(record.id, record.user, record.status, json.dumps(record.to_storage()))
        return len(rows)

    async def expire(self, ttl: float) -> int:
        result: int = await self._call(self._expire, time.time() - ttl)
        return result

    def _expire(self, before: float) -> int:
        cursor = self._conn().execute(
            "DELETE FROM runs WHERE created < ? AND status NOT IN ('queued', 'running')",
            (before,),
        )
        return cursor.rowcount
