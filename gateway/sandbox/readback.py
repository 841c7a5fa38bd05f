"""Read a run's `return_files` out of its working folder, on the gateway's side.

Nothing runs inside the sandbox for this (a module planted in a persistent workspace
once ran with the gateway's authority there). The backend freezes or
kills the sandbox first, so nothing changes while we read, and hands us the working
folder as an open descriptor. Every path is then resolved one component at a time from
that descriptor:

- a pattern is a path or a glob (`*`, `?`, `[...]`, `**`) relative to the working folder,
  or an absolute path inside it as the kernel sees it (`visible_root`, e.g. /workspace);
- links are followed only while they stay inside the folder: a link's target is resolved
  by us, component by component (an absolute target is read as the kernel would see it),
  and a target that leaves the folder is refused; every open uses `O_NOFOLLOW`;
- globs never descend into linked folders, skip dot-names unless the pattern names them,
  and stop after `MAX_WALK_ENTRIES` directory entries (a deep `**` tree costs no more);
- FIFOs, sockets and devices are refused without blocking (`O_NONBLOCK`, then `fstat`).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import errno
import fnmatch
import os
import posixpath
import stat
from collections.abc import Iterator, Sequence
from typing import Any

from gateway.sandbox.base import FilesRead, ReadLimits

MAX_WALK_ENTRIES = 10_000  # directory entries a read may look at, all patterns together
MAX_LINKS = 40  # links followed while resolving one path (as the kernel's own limit)
_GLOB_CHARS = frozenset("*?[")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Outside(Exception):
    """The path leaves the working folder."""


def _names(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


@contextlib.contextmanager
def _dir(root_fd: int, names: Sequence[str]) -> Iterator[int]:
    """An open descriptor of root/names (no link followed); closed on exit."""
    fd = os.dup(root_fd)
    try:
        for name in names:
            next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


class Reader:
    def __init__(self, root_fd: int, visible_root: str, limits: ReadLimits) -> None:
        self.root_fd = root_fd
        self.visible_root = posixpath.normpath(visible_root)
        self.limits = limits
        self.total_left = limits.max_total_bytes
        self.walk_left = MAX_WALK_ENTRIES
        self.notes: list[str] = []

    # --- paths --------------------------------------------------------------------------

    def relative(self, pattern: str) -> str | None:
        """The pattern relative to the working folder, or None when it points outside."""
        if pattern.startswith("/"):
            normal = posixpath.normpath(pattern)
            if normal == self.visible_root:
                return "."
            if not normal.startswith(self.visible_root.rstrip("/") + "/"):
                return None
            pattern = normal[len(self.visible_root.rstrip("/")) + 1 :]
        normal = posixpath.normpath(pattern)
        if normal == ".." or normal.startswith("../"):
            return None
        return normal

    def resolve(self, rel: str) -> list[str]:
        """The names of `rel` inside the folder with every link resolved by us."""
        done: list[str] = []
        todo = collections.deque(_names(rel))
        links = 0
        while todo:
            name = todo.popleft()
            if name == "..":
                if not done:
                    raise _Outside
                done.pop()
                continue
            with _dir(self.root_fd, done) as parent:
                try:
                    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    done.append(name)  # the open reports "not found"
                    done.extend(todo)
                    return done
                if not stat.S_ISLNK(info.st_mode):
                    done.append(name)
                    continue
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many links")
                target = os.readlink(name, dir_fd=parent)
            if target.startswith("/"):
                inside = self.relative(target)
                if inside is None:
                    raise _Outside
                done = []
                target = inside
            todo.extendleft(reversed(_names(target)))
        return done

    # --- files --------------------------------------------------------------------------

    def read_one(self, rel: str, shown: str) -> dict[str, Any]:
        def failed(error: str, size: int | None = None) -> dict[str, Any]:
            return {"path": shown, "size": size, "error": error}

        try:
            names = self.resolve(rel)
            if not names:
                return failed("is a folder")
            with _dir(self.root_fd, names[:-1]) as parent:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(names[-1], flags, dir_fd=parent)
        except _Outside:
            return failed("outside the working folder")
        except FileNotFoundError:
            return failed("not found")
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EACCES, errno.EPERM):
                return failed("outside the working folder")
            if exc.errno == errno.ENOTDIR:
                return failed("not found")
            if exc.errno == errno.ENXIO:  # a FIFO without writer, a socket
                return failed("not a regular file")
            return failed(exc.strerror or "cannot be read")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return failed("is a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        with os.fdopen(fd, "rb", buffering=0) as handle:
            limit = self.limits.max_file_bytes
            if info.st_size > limit:
                return failed(f"larger than the limit of {limit} bytes", info.st_size)
            if info.st_size > self.total_left:
                return failed("the total size limit of returned files was reached", info.st_size)
            data = handle.read(limit + 1)
        if len(data) > limit:
            return failed("grew past the size limit", len(data))
        if len(data) > self.total_left:
            return failed("the total size limit of returned files was reached", len(data))
        self.total_left -= len(data)
        entry: dict[str, Any] = {"path": shown, "size": len(data)}
        try:
            entry.update(encoding="utf-8", content=data.decode("utf-8"))
        except UnicodeDecodeError:
            entry.update(encoding="base64", content=base64.b64encode(data).decode("ascii"))
        return entry

    # --- globs --------------------------------------------------------------------------

    def entries(self, names: Sequence[str]) -> list[tuple[str, bool]]:
        """(name, is a real folder) of root/names, within the walk budget."""
        if self.walk_left <= 0:
            return []
        found: list[tuple[str, bool]] = []
        try:
            with _dir(self.root_fd, names) as fd, os.scandir(fd) as it:
                for entry in it:
                    self.walk_left -= 1
                    if self.walk_left < 0:
                        note = (
                            f"The search for return_files stopped after {MAX_WALK_ENTRIES} "
                            "entries of the working folder."
                        )
                        if note not in self.notes:
                            self.notes.append(note)
                        break
                    found.append((entry.name, entry.is_dir(follow_symlinks=False)))
        except OSError:
            return []
        return sorted(found)

    def glob(self, pattern: str) -> list[str]:
        parts = _names(pattern)
        matches: list[str] = []

        def walk(names: list[str], index: int) -> None:
            if index == len(parts):
                if names:
                    matches.append("/".join(names))
                return
            part = parts[index]
            if part == "**":
                walk(names, index + 1)
                for name, is_dir in self.entries(names):
                    if is_dir and not name.startswith("."):
                        walk([*names, name], index)
                return
            for name, is_dir in self.entries(names):
                if name.startswith(".") and not part.startswith("."):
                    continue
                if fnmatch.fnmatchcase(name, part) and (is_dir or index == len(parts) - 1):
                    walk([*names, name], index + 1)

        walk([], 0)
        return sorted(set(matches))


def read_files(
    root_fd: int, visible_root: str, patterns: Sequence[str], limits: ReadLimits
) -> FilesRead:
    """`return_files` entries in the order of the patterns (blocking: run it in a thread)."""
    reader = Reader(root_fd, visible_root, limits)
    files: list[dict[str, Any]] = []
    for pattern in patterns:
        rel = reader.relative(pattern)
        if rel is None:
            files.append({"path": pattern, "size": None, "error": "outside the working folder"})
            continue
        if not any(c in _GLOB_CHARS for c in rel):
            files.append(reader.read_one(rel, pattern))
            continue
        matches = reader.glob(rel)
        if not matches:
            files.append({"path": pattern, "size": None, "error": "no file matches"})
        for match in matches:
            if len(files) >= limits.max_files:
                reader.notes.append(
                    f"Only the first {limits.max_files} matching files were returned."
                )
                break
            entry = reader.read_one(match, match)
            if entry.get("error") != "is a folder":
                files.append(entry)
    if len(files) > limits.max_files:
        del files[limits.max_files :]
        reader.notes.append(f"Only the first {limits.max_files} return files were returned.")
    return FilesRead(files=files, notes=sorted(set(reader.notes)))
