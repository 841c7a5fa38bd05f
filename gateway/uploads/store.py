"""The upload store: archives kept under `<data_dir>/uploads/`, each usable only by the user
who uploaded it, and deleted `upload_ttl` seconds after the upload.

An upload is two files: `<id>.archive` (the bytes as received, kept only after they passed
every check of `archives.read_archive`) and `<id>.json` (owner, time, entries, bytes),
written in that order, each atomically. A run that names the upload unpacks it again, with
the same checks against the limits of that moment. All file work happens in a thread;
expired uploads are swept whenever an upload is created or looked up. Each user keeps at
most an `UploadQuota` of uploads: a new one deletes their oldest past it (`quota`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from gateway.errors import NotFound
from gateway.settings import Settings
from gateway.uploads.archives import ArchiveLimits, Unpacked, read_archive
from gateway.uploads.quota import Kept, UploadLedger, UploadQuota

UPLOAD_ID = re.compile(r"upl_[0-9a-f]{32}")


def new_upload_id() -> str:
    return "upl_" + secrets.token_hex(16)


@dataclasses.dataclass(frozen=True)
class Upload:
    id: str
    user: str
    created: float  # seconds since the epoch
    entries: int
    unpacked_bytes: int
    bytes: int = 0  # the archive as stored (0: written by an older gateway)

    def to_json(self) -> dict[str, Any]:
        """The answer of `POST /v1/uploads`."""
        return {"id": self.id, "entries": self.entries, "unpacked_bytes": self.unpacked_bytes}


class UploadStore:
    """Uploaded archives on disk. Handlers call `create`; runs call `unpack`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.data_dir / "uploads"
        self.quota = UploadQuota(
            uploads=settings.max_uploads_per_user, bytes=settings.max_upload_store_bytes_per_user
        )
        self._ledger = UploadLedger(self.root, self._archive)
        self._lock = threading.Lock()  # creating (and deleting to make room) one at a time

    @property
    def limits(self) -> ArchiveLimits:
        return ArchiveLimits.from_settings(self.settings)

    async def create(self, data: bytes, user: str) -> Upload:
        """Check the archive and keep it for `user`; raises the archive_* errors."""
        return await asyncio.to_thread(self._create, data, user)

    async def find(self, upload_id: str, user: str) -> Upload:
        """`user`'s upload, checked to exist (cheap: nothing is unpacked). A missing,
        expired or someone else's upload is NotFound."""
        return await asyncio.to_thread(self._find, upload_id, user)

    async def unpack(self, upload_id: str, user: str) -> Unpacked:
        """The files of `user`'s upload, checked again while unpacked. A missing, expired or
        someone else's upload is NotFound."""
        return await asyncio.to_thread(self._unpack, upload_id, user)

    # --- in a thread ------------------------------------------------------------------

    def _create(self, data: bytes, user: str) -> Upload:
        unpacked = read_archive(io.BytesIO(data), self.limits)
        with self._lock:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._sweep()
            for old in self._ledger.make_room(user, len(data), self.quota, self._alive):
                self._delete(old.id)
            upload = Upload(
                id=new_upload_id(),
                user=user,
                created=time.time(),
                entries=unpacked.entries,
                unpacked_bytes=unpacked.unpacked_bytes,
                bytes=len(data),
            )
            _write_atomically(self._archive(upload.id), data)
            meta = json.dumps(dataclasses.asdict(upload)).encode()
            _write_atomically(self._meta(upload.id), meta)
            self._ledger.add(user, Kept(upload.id, upload.created, len(data)))
        return upload

    def _delete(self, upload_id: str) -> None:
        """Delete an upload: its metadata first, so that it is not found half-deleted."""
        for path in (self._meta(upload_id), self._archive(upload_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _unpack(self, upload_id: str, user: str) -> Unpacked:
        self._find(upload_id, user)
        try:
            with self._archive(upload_id).open("rb") as source:
                return read_archive(source, self.limits, keep=True)
        except FileNotFoundError as exc:  # expired between the look-up and the read
            raise _missing(upload_id) from exc

    def _find(self, upload_id: str, user: str) -> Upload:
        if not UPLOAD_ID.fullmatch(upload_id):
            raise _missing(upload_id)
        self._sweep()
        try:
            meta = json.loads(self._meta(upload_id).read_bytes())
            upload = Upload(
                id=str(meta["id"]),
                user=str(meta["user"]),
                created=float(meta["created"]),
                entries=int(meta["entries"]),
                unpacked_bytes=int(meta["unpacked_bytes"]),
                bytes=int(meta.get("bytes", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _missing(upload_id) from exc
        if upload.user != user or self._expired(upload.created):
            raise _missing(upload_id)
        return upload

    def _sweep(self) -> None:
        """Delete every upload (and stray temporary file) older than the TTL."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and self._expired(
                    entry.stat(follow_symlinks=False).st_mtime
                ):
                    os.unlink(entry.path)

    def _alive(self, kept: Kept) -> bool:
        return not self._expired(kept.created)

    def _expired(self, created: float) -> bool:
        return time.time() - created > self.settings.upload_ttl

    def _archive(self, upload_id: str) -> Path:
        return self.root / f"{upload_id}.archive"

    def _meta(self, upload_id: str) -> Path:
        return self.root / f"{upload_id}.json"


def _missing(upload_id: str) -> NotFound:
    shown = repr(upload_id) if UPLOAD_ID.fullmatch(upload_id) else "with this id"
    return NotFound(f"There is no upload {shown} (uploads expire; upload it again).")


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
