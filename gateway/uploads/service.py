"""The upload store: archives checked by `archives.read_archive`, kept on a shelf
(`shelf.py`: files beside SQLite, or a table of the PostgreSQL store), each usable only by
the user who uploaded it, and deleted `upload_ttl` seconds after the upload.

A run that names the upload unpacks it again, with the same checks against the limits of
that moment. Each user keeps at most a `Quota` of uploads: a new one deletes their
oldest past it (`ledger.py`).

Checking and keeping an upload takes a thread for seconds and, with PostgreSQL, one of the
store's pooled connections (held while the user's lock is awaited, then while up to 21 MiB
are sent). So a gateway checks and keeps at most `max_concurrent_uploads` at once (and
never more than the shelf allows: half of the store's pool), and at most
`max_concurrent_uploads_per_user` of one user; the rest wait their turn here, in order,
holding nothing but their body, and after `upload_wait_timeout` are refused with 429
`capacity`. One user's flood of uploads so waits for itself: it cannot take the
connections that admission, records, leases and health need, nor other users' turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Sequence

from gateway.budget import ByteBudget
from gateway.errors import NotFound, RateLimited
from gateway.models.request import StagedFile
from gateway.uploads.archives import ArchiveLimits, Unpacked, read_archive
from gateway.uploads.config import UploadsConfig
from gateway.uploads.kept import pack, read_limits
from gateway.uploads.shelf import UPLOAD_ID, ShelvedUpload, UploadShelf, new_upload_id

__all__ = ["UPLOAD_ID", "ShelvedUpload", "UploadService", "new_upload_id"]


class UploadService:
    """Uploaded archives. Handlers call `create`; runs call `unpack`, and `keep_files` and
    `unpack_kept` for the files they were given (`keep_files`, `files_from`)."""

    def __init__(self, config: UploadsConfig, shelf: UploadShelf) -> None:
        self.config = config
        self.shelf = shelf
        self.quota = config.quota()
        at_once = config.max_concurrent_uploads
        if shelf.max_parallel is not None:
            at_once = min(at_once, shelf.max_parallel)
        # turns, not bytes: one unit per upload being checked and kept
        self.turns = ByteBudget("uploads", at_once, config.max_concurrent_uploads_per_user)

    @property
    def limits(self) -> ArchiveLimits:
        return self.config.archive_limits()

    async def create(self, data: bytes, user: str) -> ShelvedUpload:
        """Check the archive and keep it for `user`, in turn; raises the archive_* errors,
        and RateLimited when no turn came within `upload_wait_timeout`."""
        async with self._turn(user):
            unpacked = await asyncio.to_thread(read_archive, io.BytesIO(data), self.limits)
            return await self.shelf.keep(
                user, data, unpacked.entries, unpacked.unpacked_bytes, self.quota
            )

    @contextlib.asynccontextmanager
    async def _turn(self, user: str, wait: float | None = None) -> AsyncIterator[None]:
        wait = self.config.upload_wait_timeout if wait is None else wait
        try:
            hold = await self.turns.take(1, user, timeout=wait)
        except TimeoutError:
            mine = self.turns.held_by(user)
            if mine >= self.config.max_concurrent_uploads_per_user:
                why = f"You already have {mine} uploads being checked and stored"
            else:
                why = "This gateway is busy storing other uploads"
            raise RateLimited(
                f"{why}; this one waited {wait:g} s for its turn. Try again shortly.",
                retry_after=5,
            ) from None
        with hold:
            yield

    async def keep_files(
        self, files: Sequence[StagedFile], user: str, wait: float
    ) -> ShelvedUpload:
        """Keep a run's staged files for `user` as an upload of the gateway's own making
        (`kept.py`), in turn and within their quota, as an upload is kept; raises
        RateLimited when no turn came within `wait` seconds (a run does not wait long)."""
        async with self._turn(user, wait):
            data = await asyncio.to_thread(pack, files)
            unpacked_bytes = sum(len(f.data) for f in files)
            return await self.shelf.keep(user, data, len(files), unpacked_bytes, self.quota)

    async def unpack_kept(self, upload_id: str, user: str) -> Unpacked:
        """The files `keep_files` kept, read back under the limits of a request's `files`
        (NotFound when they went)."""
        limits = read_limits(
            self.config.max_files, self.config.max_file_bytes, self.config.max_files_bytes
        )
        return await self._unpack(upload_id, user, limits)

    async def find(self, upload_id: str, user: str) -> ShelvedUpload:
        """`user`'s upload, checked to exist (cheap: nothing is unpacked). A missing,
        expired or someone else's upload is NotFound."""
        if not UPLOAD_ID.fullmatch(upload_id):
            raise _missing(upload_id)
        upload = await self.shelf.find(upload_id)
        if upload is None or upload.user != user:
            raise _missing(upload_id)
        return upload

    async def unpack(self, upload_id: str, user: str) -> Unpacked:
        """The files of `user`'s upload, checked again while unpacked. A missing, expired or
        someone else's upload is NotFound."""
        return await self._unpack(upload_id, user, self.limits)

    async def _unpack(self, upload_id: str, user: str, limits: ArchiveLimits) -> Unpacked:
        await self.find(upload_id, user)
        data = await self.shelf.read(upload_id)
        if data is None:  # expired between the look-up and the read
            raise _missing(upload_id)
        return await asyncio.to_thread(read_archive, io.BytesIO(data), limits, keep=True)


def _missing(upload_id: str) -> NotFound:
    shown = repr(upload_id) if UPLOAD_ID.fullmatch(upload_id) else "with this id"
    return NotFound(f"There is no upload {shown} (uploads expire; upload it again).")
