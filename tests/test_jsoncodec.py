"""What a body becomes (issue 29): `jsoncodec.scan` counts a document's values before it is
parsed, refuses one over its limits before a single object exists, and its
`parsed_bytes()` bounds the memory the parse takes, measured with tracemalloc on the
shapes that cost most per byte and on any document hypothesis makes."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.jsoncodec import SCAN_PIECE, Document, JsonLimits, parse_json, scan, too_deep

pytestmark = pytest.mark.fast

WIDE = JsonLimits(depth=64, values=10**9)


def values_in(value: Any) -> int:
    """Every value of a decoded document (an object's keys come with their values)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def peak_of_parse(data: bytes, limits: JsonLimits = WIDE) -> tuple[int, int]:
    """What parsing `data` took at its peak (tracemalloc), its own bytes included, handed
    over as a handler hands a body; and what its scan promised: those bytes, plus what
    parsing them takes beyond them."""
    shape = scan(data, limits, "x")
    tracemalloc.start()
    try:
        value = parse_json(Document(bytearray(data)), limits, "x", shape)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert value == json.loads(data)
    return peak, len(data) + shape.parsed_bytes()


def array(item: str, n: int = 100_000) -> bytes:
    return ("[" + ",".join([item] * n) + "]").encode()


# the shapes that cost most per byte once parsed: tiny containers, short strings, numbers
# outside the small-int cache, keys (hash tables grown by doubling), text that decodes wide
WORST = {
    "empty objects": array("{}"),
    "empty arrays": array("[]"),
    "nested arrays": array("[[[]]]"),
    "short strings": array('"ab"'),
    "distinct strings": ("[" + ",".join(f'"{i}"' for i in range(100_000)) + "]").encode(),
    "floats": array("1.5"),
    "large ints": array("123456789012"),
    "literals": array("true"),
    "one-key objects": array('{"a":1}'),
    "six-key objects": array('{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6}'),
    "many keys": ("{" + ",".join(f'"k{i}":1' for i in range(100_000)) + "}").encode(),
    "keys and strings": ("{" + ",".join(f'"k{i}":"v"' for i in range(70_000)) + "}").encode(),
    "ascii made wide by one emoji": ('"' + "a" * 2_000_000 + '\U0001f600"').encode(),
    "ascii made wide by an escape": ('"' + "a" * 2_000_000 + '\\ud83d\\ude00"').encode(),
    "escapes": ('"' + "\\n" * 1_000_000 + '"').encode(),
    "wide short strings": array('"a\U0001f600"'),
}


@pytest.mark.parametrize("name", list(WORST))
def test_what_a_parse_takes_is_within_what_its_scan_promised(name: str) -> None:
    peak, promised = peak_of_parse(WORST[name])
    assert peak <= promised, f"{name}: the parse took {peak} bytes, the scan said {promised}"


@pytest.mark.parametrize("name", ["empty objects", "short strings", "escapes", "many keys"])
def test_the_exact_count_outside_strings_keeps_the_promise(name: str) -> None:
    """A limit under the quick upper bound makes the scan count outside the strings."""
    data = WORST[name]
    quick = scan(data, WIDE, "x")
    exact_limits = JsonLimits(depth=64, values=quick.values - 1)
    try:
        exact = scan(data, exact_limits, "x")
    except PayloadTooLarge:
        return  # as many values as the upper bound said: nothing to compare
    assert values_in(json.loads(data)) <= exact.values < quick.values
    peak, promised = peak_of_parse(data, exact_limits)
    assert peak <= promised


def test_a_document_over_its_values_is_refused_before_anything_is_parsed() -> None:
    """47 MiB of `{}` was 2.4 GiB of dicts: now a 413 having made none of them."""
    data = b'{"code": "1", "x": [' + b",".join([b"{}"] * 1_000_000) + b"]}"
    limits = JsonLimits(depth=64, values=100_000)
    gc.collect()
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match="more than 100000 JSON values"):
            parse_json(data, limits, "The request body")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(data), peak  # the scan's copies of the bytes, no objects


