"""Uploads take turns (issue 20, row 5): checking and keeping an upload holds a thread and,
with PostgreSQL, one of the store's pooled connections, so a gateway keeps at most
`max_concurrent_uploads` at once (never more than its shelf allows: half of PostgreSQL's
pool) and `max_concurrent_uploads_per_user` of one user. The rest wait in-process, holding
nothing of the store, and past `upload_wait_timeout` are 429 `capacity`.

The shelf here is a stand-in at the `UploadShelf` interface whose `keep` waits until the
test lets it go, so that "an upload is being kept" is a state the test controls (the
archive checks before it are the real ones). Before: every upload went to the shelf at
once (PostgreSQL: each took a pooled connection and waited for its user's lock on it)."""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import Awaitable
from typing import Any

import pytest

from gateway.budget import Quota
from gateway.errors import RateLimited
from gateway.store.config import StoreConfig
from gateway.uploads.config import UploadsConfig
from gateway.uploads.service import UploadService
from gateway.uploads.shelf import ShelvedUpload, UploadShelf, new_upload_id
from tests.support import part_config

pytestmark = [pytest.mark.attack, pytest.mark.fast]


class HeldShelf(UploadShelf):
    """Keeps nothing: each `keep` waits until `release()`; `keeping` counts those waiting."""

    def __init__(self, max_parallel: int | None = None) -> None:
        self.max_parallel = max_parallel
        self.keeping: list[str] = []
        self.go = asyncio.Event()
        self.changed = asyncio.Condition()

    async def keep(
        self, user: str, data: bytes, entries: int, unpacked_bytes: int, quota: Quota
    ) -> ShelvedUpload:
        async with self.changed:
            self.keeping.append(user)
            self.changed.notify_all()
        await self.go.wait()
        self.keeping.remove(user)
        return ShelvedUpload(new_upload_id(), user, 0.0, entries, unpacked_bytes, len(data))

    async def reach(self, users: list[str]) -> None:
        """Until exactly `users` are being kept (in any order)."""
        async with self.changed:
            await self.changed.wait_for(lambda: sorted(self.keeping) == sorted(users))

    async def find(self, upload_id: str) -> ShelvedUpload | None:
        return None

    async def stored_bytes(self, user: str) -> int:
        return 0

    async def read(self, upload_id: str) -> bytes | None:
        return None

    async def expire(self) -> int:
        return 0


def archive() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("a.txt", "a")
    return buffer.getvalue()


def store(shelf: UploadShelf, **settings: Any) -> UploadService:
    return UploadService(part_config(UploadsConfig, **settings), shelf)


def start(coroutine: Awaitable[ShelvedUpload]) -> asyncio.Future[ShelvedUpload]:
    return asyncio.ensure_future(coroutine)


def test_one_user_waits_for_their_own_turn_and_others_go_ahead() -> None:
    """ann may keep one at a time: her second waits (not at the shelf), then is refused
    with 429 `capacity` naming her uploads; bob's goes through meanwhile; once ann's first
    is kept, her next one is taken."""

    async def main() -> None:
        shelf = HeldShelf()
        uploads = store(shelf, max_concurrent_uploads_per_user=1, upload_wait_timeout=0.5)
        first = start(uploads.create(archive(), "ann"))
        await shelf.reach(["ann"])
        with pytest.raises(RateLimited, match="You already have 1 uploads") as refused:
            await asyncio.wait_for(uploads.create(archive(), "ann"), 10)
        assert refused.value.retry_after and refused.value.status == 429
        bobs = start(uploads.create(archive(), "bob"))
        await shelf.reach(["ann", "bob"])
        later = start(uploads.create(archive(), "ann"))
        await asyncio.sleep(0.1)
        assert sorted(shelf.keeping) == ["ann", "bob"]  # waits, in-process
        shelf.go.set()
        for upload in await asyncio.gather(first, bobs, later):
            assert upload.entries == 1

    asyncio.run(main())


def test_the_gateway_keeps_at_most_its_cap_and_its_shelfs_at_once() -> None:
    """At most `max_concurrent_uploads` at the shelf, and never more than the shelf allows
    (PostgreSQL: half its pool); one more is refused after its wait, saying the gateway is
    busy."""

    async def main() -> None:
        for cap, shelf_cap, expected in ((2, None, 2), (8, 3, 3)):
            shelf = HeldShelf(max_parallel=shelf_cap)
            uploads = store(
                shelf,
                max_concurrent_uploads=cap,
                max_concurrent_uploads_per_user=8,
                upload_wait_timeout=0.3,
            )
            users = [f"user{i}" for i in range(expected)]
            held = [start(uploads.create(archive(), user)) for user in users]
            await shelf.reach(users)
            with pytest.raises(RateLimited, match="busy storing other uploads"):
                await asyncio.wait_for(uploads.create(archive(), "late"), 10)
            assert len(shelf.keeping) == expected
            shelf.go.set()
            await asyncio.gather(*held)

    asyncio.run(main())


def test_the_postgresql_shelf_allows_half_the_pool() -> None:
    from gateway.store.postgres import PostgresStore

    store = PostgresStore("postgresql://gateway@127.0.0.1:1/none", "a", pool_size=10)
    shelf = store.upload_shelf(part_config(StoreConfig))
    assert shelf.max_parallel == 5
