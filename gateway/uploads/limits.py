"""What an uploaded archive may hold, and the shared machinery that enforces it: the
limits, the error each violation raises, the counters of entries and bytes, and the rules
for entry paths. The readers (`zipread`, `tarread`) use these; `archives` is the entry point.

Files of at most `RATIO_EXEMPT_BYTES` are not ratio-checked (small files of zeros compress
far beyond any sensible ratio and cannot hurt). A backslash in an entry name is read as a
folder separator; `.` components and a leading `./` are dropped.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import PurePosixPath
from typing import Literal

from gateway.errors import GatewayError, InvalidPath, InvalidRequest, PayloadTooLarge
from gateway.models.request import StagedFile
from gateway.models.run import checked_path

Format = Literal["zip", "tar.gz"]

KiB = 1024
MiB = 1024 * KiB
CHUNK = 64 * KiB  # decompressed (and compressed) bytes handled at a time
RATIO_EXEMPT_BYTES = 1 * MiB  # files up to this size are not ratio-checked
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255  # one path component

_ERRORS: dict[str, type[GatewayError]] = {
    "archive_too_large": PayloadTooLarge,
    "archive_unpacked_too_large": PayloadTooLarge,
    "archive_too_many_entries": PayloadTooLarge,
    "archive_entry_too_large": PayloadTooLarge,
    "archive_ratio_exceeded": PayloadTooLarge,
    "archive_absolute_path": InvalidRequest,
    "archive_path_traversal": InvalidRequest,
    "archive_link": InvalidRequest,
    "archive_special_file": InvalidRequest,
    "archive_invalid": InvalidRequest,
}


def archive_error(code: str, message: str) -> GatewayError:
    """The API error for one of the archive codes above."""
    return _ERRORS[code](message, code=code)


def invalid(message: str) -> GatewayError:
    return archive_error("archive_invalid", message)


@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
    upload_bytes: int
    unpacked_bytes: int
    entries: int
    file_bytes: int
    ratio: float


@dataclasses.dataclass(frozen=True)
class Unpacked:
    """What an archive holds. `files` is filled only when read with `keep=True`."""

    format: Format
    entries: int  # every file and folder entry, as counted against the limit
    unpacked_bytes: int  # the files' sizes added up
    files: tuple[StagedFile, ...] = ()
    folders: tuple[str, ...] = ()  # folder entries (folders of files are implied)


class Budget:
    """Entries and bytes counted against the limits: declared sizes before unpacking,
    actual bytes while unpacking."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.entries = 0
        self.declared = 0
        self.actual = 0

    def entry(self, name: str) -> None:
        self.entries += 1
        if self.entries > self.limits.entries:
            raise archive_error(
                "archive_too_many_entries",
                f"The archive has more than {self.limits.entries} entries "
                f"(counting files and folders; {name!r} is one too many).",
            )

    def declare(self, name: str, size: int, compressed: int | None) -> None:
        self._check_file(name, size)
        self.declared += size
        self._check_total(name, self.declared)
        if compressed is not None:
            self._check_ratio(name, size, compressed)

    def produced(self, name: str, entry_bytes: int, entry_compressed: int, count: int) -> None:
        self.actual += count
        self._check_file(name, entry_bytes)
        self._check_total(name, self.actual)
        self._check_ratio(name, entry_bytes, entry_compressed)

    def _check_file(self, name: str, size: int) -> None:
        if size > self.limits.file_bytes:
            raise archive_error(
                "archive_entry_too_large",
                f"The entry {name!r} unpacks to {size} bytes or more; at most "
                f"{self.limits.file_bytes} are allowed per file.",
            )

    def _check_total(self, name: str, total: int) -> None:
        if total > self.limits.unpacked_bytes:
            raise archive_error(
                "archive_unpacked_too_large",
                f"The archive unpacks to more than {self.limits.unpacked_bytes} bytes "
                f"(the limit was passed at {name!r}).",
            )

    def _check_ratio(self, name: str, size: int, compressed: int) -> None:
        if size > RATIO_EXEMPT_BYTES and size > self.limits.ratio * max(compressed, 1):
            raise archive_error(
                "archive_ratio_exceeded",
                f"The entry {name!r} expands {size} bytes from {compressed} compressed, more "
                f"than the allowed ratio of {self.limits.ratio:g}:1 (a zip bomb?).",
            )


_DRIVE = re.compile(r"^[A-Za-z]:/")


def entry_path(name: str) -> str | None:
    """The entry's path inside the working folder, or None for the archive's top folder."""
    if "\x00" in name:
        raise invalid(f"The entry name {name!r} contains a NUL byte.")
    unified = name.replace("\\", "/")
    if unified.startswith("/") or _DRIVE.match(unified):
        raise archive_error(
            "archive_absolute_path", f"The entry {name!r} has an absolute path; use relative ones."
        )
    parts = [part for part in unified.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise archive_error(
            "archive_path_traversal",
            f"The entry {name!r} climbs out of the working folder with `..`.",
        )
    if not parts:
        return None
    path = "/".join(parts)
    if len(path.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise invalid(f"The entry name {name!r} is too long for a file system.")
    try:
        return checked_path(path, "archive")
    except InvalidPath as exc:
        raise invalid(f"The entry {name!r} has an unusable path: {exc.message}") from exc


class PathTree:
    """The paths seen so far: a file never stands where a folder is, nor inside a file.
    A path given twice keeps its last entry (as tar does)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.folders: set[str] = set()  # every folder, given or implied by a path
        self.given_folders: list[str] = []

    def add_file(self, path: str, name: str) -> None:
        if path in self.folders:
            raise invalid(f"The entry {name!r} is a file where the archive has a folder.")
        self._add_parents(path, name)
        self.files.pop(path, None)
        self.files[path] = b""

    def add_folder(self, path: str, name: str) -> None:
        if path in self.files:
            raise invalid(f"The entry {name!r} is a folder where the archive has a file.")
        self._add_parents(path, name)
        if path not in self.folders:
            self.folders.add(path)
            self.given_folders.append(path)

    def _add_parents(self, path: str, name: str) -> None:
        for parent in map(str, PurePosixPath(path).parents):
            if parent == "." or parent in self.folders:
                return  # its own parents were added with it
            if parent in self.files:
                raise invalid(f"The entry {name!r} lies inside {parent!r}, which is a file.")
            self.folders.add(parent)

    def staged(self) -> tuple[StagedFile, ...]:
        return tuple(StagedFile(path=path, data=data) for path, data in self.files.items())

    def unpacked(self, format: Format, budget: Budget, keep: bool) -> Unpacked:
        """What the archive held, once read to its end (its files only when `keep`)."""
        return Unpacked(
            format=format,
            entries=budget.entries,
            unpacked_bytes=budget.actual,
            files=self.staged() if keep else (),
            folders=tuple(self.given_folders),
        )
