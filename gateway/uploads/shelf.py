"""Where uploaded archives are kept: the `UploadShelf` interface that the upload store
(`UploadService`, `service.py`, which checks archives) writes through, and the
`ShelvedUpload` it keeps: an upload's owner, size and files (the API's answer is
`gateway.models.answers.Upload`).

Two shelves: `DiskShelf` (`disk.py`: files under the data dir, beside the SQLite record
store) and `PostgresShelf` (`gateway/store/postgres_uploads.py`: a table of the PostgreSQL
store, so that every replica sees every upload and the per-user quota is decided in one
place for the whole fleet). Both keep each user within a `Quota` by deleting their
oldest uploads (`ledger.py` says why), and forget uploads older than the TTL.
"""

from __future__ import annotations

import abc
import dataclasses
import re
import secrets
from typing import Any

from gateway.budget import Quota

UPLOAD_ID = re.compile(r"upl_[0-9a-f]{32}")


def new_upload_id() -> str:
    return "upl_" + secrets.token_hex(16)


@dataclasses.dataclass(frozen=True)
class ShelvedUpload:
    id: str
    user: str
    created: float  # seconds since the epoch
    entries: int
    unpacked_bytes: int
    bytes: int = 0  # the archive as stored (0: written by an older gateway)

    def to_json(self) -> dict[str, Any]:
        """The answer of `POST /v1/uploads`."""
        return {"id": self.id, "entries": self.entries, "unpacked_bytes": self.unpacked_bytes}


class UploadShelf(abc.ABC):
    """Keeps archives that already passed every check. The upload store calls `keep` once
    per upload, `find` and `read` when a run names one, `expire` now and then."""

    # how many `keep`s may run at once (None: no bound of the shelf's own); the upload
    # store lets no more than this through
    max_parallel: int | None = None

    @abc.abstractmethod
    async def keep(
        self, user: str, data: bytes, entries: int, unpacked_bytes: int, quota: Quota
    ) -> ShelvedUpload:
        """Keep `data` for `user` as a new upload; first delete the user's oldest uploads
        while one more would not fit `quota` (never more than all of them)."""

    @abc.abstractmethod
    async def stored_bytes(self, user: str) -> int:
        """The bytes `user`'s live uploads take on the shelf (GET /v1/usage)."""

    @abc.abstractmethod
    async def find(self, upload_id: str) -> ShelvedUpload | None:
        """The upload, unless it is missing or expired (anyone's: the caller checks)."""

    @abc.abstractmethod
    async def read(self, upload_id: str) -> bytes | None:
        """The archive's bytes, unless it is missing or expired."""

    @abc.abstractmethod
    async def expire(self) -> int:
        """Delete every expired upload; how many."""