def test_values_hidden_in_strings_are_not_counted() -> None:
    """Commas, brackets and escaped quotes inside strings are text, not values: a file of a
    million commas passes a limit of a thousand values (counted exactly past the quick
    bound), and its parse is what json.loads makes."""
    content = '[{},\\"x\\\\",' * 200_000
    data = json.dumps({"files": [{"path": "a.csv", "content": content}]}).encode()
    limits = JsonLimits(depth=64, values=1000)
    shape = scan(data, limits, "x")
    assert shape.values < 20 and shape.strings == 5
    assert parse_json(data, limits, "x", shape) == json.loads(data)


def test_a_piece_boundary_inside_a_string_does_not_split_it() -> None:
    text = "x" * (SCAN_PIECE - 3) + "{,[,{" * 100
    data = json.dumps([text, {"a": [1, 2]}, text]).encode()
    shape = scan(data, JsonLimits(depth=64, values=7), "x")  # under the quick bound (3000+)
    assert shape.values == 7 and shape.containers == 3 and shape.strings == 3


def test_a_notebook_of_too_many_cells_is_refused_on_its_bytes() -> None:
    cell = '{"cell_type": "markdown", "metadata": {}, "source": ""}'
    data = (
        '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": ['
        + ",".join([cell] * 1001)
        + "]}"
    ).encode()
    limits = JsonLimits(depth=64, values=10**6, cells=1000)
    with pytest.raises(PayloadTooLarge, match="more than 1000 cells"):
        scan(data, limits, "The request body")
    assert scan(data, JsonLimits(depth=64, values=10**6, cells=1001), "x").values > 4000


@pytest.mark.parametrize(
    "data",
    [
        b'"\xed\xa0\x80"',  # a surrogate's UTF-8 bytes
        b'["\\ud800"]',  # a lone surrogate escape
        b'{"\\udfff": 1}',
        b'"abc',  # unterminated
    ],
)
def test_text_that_is_not_unicode_is_a_400(data: bytes) -> None:
    with pytest.raises(InvalidRequest):
        parse_json(data, WIDE, "x")


def test_a_surrogate_pair_is_text() -> None:
    assert parse_json(b'["\\ud83d\\ude00"]', WIDE, "x") == ["\U0001f600"]


def test_depth_is_checked_when_containers_could_be_that_deep() -> None:
    deep = b"[" * 65 + b"]" * 65
    with pytest.raises(InvalidRequest, match="nested more than 64"):
        parse_json(deep, WIDE, "x")
    assert parse_json(b"[" * 64 + b"]" * 64, WIDE, "x") is not None


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(alphabet='ab"\\{[,:\U0001f600', max_size=4), children, max_size=6)
    ),
    max_leaves=60,
)


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(value=JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_any_document_parses_as_json_loads_within_what_its_scan_counted(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    exact_needed = values_in(value)
    for limits in (WIDE, JsonLimits(depth=64, values=exact_needed)):
        shape = scan(data, limits, "x")  # the exact count never refuses what fits
        assert shape.values >= exact_needed
        peak, promised = peak_of_parse(data, limits)  # the same value as json.loads's
        assert peak <= promised


NESTED = st.recursive(
    st.integers(0, 9) | st.just("s[{"),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from("ab"), children, max_size=2)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(value=NESTED, depth=st.integers(1, 8))
def test_the_scan_refuses_exactly_what_is_nested_too_deep(value: Any, depth: int) -> None:
    """Depth is measured on the bytes (brackets outside strings, a level a pass), before
    anything is parsed: exactly the documents the walk of the parsed value finds too deep."""
    data = json.dumps(value).encode()
    limits = JsonLimits(depth=depth, values=10**6)
    if too_deep(value, depth):
        with pytest.raises(InvalidRequest, match=f"nested more than {depth} levels"):
            scan(data, limits, "x")
    else:
        scan(data, limits, "x")
