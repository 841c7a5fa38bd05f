"""Attach an upload to a run: the archive's files are staged first, then the run's own
`files`, which replace archive entries of the same path.

The run service calls `check_archive` when it admits a run (a missing or someone else's
upload is a 404 at once), and `archive_files` once the run holds a slot, so that an archive
is unpacked only then, never while the run waits in the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import PurePosixPath

from gateway.errors import Forbidden, GatewayError, InvalidPath
from gateway.execution.program import Program
from gateway.models.request import StagedFile
from gateway.uploads.archives import Unpacked
from gateway.uploads.service import UploadService

MAX_LISTED = 5  # names listed in a note before "and N more"


async def archive_files(
    uploads: UploadService | None, program: Program
) -> tuple[tuple[StagedFile, ...], tuple[str, ...]]:
    """What to stage for a program: its archive's files (unpacked now, once the run holds a
    slot) that `files` does not replace, then `files`; and notes for the record."""
    if program.archive is None:
        return program.files, ()
    if uploads is None or not uploads.config.allow_uploads:
        raise Forbidden(
            "Archives are disabled on this gateway.", field="archive", code="archive_mode_disabled"
        )
    try:
        unpacked = await uploads.unpack(program.archive, program.user)
    except GatewayError as exc:
        exc.field = "archive"
        raise
    kept, notes = await asyncio.to_thread(merge_archive, program.files, unpacked)
    staged = kept + program.files
    entrypoint = program.entrypoint
    if (
        entrypoint is not None
        and program.workspace is None
        and entrypoint not in {f.path for f in staged}
    ):
        notes += (
            f"The entrypoint {entrypoint!r} is neither among `files` nor in the archive "
            f"{program.archive}, so the run cannot find it.",
        )
    return staged, notes


async def check_archive(uploads: UploadService | None, upload_id: str | None, user: str) -> None:
    """Before a run is admitted: its archive exists and is the caller's (nothing unpacked)."""
    if upload_id is None:
        return
    if uploads is None or not uploads.config.allow_uploads:
        raise Forbidden(
            "Archives are disabled on this gateway.", field="archive", code="archive_mode_disabled"
        )
    try:
        await uploads.find(upload_id, user)
    except GatewayError as exc:
        exc.field = "archive"
        raise


def merge_archive(
    files: tuple[StagedFile, ...], unpacked: Unpacked
) -> tuple[tuple[StagedFile, ...], tuple[str, ...]]:
    """The archive's files that `files` does not replace, and notes for the record."""
    given = {f.path for f in files}
    kept = tuple(f for f in unpacked.files if f.path not in given)
    kept_paths = {f.path for f in kept}
    archive_folders = set(unpacked.folders) | _parents(kept_paths)
    for staged in files:
        if staged.path in archive_folders:
            raise InvalidPath(
                f"{staged.path} is a folder in the archive; `files` cannot replace it.",
                field="files",
            )
        inside = next((p for p in _parents([staged.path]) if p in kept_paths), None)
        if inside is not None:
            raise InvalidPath(
                f"{staged.path} would lie inside {inside}, which is a file in the archive.",
                field="files",
            )
    used = _parents(kept_paths | given)
    empty = [folder for folder in unpacked.folders if folder not in used]
    notes = []
    if empty:
        notes.append(
            f"{len(empty)} empty folder(s) of the archive were not created (only files are "
            f"unpacked): {_listing(empty)}."
        )
    return kept, tuple(notes)


def _parents(paths: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for parent in map(str, PurePosixPath(path).parents):
            if parent == "." or parent in found:
                break
            found.add(parent)
    return found


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    more = len(names) - MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown
