"""`PostgresLeaseLink`: the heartbeat's own connection to the PostgreSQL store, which also
holds the replica's instance id for as long as the replica lives; and the lease statements
it runs (renew, fail the runs whose lease ran out), which the store also runs on its pool
for a caller without a link (`postgres.py`).

The id is held by a session advisory lock (`pg_try_advisory_lock(instance_lock_key(id))`),
taken when the link connects: a second process with the same id, on any machine, finds it
taken and is refused at start, with the holder named from `pg_stat_activity` (this
connection's `application_name` is `gateway <pid>@<host>`).

If the connection is lost (the server restarted, the network broke), the database drops
the lock with it. The next beat connects again and takes it again; until then a beat
fails, exactly as when the store cannot be reached (nothing is renewed, nobody else's runs
are failed). Two cases at that moment:

- the lock is still held by this process's own previous session (a connection the
  database has not yet seen die): that session is terminated and the lock taken again;
- another process holds it (it started with this id meanwhile, and failed this replica's
  unfinished runs as its own leftovers): `InstanceTaken`. This replica then stops serving
  runs (`gateway/runs/leases.py`): its id is no longer its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Collection
from typing import Any

import psycopg

from gateway.models.record import RunRecord
from gateway.store.base import LeaseLink, Renewal
from gateway.store.instance import InstanceTaken, instance_lock_key, process_name
from gateway.store.postgres_connection import CONNECTION_OPTIONS, Conn, unavailable
from gateway.store.records import encode, summary

log = logging.getLogger(__name__)

TERMINATE_WAIT = 10.0  # seconds for this process's own stale session to end


async def instance_holder(conn: Conn, instance: str) -> tuple[Any, ...] | None:
    """(pid, application_name, client address, since) of the session in this database
    that holds `instance`'s advisory lock (a live gateway of that id), or None."""
    unsigned = instance_lock_key(instance) & 0xFFFF_FFFF_FFFF_FFFF  # shown as two halves
    cursor = await conn.execute(
        "SELECT a.pid, a.application_name, host(a.client_addr), a.backend_start "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s::oid AND l.objid = %s::oid",
        (unsigned >> 32, unsigned & 0xFFFF_FFFF),
    )
    row = await cursor.fetchone()
    return None if row is None else tuple(row)


class PostgresLeaseLink(LeaseLink):
    def __init__(self, dsn: str, replica: str, lease: float) -> None:
        self.dsn = dsn
        self.replica = replica
        self.lease = lease
        self.key = instance_lock_key(replica)
        # who holds the id, as other sessions see it: this process, and this link (a
        # nonce: a pid may be reused on a host once this process is gone)
        self.name = f"gateway {process_name()} {secrets.token_hex(3)}"[:63]
        self._conn: Conn | None = None

    async def connect(self) -> None:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return
        await self.close()
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, application_name=self.name, **CONNECTION_OPTIONS
            )
        except psycopg.Error as exc:
            raise unavailable(exc) from exc
        try:
            await self._hold(conn)
        except BaseException:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
            raise
        self._conn = conn

    async def _hold(self, conn: Conn) -> None:
        """Take the instance id's lock on `conn`, or raise InstanceTaken naming its holder."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TERMINATE_WAIT
        try:
            while True:
                cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
                if (await cursor.fetchone()) == (True,):
                    return
                holder = await instance_holder(conn, self.replica)
                if holder is None or holder[1] != self.name or loop.time() > deadline:
                    break
                # our own session that the database has not yet seen die: end it
                await conn.execute("SELECT pg_terminate_backend(%s)", (holder[0],))
                await asyncio.sleep(0.2)
        except psycopg.Error as exc:
            raise unavailable(exc) from exc
        shown = "unknown" if holder is None else _describe(holder)
        raise InstanceTaken(
            f"the instance id {self.replica!r} is held by another live gateway on this "
            f"database ({shown}): refusing to serve runs under it"
        )

    async def renew(self, run_ids: Collection[str]) -> Renewal:
        conn = await self._connected()
        try:
            if not run_ids:
                await conn.execute("SELECT 1")  # reaching the store is what a beat proves
                return Renewal()
            return await renew_leases(conn, self.replica, self.lease, run_ids)
        except psycopg.Error as exc:
            await self.close()
            raise unavailable(exc) from exc

    async def fail_expired(self, note: str) -> int:
        conn = await self._connected()
        try:
            async with conn.transaction():
                return await fail_expired_runs(conn, note)
        except psycopg.Error as exc:
            await self.close()
            raise unavailable(exc) from exc

    async def _connected(self) -> Conn:
        await self.connect()
        assert self._conn is not None
        return self._conn

    async def close(self) -> None:
        """Close the link; a sound one gives the id's lock back first, so that once this
        returns every session sees the id free (the locks of a closed session go only when
        its server process has ended, a moment later: a replica just stopped would still
        look alive to the others)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not conn.closed and not conn.broken:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()


async def renew_leases(conn: Conn, replica: str, lease: float, run_ids: Collection[str]) -> Renewal:
    """Extend `replica`'s leases on `run_ids`; the cancel requests among them, and the ones
    it no longer holds."""
    ids = list(run_ids)
    cursor = await conn.execute(
        "UPDATE runs SET lease_until = now() + make_interval(secs => %s) "
        "WHERE id = ANY(%s) AND replica = %s AND status IN ('queued', 'running') "
        "RETURNING id, cancel_note",
        (lease, ids, replica),
    )
    rows = await cursor.fetchall()
    held = {str(row[0]) for row in rows}
    cancels = {str(row[0]): str(row[1]) for row in rows if row[1] is not None}
    return Renewal(cancels=cancels, lost=frozenset(set(ids) - held))


async def fail_expired_runs(conn: Conn, note: str) -> int:
    """Claim and fail every unfinished run whose lease ran out (in the caller's transaction)."""
    cursor = await conn.execute(
        "SELECT id, replica, record FROM runs "
        "WHERE lease_until < now() AND status IN ('queued', 'running') "
        "FOR UPDATE SKIP LOCKED"
    )
    return await fail_rows(conn, await cursor.fetchall(), note)


async def fail_rows(conn: Conn, rows: list[Any], note: str) -> int:
    """Mark the claimed unfinished runs failed, each with `note` (naming its replica)."""
    for run_id, replica, payload in rows:
        record = RunRecord.from_storage(json.loads(payload))
        record.fail(note.format(replica=replica))
        stored = encode(record.to_storage())  # at start, or in the heartbeat's thread
        await conn.execute(
            "UPDATE runs SET status = %s, record = %s, size = %s, summary = %s, "
            "lease_until = NULL WHERE id = %s",
            (record.status, stored, len(stored), summary(record), run_id),
        )
    return len(rows)


def _describe(holder: tuple[Any, ...]) -> str:
    pid, name, address, since = holder
    shown = str(name or "").removeprefix("gateway ") or "a session that is not a gateway's"
    where = f" from {address}" if address else ""
    when = f", connected since {since:%Y-%m-%d %H:%M:%S}" if since is not None else ""
    return f"{shown}{where}, server pid {pid}{when}"
