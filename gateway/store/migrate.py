"""Versioned migrations for the PostgreSQL store: the files `migrations/NNNN_name.sql`,
applied in order at start, each once, each in the same transaction as its row in the
`schema_version` table. Replicas that start together take turns (an advisory lock); a
database that a newer gateway already migrated further is refused rather than guessed at.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re

import psycopg
from psycopg import sql

# The key of the advisory lock held while migrating (one-key form: the store's per-user
# locks use the two-key form, a separate key space).
MIGRATION_LOCK = 0x6B67_6D69_6772  # "kgmigr"
_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration this gateway knows, in order (versions 1, 2, ... without gaps)."""
    found = []
    for entry in importlib.resources.files("gateway.store.migrations").iterdir():
        match = _NAME.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations are not numbered 1..n: {[m.version for m in found]}")
    return found


async def migrate(conn: psycopg.AsyncConnection[object]) -> list[int]:
    """Bring the database to the newest schema; the versions applied now."""
    known = migrations()
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            "version integer PRIMARY KEY, name text NOT NULL, "
            "applied timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT COALESCE(max(version), 0) FROM schema_version")
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0  # type: ignore[index]  # a tuple row
        if current > len(known):
            raise RuntimeError(
                f"the database's schema is at version {current}, newer than this gateway "
                f"knows ({len(known)}): upgrade this gateway"
            )
        for migration in known[current:]:
            await conn.execute(sql.SQL(migration.sql))
            await conn.execute(
                "INSERT INTO schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.version)
    return applied
