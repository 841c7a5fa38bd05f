"""Persistent workspaces: named by the request, opened only when the sandbox is created.

A request names a workspace as `WorkspaceRef(root, parts)`: a trusted root (the
operator's `--workspaces` folder or one of the admin folders) and the path below it as
plain names, checked lexically when the request is parsed (no `..`, no links resolved,
nothing touched on disk). The folder is opened much later, when the run's sandbox is
created (a queued run may wait minutes), one component at a time from the root with
`O_NOFOLLOW | O_DIRECTORY`, creating what is missing. Everything after that uses the file
descriptor, never the path: a folder an earlier run swapped for a link to a host folder
makes the open fail (`InvalidPath`), and nothing outside the root is ever chowned,
mounted or written.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path, PurePosixPath

from gateway.errors import InvalidPath
from gateway.models.request import WorkspaceRef


def split_below(root: Path, path: str) -> tuple[str, ...] | None:
    """`path` (absolute, or relative to root) as names below `root`, lexically; None when
    it leaves root. Links are not resolved: they are refused later, at open time."""
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        pure = PurePosixPath(root) / pure
    parts: list[str] = []
    for part in pure.parts[1:]:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(part)
    base = [p for p in PurePosixPath(root).parts[1:] if p not in ("", ".")]
    if parts[: len(base)] != base:
        return None
    return tuple(parts[len(base) :])


def open_workspace(ref: WorkspaceRef, uid: int, gid: int) -> int:
    """Open (creating as needed) the workspace folder; the caller closes the descriptor.

    Blocking: call it in a thread. The folder itself is made the sandbox user's (by
    descriptor); folders created above it stay the gateway's.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    os.makedirs(ref.root, mode=0o755, exist_ok=True)  # the operator's folder: trusted
    fd = os.open(ref.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in ref.parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                raise _refused(ref, part, exc) from exc
            os.close(fd)
            fd = next_fd
        os.fchown(fd, uid, gid)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _refused(ref: WorkspaceRef, part: str, exc: OSError) -> InvalidPath:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return InvalidPath(
            f"The workspace {ref.path} cannot be used: {part!r} is a link or a file.",
            field="working_dir",
        )
    return InvalidPath(
        f"The workspace {ref.path} cannot be opened: {exc.strerror}.", field="working_dir"
    )
