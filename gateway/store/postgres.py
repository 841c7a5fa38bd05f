"""`PostgresStore`: the store of a fleet of gateway replicas on one PostgreSQL database
(`--store postgresql://...`), through psycopg 3's async connections and its pool.

- Every replica answers for every run: the record is in `runs`, whichever replica wrote it.
- The replica that admitted a run runs it (`replica`) and holds a lease on it
  (`lease_until`, the database's clock), renewed by its heartbeat; a replica that finds a
  lease run out fails the run with a note (`fail_expired`), so that nothing stays
  "running" after its replica died. Rows are claimed `FOR UPDATE SKIP LOCKED`: each is
  failed once, however many replicas look.
- The heartbeat (`postgres_leases.py`) renews leases on a connection of its own, which
  also holds the replica's instance id (a session advisory lock) while the replica lives,
  and `/v1/health`'s ping has one of its own: neither waits behind the pool, which
  requests (and at most `upload_connections` uploads at once: `postgres_uploads.py`)
  share. The three parts share how they connect and lock (`postgres_connection.py`).
- A cancel asked of another replica sets `cancel_note` and sends `NOTIFY gateway_cancel`;
  the owner LISTENs on a connection of its own and cancels the run at once. A notification
  missed while that connection was down is found by the next heartbeat (`renew` returns
  the rows whose `cancel_note` is set).
- A background run that finds every slot of its replica busy waits in `queued_runs` with its
  request, unleased, for whichever replica has a slot free first (`claim`: the oldest rows,
  `FOR UPDATE SKIP LOCKED`, so each is taken once however many replicas claim at once; the
  claimer deletes the row and takes the run's lease in one transaction). `NOTIFY
  gateway_queue` wakes every replica's claims loop when one is queued.
- The per-user limits are decided in the database: admission counts the user's unfinished
  runs and inserts under a transaction-scoped advisory lock per user, so two replicas
  admitting at once cannot both take the last place.
- The schema is versioned (`migrate.py`), applied when the store opens.

Errors of the driver (the server is down, restarting, unreachable; the pool has no
connection in time) become `StoreUnavailable` (503), never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import psycopg
import psycopg_pool
from psycopg import conninfo

from gateway.budget import Quota
from gateway.models.record import RunRecord
from gateway.store.base import (
    START_WINDOW,
    USAGE_KEPT_MINUTES,
    Claimed,
    Finished,
    InvalidPosition,
    Listed,
    QueueFull,
    RecordStore,
    Renewal,
    RunQuery,
    UsageRow,
)
from gateway.store.config import StoreConfig
from gateway.store.migrate import migrate
from gateway.store.postgres_connection import (
    CONNECTION_OPTIONS,
    RUNS_LOCK,
    STARTS_LOCK,
    Conn,
    lock_user,
    unavailable,
)
from gateway.store.postgres_leases import (
    PostgresLeaseLink,
    fail_expired_runs,
    fail_rows,
    instance_holder,
    renew_leases,
)
from gateway.store.postgres_uploads import PostgresShelf
from gateway.store.records import dump, load, summary, summary_of_stored
from gateway.uploads.shelf import UploadShelf

log = logging.getLogger(__name__)

CHANNEL = "gateway_cancel"
QUEUED = "gateway_queue"  # a run was queued: free slots anywhere may claim it
QUEUE_LOCK = 4  # on a replica's share of the queue (beside postgres_connection's kinds)
CLAIM_WINDOW = 8  # the oldest queued runs a claim chooses from (by the users' slots held)


def redact(dsn: str) -> dict[str, str]:
    """What may be shown of a DSN: host, port, database, user; never the password."""
    parts = conninfo.conninfo_to_dict(dsn)
    return {k: str(parts[k]) for k in ("host", "port", "dbname", "user") if parts.get(k)}


class PostgresStore(RecordStore):
    kind = "postgresql"
    shared = True
    queues = True

    def __init__(
        self,
        dsn: str,
        replica: str,
        lease: float = 30.0,
        pool_size: int = 10,
        open_timeout: float = 30.0,
        wait_timeout: float = 10.0,
    ) -> None:
        super().__init__(replica)
        self.dsn = dsn
        self.lease = lease
        self.open_timeout = open_timeout
        # uploads hold a connection while they wait for their user's lock and send up to
        # 21 MiB: at most half of the pool, so that they never starve everything else
        self.upload_connections = max(1, pool_size // 2)
        self.pool = psycopg_pool.AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=wait_timeout,  # for a connection of the pool; then StoreUnavailable
            check=psycopg_pool.AsyncConnectionPool.check_connection,
            name=f"store-{replica}",
            kwargs=CONNECTION_OPTIONS,
        )
        self._listener: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        self._pinger: Conn | None = None  # the health ping's own connection
        self._ping_lock = asyncio.Lock()

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        try:
            await self.pool.open(wait=True, timeout=self.open_timeout)
        except psycopg_pool.PoolTimeout as exc:
            raise RuntimeError(
                f"the store PostgreSQL {redact(self.dsn)} cannot be reached: {exc}"
            ) from None
        async with self.pool.connection() as conn:
            applied = await migrate(conn)
        if applied:
            log.info("store: schema migrated to version %d", applied[-1])
        self._listener = asyncio.create_task(self._listen())

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._late_ping is not None:  # a ping on a store that hangs: it fails at close
            await self._close_pinger()
            await asyncio.wait({self._late_ping}, timeout=5)
        await self._close_pinger()
        await self.pool.close()

    def upload_shelf(self, config: StoreConfig) -> UploadShelf:
        return PostgresShelf(self.connection, self.upload_connections, config.upload_ttl)

    async def ping(self) -> None:
        """On a connection of its own (made again when lost), never one of the pool: a pool
        that uploads or a burst of requests hold does not make a healthy store look down."""
        async with self._ping_lock:
            reused = self._pinger is not None and not self._pinger.closed
            try:
                await self._ping_once()
            except psycopg.Error as exc:
                await self._close_pinger()
                if not reused:
                    raise unavailable(exc) from exc
                # a connection the server dropped since the last ping (it restarted): a
                # new one says whether the store answers now
                try:
                    await self._ping_once()
                except psycopg.Error as again:
                    await self._close_pinger()
                    raise unavailable(again) from again

    async def _ping_once(self) -> None:
        if self._pinger is None or self._pinger.closed or self._pinger.broken:
            await self._close_pinger()
            self._pinger = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, **CONNECTION_OPTIONS
            )
        await self._pinger.execute("SELECT 1")

    async def _close_pinger(self) -> None:
        pinger, self._pinger = self._pinger, None
        if pinger is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await pinger.close()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, **redact(self.dsn), "replica": self.replica}

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Conn]:
        """A connection of the pool, in a transaction committed at the end of the block;
        the driver's failures become StoreUnavailable."""
        try:
            async with self.pool.connection(timeout=timeout) as conn:
                yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            raise unavailable(exc) from exc

    # --- run records --------------------------------------------------------------------

    async def admit(self, record: RunRecord, limit: int) -> int | None:
        payload = await dump(record)
        async with self.connection() as conn:
            mine = await _in_progress(conn, record.user)
            if mine >= limit:
                return mine
            await self._insert_run(conn, record, payload, self.lease)
        return None

    async def _insert_run(
        self, conn: Conn, record: RunRecord, payload: str, lease: float | None
    ) -> None:
        """The run's row, this replica's: leased for `lease` seconds, or unleased (None: a
        NULL interval makes a NULL `lease_until`)."""
        await conn.execute(
            "INSERT INTO runs (id, owner, status, record, size, replica, lease_until, "
            "language, summary) "
            "VALUES (%s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s), %s, %s)",
            (
                record.id,
                record.user,
                record.status,
                payload,
                len(payload),
                self.replica,
                lease,
                record.language,
                summary(record),
            ),
        )

    # --- the queue of runs any replica may take ----------------------------------------

    async def enqueue(
        self, record: RunRecord, limit: int, request: str, cap: int, version: int = 1
    ) -> int | None:
        payload = await dump(record)
        async with self.connection() as conn:
            mine = await _in_progress(conn, record.user)
            if mine >= limit:
                return mine
            await lock_user(conn, QUEUE_LOCK, self.replica)
            cursor = await conn.execute(
                "SELECT count(*) FROM queued_runs WHERE origin = %s", (self.replica,)
            )
            if int((await _one(cursor))[0]) >= cap:
                raise QueueFull(self.replica)
            await self._insert_run(conn, record, payload, None)  # unleased: no one runs it
            await conn.execute(
                "INSERT INTO queued_runs (id, owner, origin, request, version, size) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (record.id, record.user, self.replica, request, version, len(request)),
            )
            await conn.execute("SELECT pg_notify(%s, '')", (QUEUED,))  # on commit
        return None

    async def claim(self, held: Mapping[str, int], share: int, version: int = 1) -> Claimed | None:
        full = [user for user, count in held.items() if count >= share]
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT id, owner FROM queued_runs WHERE owner <> ALL(%s::text[]) "
                "AND version <= %s ORDER BY queued, id LIMIT %s FOR UPDATE SKIP LOCKED",
                (full, version, CLAIM_WINDOW),
            )
            rows = await cursor.fetchall()
            if not rows:
                return None
            # the user holding fewest slots here first, then the oldest (rows are in order)
            run_id = min(rows, key=lambda row: held.get(str(row[1]), 0))[0]
            cursor = await conn.execute(
                "DELETE FROM queued_runs WHERE id = %s RETURNING origin, request", (run_id,)
            )
            taken = await cursor.fetchone()
            if taken is None:  # gone meanwhile (never so under the row's lock): take nothing
                return None
            origin, request = taken
            cursor = await conn.execute(
                "UPDATE runs SET replica = %s, lease_until = now() + make_interval(secs => %s) "
                "WHERE id = %s AND status = 'queued' RETURNING record",
                (self.replica, self.lease, run_id),
            )
            row = await cursor.fetchone()
        if row is None:  # not queued any more (never so: a cancel takes the row with it)
            log.warning("store: the queued run %s had no queued record; dropped", run_id)
            return None
        return Claimed(await load(row[0]), str(request), str(origin))

    async def queued_from(self) -> int:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM queued_runs WHERE origin = %s", (self.replica,)
            )
            return int((await _one(cursor))[0])

    async def unqueue(self, run_id: str, note: str) -> RunRecord | None:
        async with self.connection() as conn:
            # waits for a claim that holds the row, and then finds it gone
            cursor = await conn.execute(
                "DELETE FROM queued_runs WHERE id = %s RETURNING id", (run_id,)
            )
            if await cursor.fetchone() is None:
                return None
            cursor = await conn.execute(
                "SELECT record FROM runs WHERE id = %s FOR UPDATE", (run_id,)
            )
            record = await load((await _one(cursor))[0])
            record.cancel_unstarted("The run was cancelled before it started.")
            record.notes.append(note)
            payload = await dump(record)
            await conn.execute(
                "UPDATE runs SET status = %s, record = %s, size = %s, summary = %s, "
                "lease_until = NULL WHERE id = %s",
                (record.status, payload, len(payload), summary(record), run_id),
            )
        return record

    async def update(self, record: RunRecord) -> bool:
        payload = await dump(record)
        async with self.connection() as conn:
            cursor = await conn.execute(
                "UPDATE runs SET status = %s, record = %s, size = %s, summary = %s "
                "WHERE id = %s AND replica = %s AND status IN ('queued', 'running')",
                (record.status, payload, len(payload), summary(record), record.id, self.replica),
            )
            return cursor.rowcount > 0

    async def finish(
        self, record: RunRecord, quota: Quota | None = None, usage: UsageRow | None = None
    ) -> Finished:
        payload = await dump(record)
        async with self.connection() as conn:
            if usage is not None:  # spent, whoever's record stands
                await _add_usage(conn, usage)
            await lock_user(conn, RUNS_LOCK, record.user)
            cursor = await conn.execute(
                "UPDATE runs SET status = %s, record = %s, size = %s, summary = %s, "
                "lease_until = NULL "
                "WHERE id = %s AND replica = %s AND status IN ('queued', 'running')",
                (record.status, payload, len(payload), summary(record), record.id, self.replica),
            )
            if cursor.rowcount == 0:
                return Finished(kept=False)
            evicted = 0 if quota is None else await _enforce(conn, record.user, record.id, quota)
        return Finished(evicted=evicted)

    async def amend(self, record: RunRecord) -> bool:
        payload = await dump(record)
        async with self.connection() as conn:
            cursor = await conn.execute(
                "UPDATE runs SET record = %s, size = %s, summary = %s "
                "WHERE id = %s AND status NOT IN ('queued', 'running')",
                (payload, len(payload), summary(record), record.id),
            )
        return cursor.rowcount > 0

    async def instance_alive(self, instance: str) -> bool:
        """A live replica holds its id's advisory lock (`postgres_leases`)."""
        async with self.connection() as conn:
            return await instance_holder(conn, instance) is not None

    async def get(self, run_id: str) -> RunRecord | None:
        async with self.connection() as conn:
            cursor = await conn.execute("SELECT record FROM runs WHERE id = %s", (run_id,))
            row = await cursor.fetchone()
        return None if row is None else await load(row[0])

    async def list_runs(self, query: RunQuery) -> list[Listed]:
        parameters = query.parameters(_position)
        async with self.connection() as conn:
            # the record only where no summary was kept (rows of an older gateway)
            cursor = await conn.execute(
                "SELECT created, id, summary, CASE WHEN summary IS NULL THEN record END "
                "FROM runs WHERE owner = %(owner)s "
                "AND (%(status)s::text IS NULL OR status = %(status)s) "
                "AND (%(language)s::text IS NULL OR language = %(language)s) "
                "AND (%(created)s::timestamptz IS NULL "
                "OR (created, id) < (%(created)s, %(after)s)) "
                "ORDER BY created DESC, id DESC LIMIT %(limit)s",
                parameters,
            )
            rows = await cursor.fetchall()
        listed = []
        for made, run_id, kept, payload in rows:
            data = json.loads(kept) if kept is not None else await summary_of_stored(payload)
            listed.append(Listed(data, (made.astimezone(dt.UTC).isoformat(), str(run_id))))
        return listed

    async def expire(self, ttl: float) -> int:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM runs WHERE created < now() - make_interval(secs => %s) "
                "AND NOT status IN ('queued', 'running')",
                (ttl,),
            )
            oldest = int(time.time() // 60) - USAGE_KEPT_MINUTES
            await conn.execute("DELETE FROM usage WHERE minute < %s", (oldest,))
            await conn.execute("DELETE FROM starts WHERE at < %s", (time.time() - START_WINDOW,))
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
        async with self.connection() as conn:
            await _add_usage(conn, UsageRow(user, minute, cpu_ms, runs, peak_memory_bytes))
            return await _windows(conn, user, minute, windows)  # this addition included

    async def spent(self, user: str, minute: int, windows: tuple[int, ...]) -> tuple[int, ...]:
        async with self.connection() as conn:
            return await _windows(conn, user, minute, windows)

    async def usage(self, user: str | None, since_minute: int) -> list[UsageRow]:
        query = (
            "SELECT owner, minute, cpu_ms, runs, peak_memory_bytes FROM usage WHERE minute >= %s"
        )
        args: tuple[Any, ...] = (since_minute,)
        if user is not None:
            query, args = query + " AND owner = %s", (*args, user)
        async with self.connection() as conn:
            cursor = await conn.execute(query + " ORDER BY minute, owner", args)
            rows = await cursor.fetchall()
        return [UsageRow(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]

    async def uncount_start(self, user: str, at: float) -> None:
        async with self.connection() as conn:
            await conn.execute(
                "DELETE FROM starts WHERE ctid IN "
                "(SELECT ctid FROM starts WHERE owner = %s AND at = %s LIMIT 1)",
                (user, at),
            )

    async def stored_bytes(self, user: str) -> int:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT coalesce(sum(size), 0) FROM runs WHERE owner = %s", (user,)
            )
            return int((await _one(cursor))[0])

    async def count_start(self, user: str, now: float, per_minute: int) -> float | None:
        async with self.connection() as conn:
            await lock_user(conn, STARTS_LOCK, user)  # one decision at a time, fleet-wide
            await conn.execute(
                "DELETE FROM starts WHERE owner = %s AND at <= %s", (user, now - START_WINDOW)
            )
            cursor = await conn.execute(
                "SELECT at FROM starts WHERE owner = %s ORDER BY at", (user,)
            )
            starts = [float(row[0]) for row in await cursor.fetchall()]
            if len(starts) >= per_minute:
                return max(0.0, starts[len(starts) - per_minute] + START_WINDOW - now)
            await conn.execute("INSERT INTO starts (owner, at) VALUES (%s, %s)", (user, now))
        return None

    # --- replicas -----------------------------------------------------------------------

    async def recover(self, note: str) -> int:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT id, replica, record FROM runs "
                "WHERE replica = %s AND status IN ('queued', 'running') "
                "AND NOT EXISTS (SELECT 1 FROM queued_runs q WHERE q.id = runs.id) "
                "FOR UPDATE SKIP LOCKED",
                (self.replica,),
            )
            return await fail_rows(conn, await cursor.fetchall(), note)

    def lease_link(self) -> PostgresLeaseLink:
        return PostgresLeaseLink(self.dsn, self.replica, self.lease)

    # The heartbeat renews and fails through its own link; these (on the pool) are the
    # same statements, for a caller without a link.

    async def fail_expired(self, note: str) -> int:
        async with self.connection() as conn:
            return await fail_expired_runs(conn, note)

    async def renew(self, run_ids: Collection[str]) -> Renewal:
        if not run_ids:
            return Renewal()
        async with self.connection() as conn:
            return await renew_leases(conn, self.replica, self.lease, run_ids)

    async def request_cancel(self, run_id: str, note: str) -> bool:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "UPDATE runs SET cancel_note = COALESCE(cancel_note, %s) "
                "WHERE id = %s AND status IN ('queued', 'running') RETURNING replica, cancel_note",
                (note, run_id),
            )
            row = await cursor.fetchone()
            if row is None:
                return False
            message = json.dumps({"replica": row[0], "run": run_id, "note": row[1]})
            await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, message))  # on commit
        return True

    async def _listen(self) -> None:
        """Hear cancel requests for this replica's runs, and runs queued by any replica, on a
        connection of its own; after a lost connection, connect again (the heartbeat covers
        the gap for cancels, the claims loop's polling for queued runs)."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, **CONNECTION_OPTIONS
                )
                async with conn:
                    await conn.execute("LISTEN gateway_cancel")
                    await conn.execute("LISTEN gateway_queue")
                    self.listening.set()
                    async for notify in conn.notifies():
                        if notify.channel == QUEUED:
                            if self.on_queued is not None:
                                self.on_queued()
                        else:
                            self._heard(notify.payload)
            except (psycopg.Error, OSError) as exc:
                log.warning("store: the cancel listener lost its connection: %s", exc)
            except Exception:  # never end: cancels would then wait for the heartbeat
                log.exception("store: the cancel listener failed")
            self.listening.clear()
            await asyncio.sleep(1.0)

    def _heard(self, payload: str) -> None:
        try:
            message = json.loads(payload)
            replica, run_id, note = str(message["replica"]), str(message["run"]), message["note"]
        except (ValueError, KeyError, TypeError):
            log.warning("store: a cancel notification that is not ours: %.200r", payload)
            return
        if replica == self.replica and self.on_cancel is not None:
            self.on_cancel(run_id, str(note or "The run was cancelled."))


async def _in_progress(conn: Conn, user: str) -> int:
    """`user`'s runs queued or running, anywhere, counted under their lock (held to the end
    of the transaction: two admissions of one user are one after the other)."""
    await lock_user(conn, RUNS_LOCK, user)
    cursor = await conn.execute(
        "SELECT count(*) FROM runs WHERE owner = %s AND status IN ('queued', 'running')",
        (user,),
    )
    return int((await _one(cursor))[0])


async def _one(cursor: psycopg.AsyncCursor[Any]) -> Any:
    row = await cursor.fetchone()
    assert row is not None
    return row


async def _enforce(conn: Conn, user: str, keep: str, quota: Quota) -> int:
    """Delete `user`'s oldest finished records (never `keep`) until within `quota`."""
    cursor = await conn.execute(
        "SELECT count(*), COALESCE(sum(size), 0) FROM runs WHERE owner = %s", (user,)
    )
    count, total = (int(v) for v in await _one(cursor))
    if quota.allows(count, total):
        return 0
    cursor = await conn.execute(
        "SELECT id, size FROM runs WHERE owner = %s AND id != %s "
        "AND NOT status IN ('queued', 'running') ORDER BY created, id",
        (user, keep),
    )
    doomed: list[str] = []
    async for run_id, size in cursor:
        if quota.allows(count, total):
            break
        doomed.append(str(run_id))
        count -= 1
        total -= int(size)
    if doomed:
        await conn.execute("DELETE FROM runs WHERE id = ANY(%s)", (doomed,))
    return len(doomed)


