"""Attach an upload to a run: the archive's files (or the files an earlier run was given
and kept: `files_from`) are staged first, then the run's own `files`, which replace their
entries of the same path.

The run service calls `check_archive` and `given_upload` when it admits a run (a missing or
someone else's upload or run is a 404 at once; files that went, 410), `archive_files` once
the run holds a slot, so that an archive is unpacked only then, never while the run waits
in the queue, and then `keep_given`, which says in the record what the run was given and
keeps it for a later run if asked (`keep_files`: `gateway.uploads.kept`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import PurePosixPath

from gateway.errors import FilesGone, Forbidden, GatewayError, InvalidPath, NotFound
from gateway.execution.program import Program
from gateway.models.record import FilesGiven, RunRecord
from gateway.models.request import StagedFile
from gateway.store.base import RecordStore
from gateway.uploads.archives import Unpacked
from gateway.uploads.limits import entry_path
from gateway.uploads.service import UploadService

log = logging.getLogger(__name__)
MAX_LISTED = 5  # names listed in a note before "and N more"
KEEP_FILES_WAIT = 2.0  # seconds a run waits for a turn to keep its files (uploads' turns)


async def archive_files(
    uploads: UploadService | None, program: Program
) -> tuple[tuple[StagedFile, ...], tuple[str, ...]]:
    """What to stage for a program: its archive's files (unpacked now, once the run holds a
    slot) that `files` does not replace, then `files`; and notes for the record."""
    if program.given_upload is not None and uploads is not None:
        try:
            unpacked = await uploads.unpack_kept(program.given_upload, program.user)
        except NotFound:  # it went while the run waited for its slot
            raise files_gone(program.given_from or "") from None
        except GatewayError as exc:  # read back under lower limits than it was kept with
            exc.field = "files_from"
            raise
    elif program.archive is None:
        return program.files, ()
    elif uploads is None or not uploads.config.allow_uploads:
        raise Forbidden(
            "Archives are disabled on this gateway.", field="archive", code="archive_mode_disabled"
        )
    else:
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
        where = (
            f"the archive {program.archive}"
            if program.archive is not None
            else f"the files of {program.given_from}"
        )
        notes += (
            f"The entrypoint {entrypoint!r} is neither among `files` nor in {where}, so the "
            "run cannot find it.",
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


async def given_upload(
    store: RecordStore, uploads: UploadService | None, run_id: str, user: str
) -> str:
    """Before a run is admitted: the upload that keeps the files `run_id` was given
    (`files_from`), which must be the caller's run (404) and still kept (410)."""
    record = await store.get(run_id)
    if record is None or record.user != user:
        raise NotFound(f"There is no run {run_id!r}.", field="files_from")
    if record.files_upload is None or uploads is None:
        given = record.files_given
        if not record.final and given is None:
            why = "has not staged its files yet (it is in progress): try again once it has"
        elif given is None:
            why = "was given no files: add them again"
        else:
            why = "did not keep its files (`keep_files`): add them again"
        raise FilesGone(f"The run {run_id} {why}.", field="files_from")
    try:
        await uploads.find(record.files_upload, user)
    except NotFound:
        raise files_gone(run_id) from None
    return record.files_upload


def files_gone(run_id: str) -> FilesGone:
    return FilesGone(
        f"The files the run {run_id} was given are gone (kept files go after `upload_ttl`, "
        "and a user's oldest uploads go past their upload quota): add them again.",
        field="files_from",
    )


async def keep_given(
    uploads: UploadService | None,
    record: RunRecord,
    program: Program,
    staged: tuple[StagedFile, ...],
) -> None:
    """Once staged: say in the record what files the run was given (its `files` and those
    of `files_from`; an archive's are the upload's own), and keep them if asked
    (`keep_files`): as the upload they came from when they are exactly its files, else as
    a new upload of the user's, when they could be staged again by one request (its count,
    total size and paths). Not kept (a note says why) never stops the run."""
    files = program.files if program.archive is not None else staged
    if not files:
        return
    size = sum(len(f.data) for f in files)
    given = FilesGiven(count=len(files), bytes=size, kept=False)
    record.files_given = given
    if not program.keep_files or uploads is None:
        return
    if program.given_upload is not None and not program.files:
        record.files_upload, given.kept = program.given_upload, True
        return
    config = uploads.config
    if len(files) > config.max_files or size > config.max_files_bytes:
        record.notes.append(
            f"The files were not kept: {len(files)} files of {size} bytes in all are more "
            f"than one request may stage ({config.max_files} files, {config.max_files_bytes} "
            "bytes), so no run could stage them again."
        )
        return
    try:
        for staged_file in files:
            entry_path(staged_file.path)  # as they will be read back
    except GatewayError as exc:
        record.notes.append(f"The files were not kept: {exc.message}")
        return
    try:
        upload = await uploads.keep_files(files, record.user, wait=KEEP_FILES_WAIT)
    except GatewayError as exc:
        record.notes.append(f"The files were not kept: {exc.message}")
        return
    except OSError as exc:  # the shelf's disk (full, say): the run goes on without
        log.warning("run %s: its files could not be kept: %s", record.id, exc)
        record.notes.append("The files were not kept: the gateway could not store them.")
        return
    record.files_upload, given.kept = upload.id, True


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
