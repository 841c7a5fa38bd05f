"""Write staged files into a working folder without ever following a link or blocking.

Both backends stage on the gateway's side, into the working folder opened as a
descriptor (for Docker: the working folder's tmpfs, on the host, or the
workspace). The folder may be a persistent workspace that earlier (or concurrent) runs
of the same user control, so:

- every component is opened relative to its parent with `O_NOFOLLOW`: a planted link
  makes the write fail (400 `invalid_path`), never land outside;
- the file itself is opened with `O_NONBLOCK` and checked with `fstat` before anything
  is written: a FIFO or socket left in a workspace is refused instead of blocking forever;
- what we create is chowned, by descriptor, to the sandbox's user.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence

from gateway.errors import InvalidPath
from gateway.models.request import StagedFile

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_staged_files(root_fd: int, files: Sequence[StagedFile], uid: int, gid: int) -> None:
    """Write every file below the folder open at `root_fd` (blocking: run in a thread)."""
    for staged in files:
        _write_one(root_fd, staged, uid, gid)


def _write_one(root_fd: int, staged: StagedFile, uid: int, gid: int) -> None:
    *folders, name = staged.path.split("/")
    fd = os.dup(root_fd)
    try:
        for folder in folders:
            created = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=fd)
                created = True
            try:
                next_fd = os.open(folder, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _refused(staged.path, exc) from exc
            os.close(fd)
            fd = next_fd
            if created:
                os.fchown(fd, uid, gid)
        try:
            out = os.open(name, _FILE_FLAGS, 0o644, dir_fd=fd)
        except OSError as exc:
            raise _refused(staged.path, exc) from exc
        with os.fdopen(out, "wb") as handle:
            if not stat.S_ISREG(os.fstat(out).st_mode):
                raise _refused(staged.path, OSError(errno.EINVAL, "not a regular file"))
            os.set_blocking(out, True)
            os.ftruncate(out, 0)
            handle.write(staged.data)
            os.fchown(out, uid, gid)
    finally:
        os.close(fd)


def _refused(path: str, exc: OSError) -> InvalidPath:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return InvalidPath(f"{path} goes through a link or a file in the working folder.")
    if exc.errno in (errno.ENXIO, errno.EINVAL, errno.EISDIR):
        return InvalidPath(f"{path} is a folder, a FIFO or another special file.")
    return InvalidPath(f"{path} could not be written: {exc.strerror}.")
