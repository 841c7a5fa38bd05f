"""Read a zip archive within limits: its central directory is counted (without building
an object per record) and every entry's declared sizes, type and name are checked before
anything is decompressed; then each entry is inflated in pieces, its actual bytes counted.
Only stored and deflate entries are read (deflate output is bounded per call; bzip2 and
lzma are not, so they are refused).
"""

from __future__ import annotations

import stat
import struct
import zipfile
from typing import BinaryIO

from gateway.errors import GatewayError
from gateway.uploads.limits import (
    CHUNK,
    ArchiveLimits,
    Budget,
    PathTree,
    Unpacked,
    archive_error,
    entry_path,
    invalid,
)

_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_ENTRY = 46
_SUPPORTED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}


def read_zip(source: BinaryIO, size: int, limits: ArchiveLimits, keep: bool) -> Unpacked:
    """Check what the central directory declares, then inflate and count; see the module doc."""
    _count_central_directory(source, size, limits)
    try:
        archive = zipfile.ZipFile(source)
    except Exception as exc:  # zipfile raises many kinds for a corrupt archive
        raise invalid(f"The zip archive is corrupt: {exc}.") from exc
    budget, tree = Budget(limits), PathTree()
    with archive:
        planned: list[tuple[zipfile.ZipInfo, str]] = []
        for info in archive.infolist():  # 1. what the central directory declares
            name = info.filename
            budget.entry(name)
            is_folder = _zip_is_folder(info)
            path = entry_path(name)
            if is_folder:
                if path is not None:
                    tree.add_folder(path, name)
                continue
            if path is None:
                raise invalid(f"The entry {name!r} names no file.")
            if info.flag_bits & 0x1:
                raise invalid(f"The entry {name!r} is encrypted; encrypted zips are not supported.")
            if info.compress_type not in _SUPPORTED_METHODS:
                raise invalid(
                    f"The entry {name!r} uses zip compression method {info.compress_type}; "
                    f"only stored and deflate are supported."
                )
            budget.declare(name, info.file_size, info.compress_size)
            tree.add_file(path, name)
            planned.append((info, path))
        for info, path in planned:  # 2. the bytes actually produced
            data = _zip_data(archive, info, budget, keep)
            if keep:
                tree.files[path] = data
    return tree.unpacked("zip", budget, keep)


def _count_central_directory(source: BinaryIO, size: int, limits: ArchiveLimits) -> None:
    """Count the central directory's records before zipfile builds an object for each."""
    tail_size = min(size, _EOCD.size + 0xFFFF)
    source.seek(size - tail_size)
    tail = source.read(tail_size)
    # As zipfile does: an end record without a comment first, else the last one in the tail.
    no_comment = tail_size - _EOCD.size
    if (
        no_comment >= 0
        and tail[no_comment : no_comment + 4] == b"PK\x05\x06"
        and tail[-2:] == b"\x00\x00"
    ):
        at = no_comment
    else:
        at = tail.rfind(b"PK\x05\x06")
    if at < 0 or tail_size - at < _EOCD.size:
        raise invalid("The zip archive is incomplete: it has no end of central directory.")
    end = size - tail_size + at
    directory_size = _EOCD.unpack_from(tail, at)[5]
    locator_at = end - _ZIP64_LOCATOR.size
    if locator_at - _ZIP64_EOCD.size >= 0:
        source.seek(locator_at)
        if source.read(4) == b"PK\x06\x07":
            source.seek(locator_at - _ZIP64_EOCD.size)
            record = source.read(_ZIP64_EOCD.size)
            if record[:4] == b"PK\x06\x06":
                directory_size = _ZIP64_EOCD.unpack(record)[8]
                end = locator_at - _ZIP64_EOCD.size
    start = end - directory_size
    if start < 0:
        raise invalid("The zip archive's central directory is out of bounds.")
    source.seek(start)
    directory = source.read(directory_size)
    position = count = 0
    while position < len(directory):
        if directory[position : position + 4] != b"PK\x01\x02":
            raise invalid("The zip archive's central directory is corrupt.")
        if position + _CENTRAL_ENTRY > len(directory):
            raise invalid("The zip archive's central directory is truncated.")
        name, extra, comment = struct.unpack_from("<3H", directory, position + 28)
        position += _CENTRAL_ENTRY + name + extra + comment
        count += 1
        if count > limits.entries:
            raise archive_error(
                "archive_too_many_entries",
                f"The archive has more than {limits.entries} entries (counting files and folders).",
            )


def _zip_is_folder(info: zipfile.ZipInfo) -> bool:
    """Whether the entry is a folder; links, devices and the like are refused."""
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    name = info.filename
    if kind == stat.S_IFLNK:
        raise archive_error(
            "archive_link", f"The entry {name!r} is a symbolic link; links are not allowed."
        )
    if kind in (stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK):
        raise archive_error(
            "archive_special_file",
            f"The entry {name!r} is a device, fifo or socket; only files and folders are allowed.",
        )
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise invalid(f"The entry {name!r} has an unknown file type ({kind:o}).")
    return kind == stat.S_IFDIR or name.endswith(("/", "\\"))


def _zip_data(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: Budget, keep: bool) -> bytes:
    name = info.filename
    chunks: list[bytes] = []
    produced = 0
    try:
        with archive.open(info) as entry:
            while chunk := entry.read(CHUNK):
                produced += len(chunk)
                # zipfile never reads past the declared compressed size, so this bounds
                # the ratio actually achieved from below.
                budget.produced(name, produced, info.compress_size, len(chunk))
                if keep:
                    chunks.append(chunk)
    except GatewayError:
        raise
    except Exception as exc:  # BadZipFile (CRC, header mismatch), zlib.error, EOFError, ...
        raise invalid(f"The entry {name!r} could not be read: {exc}.") from exc
    return b"".join(chunks)
