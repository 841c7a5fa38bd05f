"""Check and unpack an uploaded archive (.zip or .tar.gz) without trusting anything in it.

Pure, blocking code: callers run it in a thread. Every limit is checked twice: before any
entry's data is decompressed, from what the archive declares (a zip's central directory;
each tar header as the gzip stream is walked, its total decompressed size bounded), and
again while the data is decompressed, from the bytes actually produced, so a lying header
gains nothing. Data is decompressed in pieces of `CHUNK` bytes; nothing is kept unless the
caller asks for the files (`keep=True`), and then at most `max_unpacked_bytes` are.

    what is refused                             error code                  status
    the archive itself too large                archive_too_large           413
    entries adding up to too much               archive_unpacked_too_large  413
    too many entries (files and folders)        archive_too_many_entries    413
    one file too large                          archive_entry_too_large     413
    one file compressed more than the ratio     archive_ratio_exceeded      413
    an absolute path (/x, C:/x)                 archive_absolute_path       400
    a `..` path component                       archive_path_traversal      400
    a symbolic or hard link                     archive_link                400
    a device, fifo or socket                    archive_special_file        400
    corrupt data, an unknown format, encryption,
    an unsupported compression or entry type,
    an unusable name, a file where a folder is  archive_invalid             400

The limits, counters and path rules are in `limits`; the two readers in `zipread` and
`tarread`.
"""

from __future__ import annotations

import io
from typing import BinaryIO

from gateway.uploads.limits import ArchiveLimits, Format, Unpacked, archive_error, invalid
from gateway.uploads.tarread import read_tar_gz
from gateway.uploads.zipread import read_zip

__all__ = [
    "LENIENT_TYPES",
    "RAW_TYPES",
    "ArchiveLimits",
    "Format",
    "Unpacked",
    "archive_error",
    "detect_format",
    "read_archive",
]

# Media types of a raw upload body: the format is told by the archive's first bytes, so
# these only say "raw bytes". The OpenAPI document lists them from here.
RAW_TYPES = (
    "application/zip",
    "application/x-zip-compressed",
    "application/gzip",
    "application/x-gzip",
    "application/x-tar+gzip",
    "application/x-compressed-tar",
    "application/x-tgz",
    "application/octet-stream",
)
# Also accepted, not advertised: none at all, and what `curl --data-binary @file` sends
# unless told otherwise.
LENIENT_TYPES = ("", "application/x-www-form-urlencoded")


def detect_format(head: bytes) -> Format:
    """The archive's format from its first bytes (the name and media type are not trusted)."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:3] == b"\x1f\x8b\x08":
        return "tar.gz"
    raise invalid("The upload is neither a .zip nor a .tar.gz archive.")


def read_archive(source: BinaryIO, limits: ArchiveLimits, *, keep: bool = False) -> Unpacked:
    """Check every entry of the archive against the limits, decompressing it all (bounded);
    with `keep`, also return the files. Raises the archive_* errors."""
    size = source.seek(0, io.SEEK_END)
    if size > limits.upload_bytes:
        raise archive_error(
            "archive_too_large",
            f"The archive has {size} bytes; at most {limits.upload_bytes} are allowed.",
        )
    source.seek(0)
    fmt = detect_format(source.read(4))
    source.seek(0)
    if fmt == "zip":
        return read_zip(source, size, limits, keep)
    return read_tar_gz(source, limits, keep)
