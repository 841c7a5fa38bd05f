"""Read a .tar.gz archive within limits, in one streaming pass: the gzip stream is
inflated in pieces (its total output bounded), each tar header is parsed here (tarfile would
read pax and long-name headers of any size into memory) and checked before its data is
read, and the data's actual bytes and compression ratio are counted as they arrive.
"""

from __future__ import annotations

import dataclasses
import re
import struct
import zlib
from typing import BinaryIO

from gateway.errors import GatewayError
from gateway.uploads.limits import (
    CHUNK,
    ArchiveLimits,
    Budget,
    KiB,
    PathTree,
    Unpacked,
    archive_error,
    entry_path,
    invalid,
)

MAX_EXTENDED_HEADER_BYTES = 64 * KiB  # a pax header or GNU long name
TAR_OVERHEAD_PER_ENTRY = 4 * KiB  # tar headers and padding allowed per entry
BLOCK = 512

_REGULAR = {b"0", b"\x00", b"7"}
_FOLDER = b"5"
_LINKS = {b"1": "hard link", b"2": "symbolic link"}
_SPECIAL = {b"3": "character device", b"4": "block device", b"6": "fifo"}
_EXTENDED = {b"x", b"g", b"L", b"K"}  # pax (local, global), GNU long name, GNU long link
_PAX_KEYS = {"path", "linkpath", "size"}
_ZERO_BLOCK = bytes(BLOCK)
_OCTAL = re.compile(rb"[0-7]+")
_DECIMAL = re.compile(rb"[0-9]+")


class _GzipStream:
    """The decompressed bytes of a gzip stream (members may follow each other), produced
    CHUNK bytes at a time and never more than `cap` in total; `consumed` counts the
    compressed bytes used so far."""

    def __init__(self, source: BinaryIO, cap: int) -> None:
        self.source = source
        self.cap = cap
        self.consumed = 0
        self.produced = 0
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input = b""
        self._buffer = bytearray()
        self._ended = False

    @property
    def position(self) -> int:
        """How many decompressed bytes were read so far."""
        return self.produced - len(self._buffer)

    def read(self, size: int) -> bytes:
        """`size` bytes, fewer only at the end of the stream."""
        while len(self._buffer) < size and not self._ended:
            self._inflate_more()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def skip(self, size: int) -> None:
        while size > 0:
            data = self.read(min(size, CHUNK))
            if not data:
                raise invalid("The tar.gz archive is truncated.")
            size -= len(data)

    def _inflate_more(self) -> None:
        if not self._input:
            self._input = self.source.read(CHUNK)
            if not self._input:
                if not self._inflate.eof:
                    raise invalid("The tar.gz archive is truncated.")
                self._ended = True
                return
        if self._inflate.eof:  # another gzip member follows
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        given = self._input
        try:
            out = self._inflate.decompress(given, CHUNK)
        except zlib.error as exc:
            raise invalid(f"The gzip stream is corrupt: {exc}.") from exc
        self._input = self._inflate.unconsumed_tail + self._inflate.unused_data
        if not out and len(self._input) == len(given) and not self._inflate.eof:
            raise invalid("The gzip stream is corrupt: it makes no progress.")
        self.consumed += len(given) - len(self._input)
        self.produced += len(out)
        if self.produced > self.cap:
            raise archive_error(
                "archive_unpacked_too_large",
                f"The archive decompresses to more than {self.cap} bytes.",
            )
        self._buffer += out


@dataclasses.dataclass(frozen=True)
class _TarHeader:
    name: bytes
    size: int
    kind: bytes
    link: bytes


def _cstring(field: bytes) -> bytes:
    return field.split(b"\x00", 1)[0]


def _tar_number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        if field[0] != 0x80:
            raise invalid("A tar header holds a negative number.")
        return int.from_bytes(field[1:], "big")
    text = _cstring(field).strip(b" ")
    if not text:
        return 0
    if not _OCTAL.fullmatch(text):
        raise invalid("The tar.gz archive is corrupt: a header number is not octal.")
    return int(text, 8)


def _tar_header(block: bytes, offset: int) -> _TarHeader:
    unsigned = 256 + sum(block[:148]) + sum(block[156:])
    signed = 256 + sum(struct.unpack_from("148b8x356b", block))
    try:
        checksum: int | None = _tar_number(block[148:156])
    except GatewayError:
        checksum = None
    if checksum not in (unsigned, signed):
        raise invalid(
            f"The gzip stream does not hold a valid tar archive (bad header checksum at "
            f"byte {offset})."
        )
    name = _cstring(block[0:100])
    if block[257:263] == b"ustar\x00":  # POSIX ustar: a prefix completes long names
        prefix = _cstring(block[345:500])
        if prefix:
            name = prefix + b"/" + name
    return _TarHeader(
        name=name, size=_tar_number(block[124:136]), kind=block[156:157], link=block[157:257]
    )


