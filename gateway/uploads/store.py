"""The upload store: archives checked by `archives.read_archive`, kept on a shelf
(`shelf.py`: files beside SQLite, or a table of the PostgreSQL store), each usable only by
the user who uploaded it, and deleted `upload_ttl` seconds after the upload.

A run that names the upload unpacks it again, with the same checks against the limits of
that moment. Each user keeps at most an `UploadQuota` of uploads: a new one deletes their
oldest past it (`quota.py`).
"""

from __future__ import annotations

import asyncio
import io

from gateway.errors import NotFound
from gateway.settings import Settings
from gateway.uploads.archives import ArchiveLimits, Unpacked, read_archive
from gateway.uploads.quota import UploadQuota
from gateway.uploads.shelf import UPLOAD_ID, Upload, UploadShelf, new_upload_id

__all__ = ["UPLOAD_ID", "Upload", "UploadStore", "new_upload_id"]


class UploadStore:
    """Uploaded archives. Handlers call `create`; runs call `unpack`."""

    def __init__(self, settings: Settings, shelf: UploadShelf) -> None:
        self.settings = settings
        self.shelf = shelf
        self.quota = UploadQuota(
            uploads=settings.max_uploads_per_user, bytes=settings.max_upload_store_bytes_per_user
        )

    @property
    def limits(self) -> ArchiveLimits:
        return ArchiveLimits.from_settings(self.settings)

    async def create(self, data: bytes, user: str) -> Upload:
        """Check the archive and keep it for `user`; raises the archive_* errors."""
        unpacked = await asyncio.to_thread(read_archive, io.BytesIO(data), self.limits)
        return await self.shelf.keep(
            user, data, unpacked.entries, unpacked.unpacked_bytes, self.quota
        )

    async def find(self, upload_id: str, user: str) -> Upload:
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
        await self.find(upload_id, user)
        data = await self.shelf.read(upload_id)
        if data is None:  # expired between the look-up and the read
            raise _missing(upload_id)
        return await asyncio.to_thread(read_archive, io.BytesIO(data), self.limits, keep=True)


def _missing(upload_id: str) -> NotFound:
    shown = repr(upload_id) if UPLOAD_ID.fullmatch(upload_id) else "with this id"
    return NotFound(f"There is no upload {shown} (uploads expire; upload it again).")
