"""Read a run's `return_files` out of its working folder without leaving that folder.

Runs where the files are: inside the container for the Docker backend
(`python -m kernels.returnfiles REQUEST_JSON`, answer on stdout), in the gateway's process
for the local backend (after every process of the sandbox was killed). Standard library only.

Rules: a pattern is a path or a glob (`*`, `?`, `[...]`, `**`) relative to the working
folder (an absolute path inside it is accepted). Links are followed only while they stay
inside the folder; the final open uses O_NOFOLLOW on every component, so a link swapped in
between the check and the open fails closed. Globs never descend into linked folders.
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import json
import os
import posixpath
import stat
import sys
from typing import Any

_GLOB_CHARS = frozenset("*?[")


def _relative(pattern: str, root: str) -> str | None:
    """The pattern relative to root, or None when it points outside."""
    if pattern.startswith("/"):
        normal = posixpath.normpath(pattern)
        if normal != root and not normal.startswith(root.rstrip("/") + "/"):
            return None
        pattern = posixpath.relpath(normal, root)
    normal = posixpath.normpath(pattern)
    if normal == ".." or normal.startswith("../"):
        return None
    return normal


def _is_glob(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


def _glob(root: str, pattern: str) -> list[str]:
    """Match a relative glob against the tree under root, not descending into linked folders."""
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    matches: list[str] = []

    def walk(rel: str, index: int) -> None:
        if index == len(parts):
            if rel:
                matches.append(rel)
            return
        part = parts[index]
        if part == "**":
            walk(rel, index + 1)
            for name, is_dir in _entries(root, rel):
                if is_dir and not name.startswith("."):
                    walk(posixpath.join(rel, name), index)
            return
        for name, is_dir in _entries(root, rel):
            if name.startswith(".") and not part.startswith("."):
                continue
            if fnmatch.fnmatchcase(name, part) and (is_dir or index == len(parts) - 1):
                walk(posixpath.join(rel, name), index + 1)

    walk("", 0)
    return sorted(set(matches))


def _entries(root: str, rel: str) -> list[tuple[str, bool]]:
    try:
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            return [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError:
        return []


def _open_inside(root: str, rel: str) -> int:
    """Open root/rel for reading, following links only inside root. Raises OSError."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))
    if real != real_root and not real.startswith(real_root + "/"):
        raise PermissionError(errno.EACCES, "outside the working folder")
    inner = os.path.relpath(real, real_root)
    fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        components = [] if inner == "." else inner.split("/")
        for i, name in enumerate(components):
            last = i == len(components) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY)
            next_fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_one(root: str, rel: str, shown: str, budget: dict[str, int]) -> dict[str, Any]:
    try:
        fd = _open_inside(root, rel)
    except FileNotFoundError:
        return {"path": shown, "size": None, "error": "not found"}
    except PermissionError:
        return {"path": shown, "size": None, "error": "outside the working folder"}
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return {"path": shown, "size": None, "error": "outside the working folder"}
        return {"path": shown, "size": None, "error": exc.strerror or "cannot be read"}
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            return {"path": shown, "size": None, "error": "is a folder"}
        if not stat.S_ISREG(info.st_mode):
            return {"path": shown, "size": None, "error": "not a regular file"}
        if info.st_size > budget["file"]:
            return {
                "path": shown,
                "size": info.st_size,
                "error": f"larger than the limit of {budget['file']} bytes",
            }
        if info.st_size > budget["total"]:
            return {
                "path": shown,
                "size": info.st_size,
                "error": "the total size limit of returned files was reached",
            }
        chunks = []
        remaining = budget["file"] + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > budget["file"]:
            return {"path": shown, "size": len(data), "error": "grew past the size limit"}
        budget["total"] -= len(data)
    finally:
        os.close(fd)
    try:
        return {"path": shown, "size": len(data), "encoding": "utf-8", "content": data.decode()}
    except UnicodeDecodeError:
        content = base64.b64encode(data).decode("ascii")
        return {"path": shown, "size": len(data), "encoding": "base64", "content": content}


def read_files(
    root: str, patterns: list[str], max_files: int, max_file_bytes: int, max_total_bytes: int
) -> dict[str, Any]:
    """Return `{"files": [...], "notes": [...]}` for the patterns, in the order given."""
    files: list[dict[str, Any]] = []
    notes: list[str] = []
    budget = {"file": max_file_bytes, "total": max_total_bytes}
    for pattern in patterns:
        rel = _relative(pattern, root)
        if rel is None:
            files.append({"path": pattern, "size": None, "error": "outside the working folder"})
            continue
        if not _is_glob(rel):
            files.append(_read_one(root, rel, pattern, budget))
            continue
        matches = _glob(root, rel)
        if not matches:
            files.append({"path": pattern, "size": None, "error": "no file matches"})
        for match in matches:
            if len(files) >= max_files:
                notes.append(f"Only the first {max_files} matching files were returned.")
                break
            entry = _read_one(root, match, match, budget)
            if entry.get("error") != "is a folder":
                files.append(entry)
    if len(files) > max_files:
        del files[max_files:]
        notes.append(f"Only the first {max_files} return files were returned.")
    return {"files": files, "notes": sorted(set(notes))}


def main(argv: list[str]) -> int:
    request = json.loads(argv[1])
    answer = read_files(
        request["root"],
        list(request["patterns"]),
        int(request["max_files"]),
        int(request["max_file_bytes"]),
        int(request["max_total_bytes"]),
    )
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