def _pax_records(data: bytes) -> dict[str, bytes]:
    """The records of a pax header that matter here (path, linkpath, size)."""
    found: dict[str, bytes] = {}
    position = 0
    while position < len(data) and data[position] != 0:
        space = data.find(b" ", position, position + 20)
        length_text = data[position:space] if space > position else b""
        if not _DECIMAL.fullmatch(length_text):
            raise invalid("The tar.gz archive has a corrupt pax header.")
        end = position + int(length_text)
        if end <= space + 1 or end > len(data) or data[end - 1] != 0x0A:
            raise invalid("The tar.gz archive has a corrupt pax header.")
        key, equals, value = data[space + 1 : end - 1].partition(b"=")
        if not equals:
            raise invalid("The tar.gz archive has a corrupt pax header.")
        text_key = key.decode("utf-8", "replace")
        if text_key in _PAX_KEYS:
            found[text_key] = value
        position = end
    return found


def _tar_name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = raw.decode("utf-8", "replace")
        raise invalid(f"The entry name {shown!r} is not UTF-8.") from exc


def read_tar_gz(source: BinaryIO, limits: ArchiveLimits, keep: bool) -> Unpacked:
    """Walk the archive once, checking each header before its data; see the module doc."""
    cap = limits.unpacked_bytes + TAR_OVERHEAD_PER_ENTRY * (limits.entries + 1)
    stream = _GzipStream(source, cap)
    budget, tree = Budget(limits), PathTree()
    pax: dict[str, bytes] = {}
    long_name: bytes | None = None
    while True:
        offset = stream.position
        block = stream.read(BLOCK)
        if not block and offset == 0:
            raise invalid("The gzip stream is empty: it holds no tar archive.")
        if not block or block == _ZERO_BLOCK:
            break  # the end-of-archive marker (or the end of the stream at a boundary)
        if len(block) < BLOCK:
            raise invalid("The tar.gz archive is truncated.")
        header = _tar_header(block, offset)
        if header.kind in _EXTENDED:
            if header.size > MAX_EXTENDED_HEADER_BYTES:
                raise invalid(
                    f"The tar.gz archive has an extended header of {header.size} bytes; at most "
                    f"{MAX_EXTENDED_HEADER_BYTES} are allowed."
                )
            data = stream.read(header.size)
            if len(data) < header.size:
                raise invalid("The tar.gz archive is truncated.")
            stream.skip(-header.size % BLOCK)
            if header.kind == b"x":
                pax.update(_pax_records(data))
            elif header.kind == b"L":
                long_name = _cstring(data)
            continue
        name = _tar_name(pax.get("path") or long_name or header.name)
        size = header.size
        if "size" in pax:
            if not _DECIMAL.fullmatch(pax["size"]):
                raise invalid(f"The entry {name!r} has a corrupt pax size.")
            size = int(pax["size"])
        link = pax.get("linkpath") or _cstring(header.link)
        pax, long_name = {}, None
        budget.entry(name)
        _check_tar_kind(header.kind, name, link)
        path = entry_path(name)
        if header.kind == _FOLDER:  # like tarfile, a folder's size is ignored
            if path is not None:
                tree.add_folder(path, name)
            continue
        if path is None:
            raise invalid(f"The entry {name!r} names no file.")
        budget.declare(name, size, None)
        tree.add_file(path, name)
        data = _tar_data(stream, name, size, budget, keep)
        if keep:
            tree.files[path] = data
    return tree.unpacked("tar.gz", budget, keep)


def _check_tar_kind(kind: bytes, name: str, link: bytes) -> None:
    if kind in _LINKS:
        target = link.decode("utf-8", "replace")
        raise archive_error(
            "archive_link",
            f"The entry {name!r} is a {_LINKS[kind]} (to {target!r}); links are not allowed.",
        )
    if kind in _SPECIAL:
        raise archive_error(
            "archive_special_file",
            f"The entry {name!r} is a {_SPECIAL[kind]}; only files and folders are allowed.",
        )
    if kind not in _REGULAR and kind != _FOLDER:
        shown = kind.decode("latin-1")
        raise invalid(f"The entry {name!r} has an unsupported tar type {shown!r}.")


def _tar_data(stream: _GzipStream, name: str, size: int, budget: Budget, keep: bool) -> bytes:
    chunks: list[bytes] = []
    produced = 0
    compressed_before = stream.consumed
    while produced < size:
        chunk = stream.read(min(CHUNK, size - produced))
        if not chunk:
            raise invalid(f"The tar.gz archive is truncated inside {name!r}.")
        produced += len(chunk)
        budget.produced(name, produced, stream.consumed - compressed_before, len(chunk))
        if keep:
            chunks.append(chunk)
    stream.skip(-size % BLOCK)
    return b"".join(chunks)
