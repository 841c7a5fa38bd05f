"""How an answer's bytes are made: its size foreseen before they exist, the JSON encoded, and
gzip applied when the client takes it. The one place answers are compressed (tornado's own
`compress_response` is off: it compressed on the event loop, whatever the size).

`json_size` walks a value without encoding it, so that an answer can wait for room in the
answers budget before its bytes are made. The walk costs per node, not per byte (a string
of 50 MiB is one node), so it runs inline up to `INLINE_NODES` nodes and in the heavy-work
pool past that (a record of a million outputs).
"""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from typing import Any

from tornado.httputil import HTTPServerRequest

from gateway.jsoncodec import dumps_utf8
from gateway.offload import offload

GZIP_LEVEL = 6  # what tornado's transform used: gzip's own default
GZIP_MIN_BYTES = 1024  # smaller answers gain nothing once gzip's header is added
INLINE_NODES = 20_000
PIECE_BYTES = 1024 * 1024  # what one call of the C encoder is given at most, about
PIECE_NODES = 50_000
PART_BYTES = 64 * 1024  # pieces are written in parts of at least this much

_NUMBER = 12  # bytes a number, true, false or null takes, about
_COMPRESSIBLE = {"application/javascript", "application/xml", "image/svg+xml"}


def _walk(value: Any, max_nodes: int | None, max_bytes: int | None = None) -> int | None:
    """About the size of `value` as `dumps_utf8` writes it (ASCII text exactly; others
    less); None once more than `max_nodes` nodes or `max_bytes` bytes were seen."""
    size = 0
    nodes = 0
    stack = [value]
    while stack:
        item = stack.pop()
        nodes += 1
        if max_nodes is not None and nodes > max_nodes:
            return None
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, dict):
            size += 2 + 2 * len(item)
            for key, inner in item.items():
                size += len(key) + 4
                stack.append(inner)
        elif isinstance(item, list | tuple):
            size += 2 + 2 * len(item)
            stack.extend(item)
        else:
            size += _NUMBER
        if max_bytes is not None and size > max_bytes:
            return None
    return size


async def json_size(value: Any) -> int:
    """About how many bytes `value` (plain JSON) is once encoded."""
    size = _walk(value, INLINE_NODES)
    if size is None:
        size = await offload(_walk, value, None)
    assert size is not None
    return size


def accepts_gzip(request: HTTPServerRequest) -> bool:
    return "gzip" in request.headers.get("Accept-Encoding", "")


def compressible(content_type: str) -> bool:
    """Text, JSON (`application/json`, `application/<x>+json`) and a few text formats."""
    media = content_type.split(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return (
        kind == "text"
        or media in _COMPRESSIBLE
        or (kind == "application" and (subtype == "json" or subtype.endswith("+json")))
    )


def compress(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


@dataclasses.dataclass
class Encoded:
    """An answer's bytes, in parts (written one after another, never joined into one copy)."""

    parts: list[bytes]
    size: int
    gzipped: bool


def encode(value: Any, use_gzip: bool) -> Encoded:
    """`value` as UTF-8 JSON (`dumps_utf8`'s bytes; where a lone surrogate makes a piece
    fall back to escapes, that piece alone), gzip-compressed when `use_gzip` and worth it.
    Made in pieces of at most about `PIECE_BYTES`: `json.dumps` is C code that keeps the
    GIL for the whole document (0.2 s for 50 MiB, during which the event loop cannot run,
    pool or not); between pieces it can, and zlib lets go of the GIL anyway."""
    pieces: list[bytes] = []
    _encode_into(value, pieces)
    size = sum(len(piece) for piece in pieces)
    gzipped = use_gzip and size >= GZIP_MIN_BYTES
    if gzipped:
        deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        for index, piece in enumerate(pieces):
            pieces[index] = deflate.compress(piece)
        pieces.append(deflate.flush())
        size = sum(len(piece) for piece in pieces)
    return Encoded(_coalesced(pieces), size, gzipped)


def encode_json(value: Any) -> bytes:
    """`dumps_utf8(value)`, made as `encode` makes it."""
    return b"".join(encode(value, False).parts)


def _coalesced(pieces: list[bytes]) -> list[bytes]:
    """Small pieces joined into parts of at least `PART_BYTES` (a write per piece would cost
    the event loop more than the bytes); large ones kept as they are."""
    parts: list[bytes] = []
    pending: list[bytes] = []
    pending_size = 0
    for piece in pieces:
        if len(piece) >= PART_BYTES:
            if pending:
                parts.append(b"".join(pending))
                pending, pending_size = [], 0
            parts.append(piece)
            continue
        pending.append(piece)
        pending_size += len(piece)
        if pending_size >= PART_BYTES:
            parts.append(b"".join(pending))
            pending, pending_size = [], 0
    if pending:
        parts.append(b"".join(pending))
    return parts


def _encode_into(value: Any, parts: list[bytes]) -> None:
    if isinstance(value, str):
        if len(value) <= PIECE_BYTES:
            parts.append(dumps_utf8(value))
            return
        parts.append(b'"')
        for start in range(0, len(value), PIECE_BYTES):
            parts.append(dumps_utf8(value[start : start + PIECE_BYTES])[1:-1])
        parts.append(b'"')
    elif (
        not isinstance(value, dict | list | tuple)
        or _walk(value, PIECE_NODES, PIECE_BYTES) is not None
    ):
        parts.append(dumps_utf8(value))
    elif isinstance(value, dict):
        parts.append(b"{")
        for index, (key, inner) in enumerate(value.items()):
            parts.append(b", " if index else b"")
            parts.append(dumps_utf8(key) + b": ")
            _encode_into(inner, parts)
        parts.append(b"}")
    else:
        parts.append(b"[")
        _encode_items(list(value), parts)
        parts.append(b"]")


def _encode_items(items: list[Any], parts: list[bytes]) -> None:
    """A large list's items: runs of items small together go to the C encoder as one
    piece (a notebook's 400,000 cells are 30 calls, not 400,000), an item too large for
    that is encoded on its own, in pieces. The run's length adapts as it goes."""
    start, run, ceiling = 0, 1024, 1 << 16
    while start < len(items):
        chunk = items[start : start + run]
        if run > 1 and _walk(chunk, PIECE_NODES, PIECE_BYTES) is None:
            ceiling = max(1, run // 2)
            run = max(1, run // 4)
            continue
        if start:
            parts.append(b", ")
        if run == 1:
            _encode_into(chunk[0], parts)
        else:
            parts.append(dumps_utf8(chunk)[1:-1])
        start += len(chunk)
        run = min(run * 2, ceiling)
