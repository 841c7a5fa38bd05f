"""`DiskShelf`: uploads as files under `<data_dir>/uploads/`, for a gateway on one machine.

An upload is two files: `<id>.archive` (the bytes as received) and `<id>.json` (owner, time,
entries, bytes), written in that order, each atomically. Expired uploads are swept
whenever an upload is kept or looked up. All file work happens in a thread, one upload
kept (and room made for it) at a time: the others wait on the event loop, not in threads
of the default executor, which the Docker calls and file staging share.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import time
from pathlib import Path

from gateway.budget import Quota
from gateway.uploads.ledger import Kept, UploadLedger
from gateway.uploads.shelf import UPLOAD_ID, ShelvedUpload, UploadShelf, new_upload_id


class DiskShelf(UploadShelf):
    def __init__(self, root: Path, ttl: float) -> None:
        self.root = root
        self.ttl = ttl
        self._ledger = UploadLedger(self.root, self._archive)
        self._lock = asyncio.Lock()  # keeping (and deleting to make room) one at a time

    async def keep(
        self, user: str, data: bytes, entries: int, unpacked_bytes: int, quota: Quota
    ) -> ShelvedUpload:
        async with self._lock:
            return await asyncio.to_thread(self._keep, user, data, entries, unpacked_bytes, quota)

    async def find(self, upload_id: str) -> ShelvedUpload | None:
        return await asyncio.to_thread(self._find, upload_id)

    async def stored_bytes(self, user: str) -> int:
        async with self._lock:
            return await asyncio.to_thread(self._ledger.stored_bytes, user, self._alive)

    async def read(self, upload_id: str) -> bytes | None:
        return await asyncio.to_thread(self._read, upload_id)

    async def expire(self) -> int:
        return await asyncio.to_thread(self._sweep)

    # --- in a thread ------------------------------------------------------------------

    def _keep(
        self, user: str, data: bytes, entries: int, unpacked_bytes: int, quota: Quota
    ) -> ShelvedUpload:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._sweep()
        for old in self._ledger.make_room(user, len(data), quota, self._alive):
            self._delete(old.id)
        upload = ShelvedUpload(
            id=new_upload_id(),
            user=user,
            created=time.time(),
            entries=entries,
            unpacked_bytes=unpacked_bytes,
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

    def _find(self, upload_id: str) -> ShelvedUpload | None:
        if not UPLOAD_ID.fullmatch(upload_id):
            return None
        self._sweep()
        try:
            meta = json.loads(self._meta(upload_id).read_bytes())
            upload = ShelvedUpload(
                id=str(meta["id"]),
                user=str(meta["user"]),
                created=float(meta["created"]),
                entries=int(meta["entries"]),
                unpacked_bytes=int(meta["unpacked_bytes"]),
                bytes=int(meta.get("bytes", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return None if self._expired(upload.created) else upload

    def _read(self, upload_id: str) -> bytes | None:
        if self._find(upload_id) is None:
            return None
        try:
            return self._archive(upload_id).read_bytes()
        except FileNotFoundError:  # expired between the look-up and the read
            return None

    def _sweep(self) -> int:
        """Delete every upload (and stray temporary file) older than the TTL."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return 0
        swept = 0
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and self._expired(
                    entry.stat(follow_symlinks=False).st_mtime
                ):
                    os.unlink(entry.path)
                    swept += entry.name.endswith(".json")
        return swept

    def _alive(self, kept: Kept) -> bool:
        return not self._expired(kept.created)

    def _expired(self, created: float) -> bool:
        return time.time() - created > self.ttl

    def _archive(self, upload_id: str) -> Path:
        return self.root / f"{upload_id}.archive"

    def _meta(self, upload_id: str) -> Path:
        return self.root / f"{upload_id}.json"


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
