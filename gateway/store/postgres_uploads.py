"""`PostgresShelf`: uploaded archives in the PostgreSQL store's `uploads` table, so that an
upload made through one replica is used by a run on any other, and each user's upload
quota is decided in one place for the whole fleet (a per-user advisory lock around
"delete the oldest past the quota, insert the new one"). Archives are at most
`max_upload_bytes` (21 MiB by default), well within a `bytea`; DESIGN.md decision 9 says
why the database rather than a shared folder. Ages are the database's clock."""

from __future__ import annotations

from typing import Any

from gateway.budget import Quota
from gateway.store.postgres_connection import UPLOADS_LOCK, Connections, lock_user
from gateway.uploads.shelf import ShelvedUpload, UploadShelf, new_upload_id

_COLUMNS = "id, owner, extract(epoch FROM created), entries, unpacked_bytes, size"


class PostgresShelf(UploadShelf):
    """Uploads kept on the store's pool (`connection`: `PostgresStore.connection`), by at
    most `max_parallel` keeps at once (`PostgresStore.upload_connections`)."""

    def __init__(self, connection: Connections, max_parallel: int, ttl: float) -> None:
        self.connection = connection
        self.ttl = ttl
        # a keep holds a pooled connection while it waits for the user's lock: uploads
        # get at most half of the pool (the upload store keeps the rest waiting in-process)
        self.max_parallel = max_parallel

    async def keep(
        self, user: str, data: bytes, entries: int, unpacked_bytes: int, quota: Quota
    ) -> ShelvedUpload:
        async with self.connection() as conn:
            await lock_user(conn, UPLOADS_LOCK, user)
            await conn.execute(
                "DELETE FROM uploads WHERE owner = %s "
                "AND created < now() - make_interval(secs => %s)",
                (user, self.ttl),
            )
            cursor = await conn.execute(
                "SELECT id, size FROM uploads WHERE owner = %s ORDER BY created, id", (user,)
            )
            kept = [(str(row[0]), int(row[1])) for row in await cursor.fetchall()]
            count, total = len(kept) + 1, sum(size for _, size in kept) + len(data)
            doomed: list[str] = []
            while kept and not quota.allows(count, total):
                oldest, size = kept.pop(0)
                doomed.append(oldest)
                count -= 1
                total -= size
            if doomed:
                await conn.execute("DELETE FROM uploads WHERE id = ANY(%s)", (doomed,))
            cursor = await conn.execute(
                "INSERT INTO uploads (id, owner, entries, unpacked_bytes, size, archive) "
                "VALUES (%s, %s, %s, %s, %s, %s) RETURNING " + _COLUMNS,
                (new_upload_id(), user, entries, unpacked_bytes, len(data), data),
            )
            row = await cursor.fetchone()
        assert row is not None
        return _upload(row)

    async def find(self, upload_id: str) -> ShelvedUpload | None:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT id, owner, extract(epoch FROM created), entries, unpacked_bytes, size "
                "FROM uploads WHERE id = %s "
                "AND created >= now() - make_interval(secs => %s)",
                (upload_id, self.ttl),
            )
            row = await cursor.fetchone()
        return None if row is None else _upload(row)

    async def stored_bytes(self, user: str) -> int:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT coalesce(sum(size), 0) FROM uploads WHERE owner = %s "
                "AND created >= now() - make_interval(secs => %s)",
                (user, self.ttl),
            )
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def read(self, upload_id: str) -> bytes | None:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "SELECT archive FROM uploads WHERE id = %s "
                "AND created >= now() - make_interval(secs => %s)",
                (upload_id, self.ttl),
            )
            row = await cursor.fetchone()
        return None if row is None else bytes(row[0])

    async def expire(self) -> int:
        async with self.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM uploads WHERE created < now() - make_interval(secs => %s)",
                (self.ttl,),
            )
            return cursor.rowcount


def _upload(row: Any) -> ShelvedUpload:
    upload_id, owner, created, entries, unpacked_bytes, size = row
    return ShelvedUpload(
        id=str(upload_id),
        user=str(owner),
        created=float(created),
        entries=int(entries),
        unpacked_bytes=int(unpacked_bytes),
        bytes=int(size),
    )
