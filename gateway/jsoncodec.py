"""JSON at the gateway's edges: what clients send is parsed within limits, what the gateway
answers is always valid UTF-8.

In: Python's `json` recurses once per level, so a document nested a few thousand levels
deep raises `RecursionError` while it is parsed, and one just under the interpreter's limit
raises it later, wherever the value is copied, validated or encoded again. `parse_json`
refuses documents deeper than `max_json_depth` (and whatever else `json.loads` raises) as a
400; values the gateway did not parse itself (a kernel's `result`) are checked with
`too_deep` before they are kept. `NaN` and `Infinity` are not JSON (RFC 8259), a number no
double can hold (`1e999`) would become infinity, and a string with a lone surrogate escape
(`"\\ud800"`) is not Unicode text: all are refused too, so
that no such value reaches a kernel, a file name or a record.

Out: a kernel can smuggle a lone surrogate into an output (its messages are JSON that any
code in the kernel can write); `dumps_utf8` then escapes it instead of failing.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.errors import InvalidRequest

_CONTAINERS = (dict, list)
_SURROGATE = re.compile("[\ud800-\udfff]")


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


def parse_json(data: bytes | str, max_depth: int, what: str = "The request body") -> Any:
    """Decode a JSON document; InvalidRequest (400) for anything that is not JSON text
    nested at most `max_depth` levels deep."""
    too_deep_message = f"{what} is nested more than {max_depth} levels deep."
    try:
        value = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise InvalidRequest(too_deep_message) from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{what} is not UTF-8 text.") from exc
    except ValueError as exc:  # JSONDecodeError, NaN, an integer of more than 4300 digits
        raise InvalidRequest(f"{what} is not valid JSON: {exc}.") from exc
    problem = _walk(value, max_depth, check_text=True)
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
