"""A run's staged files kept for a later run (`keep_files`, then `files_from`): packed by
the gateway itself as a zip of stored (uncompressed) entries, kept on the user's upload
shelf (so within their upload quota, for `upload_ttl`, theirs only, and on PostgreSQL seen
by every replica), and read back under the limits of a request's own `files`, not an
uploader's archive limits: what was staged once can always be staged again.

Pure, blocking code: callers run it in a thread.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence

from gateway.models.request import StagedFile
from gateway.uploads.limits import MAX_PATH_BYTES, ArchiveLimits

_ENTRY_OVERHEAD = 2 * MAX_PATH_BYTES + 200  # a zip's local and central headers, at most


def pack(files: Sequence[StagedFile]) -> bytes:
    """The files as a zip (stored: packing costs no compression)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for staged in files:
            archive.writestr(zipfile.ZipInfo(staged.path, (1980, 1, 1, 0, 0, 0)), staged.data)
    return out.getvalue()


def read_limits(max_files: int, max_file_bytes: int, max_files_bytes: int) -> ArchiveLimits:
    """What a kept set of files may be read back as: what a request's `files` may stage
    (its count, each file's and the total size) plus the zip's own headers."""
    return ArchiveLimits(
        upload_bytes=max_files_bytes + max_files * _ENTRY_OVERHEAD + 1024,
        unpacked_bytes=max_files_bytes,
        entries=max_files,
        file_bytes=max_file_bytes,
        ratio=float("inf"),  # stored entries: nothing is compressed
    )