def _position(text: str) -> dt.datetime:
    """A creation time as `list_runs` wrote it (ISO 8601, UTC: any other offset could be
    one PostgreSQL refuses, which would be its error, not the caller's)."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidPosition(text) from None
    if value.utcoffset() != dt.timedelta(0) or value.isoformat() != text:
        raise InvalidPosition(text)
    return value


async def _add_usage(conn: Conn, usage: UsageRow) -> None:
    await conn.execute(
        "INSERT INTO usage (owner, minute, cpu_ms, runs, peak_memory_bytes) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (owner, minute) DO UPDATE SET "
        "cpu_ms = usage.cpu_ms + excluded.cpu_ms, runs = usage.runs + excluded.runs, "
        "peak_memory_bytes = greatest(usage.peak_memory_bytes, excluded.peak_memory_bytes)",
        (usage.user, usage.minute, usage.cpu_ms, usage.runs, usage.peak_memory_bytes),
    )


async def _windows(conn: Conn, user: str, minute: int, windows: tuple[int, ...]) -> tuple[int, ...]:
    """`user`'s CPU milliseconds in each window of minutes up to `minute`."""
    found = []
    for window in windows:
        cursor = await conn.execute(
            "SELECT coalesce(sum(cpu_ms), 0) FROM usage "
            "WHERE owner = %s AND minute > %s AND minute <= %s",
            (user, minute - window, minute),
        )
        found.append(int((await _one(cursor))[0]))
    return tuple(found)
