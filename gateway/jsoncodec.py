"""JSON at the gateway's edges: what clients send is measured before it is parsed and
parsed within limits, what the gateway answers is always valid UTF-8.

In, before parsing (`scan`): a document's bytes say what parsing them would make. 47 MiB of
`{}` is 16 million dicts, 2.4 GiB of memory and 18 s of one C call holding the GIL, so a
byte budget alone bounds nothing. `scan` counts, in C-speed passes over the bytes, the
values a document holds (objects, arrays, strings, numbers and literals; an object's keys
come with their values), its containers and strings, and how wide its text decodes, and
refuses a document over its `JsonLimits` (413) before a single object exists. Its
`JsonShape.parsed_bytes()` is an upper bound of the memory the parse takes at its peak
(the text decoded, and every object made), which the handlers take from the bodies budget
before they parse. `tests/test_jsoncodec.py` holds that bound against tracemalloc for the
worst shapes.

In, while parsing (`parse_json`): Python's `json` recurses once per level, so a document
nested a few thousand levels deep raises `RecursionError` while it is parsed, and one just
under the interpreter's limit raises it later, wherever the value is copied, validated or
encoded again. `parse_json` refuses documents deeper than `JsonLimits.depth` (and whatever
else `json.loads` raises) as a 400; values the gateway did not parse itself (a kernel's
`result`) are checked with `too_deep` before they are kept. `NaN` and `Infinity` are not
JSON (RFC 8259), a number no double can hold (`1e999`) would become infinity, and a string
with a lone surrogate (`"\\ud800"`, or its bytes) is not Unicode text: all are refused too,
so that no such value reaches a kernel, a file name or a record.

Out: a kernel can smuggle a lone surrogate into an output (its messages are JSON that any
code in the kernel can write); `dumps_utf8` then escapes it instead of failing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from gateway.errors import InvalidRequest, PayloadTooLarge

_CONTAINERS = (dict, list)
_SURROGATE = re.compile("[\ud800-\udfff]")

# What one value costs once parsed, at most (CPython 3.11, 64-bit; tests/test_jsoncodec.py
# measures it): a container's own object, a value's slot in its container (an object's
# entry, key and value, in a hash table grown by doubling) and its object, a string's header.
CONTAINER_BYTES = 120
PARSE_BYTES = 64 * 1024  # the parser's own (its scanner, the keys it remembers)
VALUE_BYTES = 112
STRING_BYTES = 80
# A document of at most these many bytes and values is `small`: parsed where it arrives.
SMALL_BYTES = 256 * 1024
SMALL_VALUES = 4096
# The scan looks at the bytes in pieces of about this size, so that no single C call of it
# (a regular expression over many short strings) holds the GIL long.
SCAN_PIECE = 256 * 1024
_STRING = re.compile(rb'"[^"]*"')  # a string once its escaped quotes are gone
_WHITESPACE = b" \t\n\r"  # JSON's
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"{}[]")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")  # a surrogate's UTF-8 form: not UTF-8
_FOUR_BYTES = re.compile(rb"[\xf0-\xf4]")  # lead bytes of characters past U+FFFF
_TWO_OR_THREE_BYTES = re.compile(rb"[\xc4-\xef]")  # lead bytes of U+0100..U+FFFF


@dataclasses.dataclass(frozen=True)
class JsonLimits:
    """What one document may hold: nesting `depth`, `values` (objects, arrays, strings,
    numbers, literals; an object's keys come with their values) and, for a notebook,
    `cells` (objects with a `cell_type`; None: not a notebook)."""

    depth: int
    values: int
    cells: int | None = None


@dataclasses.dataclass(frozen=True)
class JsonShape:
    """What a document holds, counted on its bytes (each an upper bound)."""

    nbytes: int
    containers: int
    values: int
    strings: int
    text_bytes: int  # bytes inside its strings
    width: int  # bytes per character of its widest text once decoded: 1, 2 or 4
    escaped_surrogates: bool  # `\\udXXX` escapes: parsed strings must be checked

    def parsed_bytes(self, bytes_kept: bool = False) -> int:
        """Memory parsing it takes beyond its own bytes, at most: the text decoded (its
        width per byte), and what the parsed value keeps, past the bytes when the parse
        lets go of them once they are decoded (`Document`), beside them when someone else
        keeps them (`bytes_kept`: a WebSocket message, which tornado holds until handled)."""
        kept = self.kept_bytes()
        beyond = kept if bytes_kept else max(0, kept - self.nbytes)
        return self.width * self.nbytes + PARSE_BYTES + beyond

    def kept_bytes(self) -> int:
        """Memory the parsed document holds, at most: every object, and its strings' text
        (their width per byte)."""
        return (
            self.width * self.text_bytes
            + CONTAINER_BYTES * self.containers
            + VALUE_BYTES * self.values
            + STRING_BYTES * self.strings
        )

    @property
    def small(self) -> bool:
        """Small enough to parse on the event loop (well under a millisecond)."""
        return self.nbytes <= SMALL_BYTES and self.values <= SMALL_VALUES


class Document:
    """A document's bytes handed over to `parse_json`, which lets go of them as soon as they
    are decoded: the bytes, their text and the objects parsed from it are then never all
    held at once (a body of long strings peaks at twice its size, not three times)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self._data: bytes | bytearray | None = data

    def take(self) -> bytes | bytearray:
        data, self._data = self._data, None
        if data is None:
            raise RuntimeError("a document is parsed once")
        return data


def scan(data: bytes | bytearray | str, limits: JsonLimits, what: str) -> JsonShape:
    """The shape of a document, before it is parsed; PayloadTooLarge (413) when it holds
    more values (or cells) than `limits` allow, InvalidRequest (400) when its bytes already
    show it is not JSON text (an encoded surrogate, an unterminated string)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if not raw.isascii() and _ENCODED_SURROGATE.search(raw):
        raise InvalidRequest(f"{what} is not UTF-8 text: it holds an encoded surrogate.")
    if limits.cells is not None:
        # Every cell has the key `"cell_type"`, and those bytes can only be a string of
        # their own (a quote inside a string is escaped): an upper bound of the cells.
        cells = raw.count(b'"cell_type"')
        if cells > limits.cells:
            raise PayloadTooLarge(
                f"{what} holds more than {limits.cells} cells ({cells}).", field="notebook"
            )
    width = _width(raw)
    escaped_surrogates = b"\\u" in raw and _ESCAPED_SURROGATE.search(raw) is not None
    # Upper bounds from the bytes as they are: every value but a container's first follows
    # a comma, and every string is two quotes.
    containers = raw.count(b"{") + raw.count(b"[")
    values = raw.count(b",") + containers + 1
    strings = raw.count(b'"') // 2
    text_bytes = len(raw)
    if values > limits.values or containers > limits.depth:  # count again, exactly
        containers, values, strings, text_bytes, brackets = _outside_strings(raw, limits, what)
        if _deeper_than(brackets, limits.depth):
            raise InvalidRequest(_too_deep(what, limits))
    return JsonShape(len(raw), containers, values, strings, text_bytes, width, escaped_surrogates)


def _width(raw: bytes | bytearray) -> int:
    """How many bytes a character of the widest string takes once decoded (CPython's str
    is 1, 2 or 4 bytes per character, the widest character deciding for a whole string)."""
    width = 1
    if not raw.isascii():
        if _FOUR_BYTES.search(raw):
            return 4
        if _TWO_OR_THREE_BYTES.search(raw):
            width = 2
    if b"\\u" in raw:  # an escape may name any character; a surrogate pair one past U+FFFF
        width = 4 if _ESCAPED_SURROGATE.search(raw) else max(width, 2)
    return width


def _outside_strings(
    raw: bytes | bytearray, limits: JsonLimits, what: str
) -> tuple[int, int, int, int, bytes]:
    """Containers, values, strings and string bytes counted outside the strings, and the
    brackets there in their order: escaped backslashes and quotes removed first (JSON
    pairs backslashes from the left, as `replace` does), every string is then the bytes
    between two quotes."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    quotes = text.count(b'"')
    if quotes % 2:
        raise InvalidRequest(f"{what} is not valid JSON: a string is not terminated.")
    strings = quotes // 2
    if strings > 2 * limits.values + 1:  # each key comes with a value
        raise _too_many(what, limits, strings // 2)
    containers = values = outside = 0
    brackets: list[bytes] = []
    start = 0
    while start < len(text):
        end = min(start + SCAN_PIECE, len(text))
        if text.count(b'"', start, end) % 2:  # a piece ends outside every string
            end = text.index(b'"', end) + 1
        piece = _STRING.sub(b'"', text[start:end])
        containers += piece.count(b"{") + piece.count(b"[")
        # every value but the first of a container follows a comma; an empty one has none
        bare = piece.translate(None, _WHITESPACE)
        values += piece.count(b",") - bare.count(b"{}") - bare.count(b"[]")
        outside += len(piece)
        brackets.append(bare.translate(None, _NOT_BRACKETS))
        start = end
    values += containers + 1
    if values > limits.values:
        raise _too_many(what, limits, values)
    return containers, values, strings, len(raw) - outside + strings, b"".join(brackets)


def _deeper_than(brackets: bytes, depth: int) -> bool:
    """Whether a document's brackets (nothing else, in their order) nest more than `depth`
    levels. Each pass takes away the innermost pairs, one level (a pair made adjacent by
    taking one away waits for the next pass: it is a level further out), in C-speed
    passes. Brackets that do not pair up are left for the parser to report."""
    for _ in range(depth):
        if not brackets:
            return False
        inner = brackets.replace(b"{}", b".").replace(b"[]", b".")
        if len(inner) == len(brackets):
            return False  # no pair at all: not JSON, which the parse says better
        brackets = inner.replace(b".", b"")
    return brackets.find(b"{}") >= 0 or brackets.find(b"[]") >= 0


def _too_deep(what: str, limits: JsonLimits) -> str:
    return f"{what} is nested more than {limits.depth} levels deep."


def _too_many(what: str, limits: JsonLimits, values: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} holds more than {limits.values} JSON values (about {values}): send less, "
        "or split it."
    )


def too_deep(value: Any, max_depth: int) -> bool:
    """Whether `value` has objects or arrays nested more than `max_depth` levels deep
    (a scalar is depth 0, `[]` depth 1, `[[]]` depth 2). Iterative: any depth is safe."""
    return _walk(value, max_depth, check_text=False) is not None


def _walk(value: Any, max_depth: int, check_text: bool) -> str | None:
    """The first problem of a decoded document ("deep" or "surrogate"), or None."""
    if check_text and isinstance(value, str):
        return "surrogate" if _SURROGATE.search(value) else None
    if not isinstance(value, _CONTAINERS):
        return None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        if depth > max_depth:
            return "deep"
        if isinstance(container, dict):
            if check_text and any(_SURROGATE.search(key) for key in container):
                return "surrogate"
            items = container.values()
        else:
            items = container
        for item in items:
            if isinstance(item, _CONTAINERS):
                stack.append((item, depth + 1))
            elif check_text and isinstance(item, str) and _SURROGATE.search(item):
                return "surrogate"
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # `1e999`: valid JSON syntax, but no finite double
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def parse_json(
    data: bytes | bytearray | str | Document,
    limits: JsonLimits,
    what: str = "The request body",
    shape: JsonShape | None = None,
) -> Any:
    """Decode a JSON document (UTF-8) within `limits`: PayloadTooLarge (413) for one that
    holds too much, InvalidRequest (400) for anything that is not JSON text nested at most
    `limits.depth` levels deep. `shape` is the document's `scan`, when the caller made it
    (to take room for the parse first); else it is made here."""
    if isinstance(data, Document):
        raw = data.take()
        if shape is None:
            shape = scan(raw, limits, what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{what} is not UTF-8 text.") from None
        finally:
            del raw  # (the caller handed it over: now nobody holds it)
        return _parsed(text, limits, what, shape)
    if shape is None:
        shape = scan(data, limits, what)
    return _parsed(data, limits, what, shape)


def _parsed(data: bytes | bytearray | str, limits: JsonLimits, what: str, shape: JsonShape) -> Any:
    too_deep_message = _too_deep(what, limits)
    try:
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise InvalidRequest(too_deep_message) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{what} is not UTF-8 text.") from exc
    except ValueError as exc:  # JSONDecodeError, NaN, an integer of more than 4300 digits
        raise InvalidRequest(f"{what} is not valid JSON: {exc}.") from exc
    # The scan measured its depth (a document of fewer containers than the limit cannot be
    # deeper); one without a surrogate escape holds no surrogate (the scan refused their
    # bytes): only the strings of one with such escapes are walked.
    check_text = shape.escaped_surrogates
    if not check_text:
        return value
    problem = _walk(value, limits.depth, check_text=check_text)
    if problem == "deep":
        raise InvalidRequest(too_deep_message)
    if problem == "surrogate":
        raise InvalidRequest(
            f"{what} holds a string with a lone surrogate (e.g. \\ud800): it is not Unicode text."
        )
    return value


def dumps_utf8(value: Any, *, compact: bool = False) -> bytes:
    """`value` as JSON in UTF-8, non-ASCII characters as they are; if a lone surrogate makes
    that impossible, the whole document with every non-ASCII character escaped."""
    separators = (",", ":") if compact else None
    text = json.dumps(value, ensure_ascii=False, separators=separators)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=separators).encode("ascii")
