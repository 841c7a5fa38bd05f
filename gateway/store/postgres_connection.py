"""What the PostgreSQL store's three parts share (`postgres.py`, the store on its pool;
`postgres_leases.py`, the heartbeat's own link; `postgres_uploads.py`, the upload shelf):
how a connection is made, how a failure of the driver becomes `StoreUnavailable`, and the
per-user advisory locks that decide a user's limits fleet-wide.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from gateway.errors import StoreUnavailable

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[Any]
# A connection of the store's pool for the length of a block (`PostgresStore.connection`)
Connections = Callable[[], contextlib.AbstractAsyncContextManager[Conn]]

# first keys of the per-user advisory locks (second: hashtext(user))
RUNS_LOCK = 1  # on the user's runs
UPLOADS_LOCK = 2  # on the user's uploads
STARTS_LOCK = 3  # on the runs the user started lately (the runs-per-minute budget)

# A server that stops answering (a hung host, a network that drops packets) must not hold a
# request and a connection for the minutes TCP takes to give up: connecting is bounded,
# keepalives find a dead peer in about 25 s, and no statement runs longer than 30 s (every
# query of the store is short; the driver's error becomes StoreUnavailable).
CONNECTION_OPTIONS: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 25_000,  # ms: unacknowledged data
    "options": "-c statement_timeout=30000",
}


def unavailable(exc: Exception) -> StoreUnavailable:
    """The 503 for a driver's failure (logged in one line)."""
    log.warning("store: %s", str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
    return StoreUnavailable(
        "The run store cannot be reached now; try again shortly.", retry_after=5
    )


async def lock_user(conn: Conn, kind: int, user: str) -> None:
    """Serialise what decides a user's limits, fleet-wide, until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (kind, user))
