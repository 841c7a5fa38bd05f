"""`gateway run --files PATH ...` and `--return GLOB ...`: local files and folders sent as a
run's `files`, and the files a run wrote saved back.

A relative path is kept as given (`--files data/` stages `data/x.csv` as `data/x.csv`, so
that the notebook's own `open("data/x.csv")` works); an absolute path, or one that leaves
the current folder, is staged under its own name (`/tmp/in/data` as `data/...`). A folder
is walked without following links to folders. Files whose bytes are not UTF-8 are sent as
base64.

What one run may carry is the gateway's to say (its `max_files`, `max_file_bytes`,
`max_files_bytes`, `max_body_bytes`): the gateway's refusal is reported with what each
`--files` argument held. Before anything is read, a path that holds more than `MAX_FILES`
files or `MAX_BYTES` bytes (far past any default) is refused here, saying how large it is.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from pathlib import Path, PurePosixPath

from gateway.client.base import FileSpec
from gateway.models.record import ReturnedFileContent, ReturnedFileError

MiB = 1024 * 1024
MAX_FILES = 10_000
MAX_BYTES = 256 * MiB


class StagingError(Exception):
    """A `--files` path that cannot be sent, or a returned file that cannot be saved."""


@dataclasses.dataclass(frozen=True)
class Staged:
    """What one `--files` argument became."""

    given: str
    files: list[tuple[str, Path]]  # (path in the run's folder, local file)
    size: int

    def describe(self) -> str:
        noun = "file" if len(self.files) == 1 else "files"
        return f"{self.given} ({len(self.files)} {noun}, {_size(self.size)})"


def stage(paths: list[str]) -> list[Staged]:
    """Each path's files, without reading them yet; a path given twice once."""
    staged: list[Staged] = []
    seen: set[str] = set()
    for given in paths:
        local = Path(given)
        if not local.exists():
            raise StagingError(f"--files {given}: no such file or folder")
        prefix = _remote_name(given)
        files: list[tuple[str, Path]] = []
        size = 0
        if local.is_dir():
            for root, folders, names in os.walk(local):
                folders.sort()
                for name in sorted(names):
                    path = Path(root) / name
                    if not path.is_file():  # a socket, a dangling link
                        continue
                    inside = path.relative_to(local).as_posix()
                    files.append((f"{prefix}/{inside}" if prefix else inside, path))
                    size += path.stat().st_size
                    if len(files) > MAX_FILES or size > MAX_BYTES:
                        raise StagingError(_too_large(given, len(files), size))
        elif local.is_file():
            size = local.stat().st_size
            if size > MAX_BYTES:
                raise StagingError(_too_large(given, 1, size))
            files.append((prefix or local.name, local))
        else:
            raise StagingError(f"--files {given}: not a regular file or a folder")
        files = [(remote, path) for remote, path in files if remote not in seen]
        seen.update(remote for remote, _ in files)
        staged.append(Staged(given, files, size))
    total_files = sum(len(s.files) for s in staged)
    total = sum(s.size for s in staged)
    if total_files > MAX_FILES or total > MAX_BYTES:
        raise StagingError(_too_large("all --files together", total_files, total))
    return staged


def file_specs(staged: list[Staged]) -> list[FileSpec]:
    """The files' `FileSpec`s, read now (text as UTF-8, anything else as base64)."""
    specs: list[FileSpec] = []
    for item in staged:
        for remote, path in item.files:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise StagingError(f"--files {item.given}: cannot read {path}: {exc}") from exc
            try:
                specs.append({"path": remote, "content": data.decode("utf-8")})
            except UnicodeDecodeError:
                content = base64.b64encode(data).decode("ascii")
                specs.append({"path": remote, "content": content, "encoding": "base64"})
    return specs


def _remote_name(given: str) -> str:
    """The path a local path is staged under (see the module docstring); "" for `.`."""
    parts = PurePosixPath(Path(given).as_posix()).parts
    if given.startswith(("/", "~")) or ".." in parts:
        return Path(given).resolve().name
    kept = [part for part in parts if part not in (".", "")]
    return "/".join(kept)


def _too_large(given: str, files: int, size: int) -> str:
    more = "more than " if files > MAX_FILES or size > MAX_BYTES else ""
    return (
        f"--files {given} holds {more}{files} files of {more}{_size(size)}: too large to send "
        f"(a run takes at most {MAX_FILES} files of {_size(MAX_BYTES)} here, and the gateway's "
        "own limits are lower: by default 1000 files, 10 MiB each, 32 MiB in all). Name the "
        "files the notebook needs, or upload an archive."
    )


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < MiB:
        return f"{size / 1024:.1f} KiB"
    return f"{size / MiB:.1f} MiB"


# --- returned files ---------------------------------------------------------------------------


def save_returned(
    entries: list[ReturnedFileContent | ReturnedFileError], folder: Path
) -> tuple[list[Path], list[str]]:
    """Write each returned file under `folder` at its relative path; (saved, problems).

    The paths come from the gateway: one that is absolute, leaves `folder`, or would write
    through a link is not written (a problem says so), whoever sent it."""
    saved: list[Path] = []
    problems: list[str] = []
    base = folder.resolve()
    for entry in entries:
        if isinstance(entry, ReturnedFileError):
            problems.append(f"{entry.path}: not returned ({entry.error})")
            continue
        parts = PurePosixPath(entry.path).parts
        if not parts or entry.path.startswith("/") or ".." in parts or "\x00" in entry.path:
            problems.append(f"{entry.path!r}: not saved (not a path inside the folder)")
            continue
        target = base.joinpath(*parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.parent.resolve().is_relative_to(base) or target.is_symlink():
                problems.append(f"{entry.path}: not saved (it would be written through a link)")
                continue
            if entry.encoding == "base64":
                target.write_bytes(base64.b64decode(entry.content))
            else:
                target.write_text(entry.content, encoding="utf-8")
        except (OSError, ValueError) as exc:
            problems.append(f"{entry.path}: not saved ({exc})")
            continue
        saved.append(target)
    return saved, problems
