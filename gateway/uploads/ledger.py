"""The ledger of what each user keeps on the disk shelf (`disk.py`), held to a quota: at most
`max_uploads_per_user` uploads of at most `max_upload_store_bytes_per_user` stored bytes in
all (the PostgreSQL shelf decides the same in its table: `gateway/store/postgres_uploads.py`).

Past the quota, the user's **oldest uploads are deleted** to make room for the new one (as
their run records are), rather than the new one refused: uploads already expire
(`upload_ttl`), so clients already handle "there is no upload ..., upload it again", and a
pipeline that uploads an archive for each run keeps working instead of being locked out
until its oldest uploads expire. A run takes its upload's files when it is admitted, so
deleting an upload never disturbs a run that already uses it. Nobody else's uploads are
touched.

`UploadLedger` is the disk shelf's index of who keeps what (`Kept`), built from the
`<id>.json` files on first use and kept up to date by the shelf, which calls it under its
lock.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from gateway.budget import Quota


@dataclasses.dataclass(frozen=True)
class Kept:
    id: str
    created: float
    size: int  # stored bytes (the archive as received)


class UploadLedger:
    def __init__(self, root: Path, archive_path: Callable[[str], Path]) -> None:
        self.root = root
        self._archive_path = archive_path
        self._by_user: dict[str, list[Kept]] | None = None

    def _load(self) -> dict[str, list[Kept]]:
        if self._by_user is not None:
            return self._by_user
        by_user: dict[str, list[Kept]] = {}
        try:
            names = [e.name for e in os.scandir(self.root) if e.name.endswith(".json")]
        except FileNotFoundError:
            names = []
        for name in names:
            try:
                meta = json.loads((self.root / name).read_bytes())
                upload_id, user, created = str(meta["id"]), str(meta["user"]), meta["created"]
                size = meta.get("bytes")
                if size is None:  # written by an older gateway
                    size = self._archive_path(upload_id).stat().st_size
                by_user.setdefault(user, []).append(Kept(upload_id, float(created), int(size)))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        for kept in by_user.values():
            kept.sort(key=lambda k: k.created)
        self._by_user = by_user
        return by_user

    def make_room(
        self, user: str, size: int, quota: Quota, alive: Callable[[Kept], bool]
    ) -> list[Kept]:
        """The user's oldest uploads to delete so that one more of `size` bytes fits the
        quota (never more than all of them); forgets them and the ones no longer `alive`."""
        by_user = self._load()
        kept = [k for k in by_user.get(user, []) if alive(k)]
        count, total = len(kept) + 1, sum(k.size for k in kept) + size
        doomed: list[Kept] = []
        while kept and not quota.allows(count, total):
            oldest = kept.pop(0)
            doomed.append(oldest)
            count -= 1
            total -= oldest.size
        by_user[user] = kept
        return doomed

    def stored_bytes(self, user: str, alive: Callable[[Kept], bool]) -> int:
        return sum(k.size for k in self._load().get(user, []) if alive(k))

    def add(self, user: str, kept: Kept) -> None:
        self._load().setdefault(user, []).append(kept)
