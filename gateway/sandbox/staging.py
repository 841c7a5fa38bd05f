"""Write staged files into a working folder without ever following a link.

The folder may be a persistent workspace that earlier runs controlled, so every component
is opened relative to its parent with O_NOFOLLOW: a planted symlink makes the write fail,
never land outside.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path

from gateway.errors import InvalidPath
from gateway.runs.models import StagedFile


def write_staged_files(workdir: Path, files: Sequence[StagedFile]) -> None:
    root = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for staged in files:
            _write_one(root, staged)
    finally:
        os.close(root)


def _write_one(root: int, staged: StagedFile) -> None:
    *folders, name = staged.path.split("/")
    fd = os.dup(root)
    try:
        for folder in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=fd)
            try:
                next_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _refused(staged.path, exc) from exc
            os.close(fd)
            fd = next_fd
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        try:
            out = os.open(name, flags, 0o644, dir_fd=fd)
        except OSError as exc:
            raise _refused(staged.path, exc) from exc
        with os.fdopen(out, "wb") as handle:
            handle.write(staged.data)
    finally:
        os.close(fd)


def refuse_links(workdir: Path, files: Sequence[StagedFile]) -> None:
    """Raise InvalidPath if a staged file would go through a link (or a file) already in
    the working folder: the same refusal as `write_staged_files`, without writing anything.
    For backends that write the files themselves elsewhere (Docker's put_archive)."""
    root = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for staged in files:
            _check_one(root, staged)
    finally:
        os.close(root)


def _check_one(root: int, staged: StagedFile) -> None:
    *folders, name = staged.path.split("/")
    fd = os.dup(root)
    try:
        for folder in folders:
            try:
                next_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return  # created fresh: nothing below it can be a link
            except OSError as exc:
                raise _refused(staged.path, exc) from exc
            os.close(fd)
            fd = next_fd
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise _refused(staged.path, OSError(errno.ELOOP, "a link"))
    finally:
        os.close(fd)


def _refused(path: str, exc: OSError) -> InvalidPath:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return InvalidPath(f"{path} goes through a link or a file in the working folder.")
    return InvalidPath(f"{path} could not be written: {exc.strerror}.")


def staged_tar(files: Sequence[StagedFile], uid: int, gid: int) -> bytes:
    """The files as a tar stream (for Docker's put_archive), owned by the kernel's user."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folders: set[str] = set()
        for staged in files:
            parts = staged.path.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                    tar.addfile(info)
            info = tarfile.TarInfo(staged.path)
            info.size, info.mode, info.uid, info.gid = len(staged.data), 0o644, uid, gid
            tar.addfile(info, io.BytesIO(staged.data))
    return buffer.getvalue()
