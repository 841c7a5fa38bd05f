"""Attach an upload to a run: the archive's files are staged first, then the run's own
`files`, which replace archive entries of the same path.

Handlers call `resolve_archive(services.extra, request)` after `parse_run_request` and pass
the files it returns as `extra_files` to `RunService.submit` / `run`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

from gateway.errors import Forbidden, GatewayError, InvalidPath
from gateway.runs.models import RunRequest, StagedFile
from gateway.uploads.archives import Unpacked
from gateway.uploads.store import UploadStore

MAX_LISTED = 5  # names listed in a note before "and N more"


async def resolve_archive(
    extra: Mapping[str, Any], request: RunRequest
) -> tuple[RunRequest, tuple[StagedFile, ...]]:
    """For a request naming `archive`: the request (with notes about the archive) and the
    archive's files to stage before `files`. Without `archive`: the request and ()."""
    if request.archive is None:
        return request, ()
    store = extra.get("uploads")
    if not isinstance(store, UploadStore) or not store.settings.allow_uploads:
        raise Forbidden(
            "Archives are disabled on this gateway.", field="archive", code="archive_mode_disabled"
        )
    try:
        unpacked = await store.unpack(request.archive, request.user)
    except GatewayError as exc:
        exc.field = "archive"
        raise
    return await asyncio.to_thread(merge_archive, request, unpacked)


def merge_archive(
    request: RunRequest, unpacked: Unpacked
) -> tuple[RunRequest, tuple[StagedFile, ...]]:
    """The archive's files that `files` does not replace, and notes for the record."""
    given = {f.path for f in request.files}
    kept = tuple(f for f in unpacked.files if f.path not in given)
    kept_paths = {f.path for f in kept}
    archive_folders = set(unpacked.folders) | _parents(kept_paths)
    for staged in request.files:
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
    notes = list(request.notes)
    used = _parents(kept_paths | given)
    empty = [folder for folder in unpacked.folders if folder not in used]
    if empty:
        notes.append(
            f"{len(empty)} empty folder(s) of the archive were not created (only files are "
            f"unpacked): {_listing(empty)}."
        )
    entrypoint = request.entrypoint
    if (
        entrypoint is not None
        and request.working_dir is None
        and entrypoint not in given | kept_paths
    ):
        notes.append(
            f"The entrypoint {entrypoint!r} is neither among `files` nor in the archive "
            f"{request.archive}, so the run cannot find it."
        )
    return dataclasses.replace(request, notes=tuple(notes)), kept


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
