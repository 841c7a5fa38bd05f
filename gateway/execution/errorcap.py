"""Cut what a kernel reports to a byte budget as it arrives: an uncaught error (its name,
value and traceback) and any text, keeping the head and the tail.

`raise ValueError('A' * 10**8)` sends a 100 MB `evalue` and a traceback that repeats it;
kept whole they made a 200 MB run record. The error output, the record's `error` and the
error of a failed execute_reply all go through `cap_error`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.execution.textcap import truncation_marker, utf8_size

ENAME_BYTES = 1024  # an exception's class name: a class can be named anything


def clip_middle(text: str, max_bytes: int) -> str:
    """`text` if it fits in `max_bytes` of UTF-8, else its head and tail with the middle
    replaced by `[... N bytes truncated ...]` (the result is at most about `max_bytes`)."""
    if len(text) * 4 <= max_bytes:
        return text
    size = utf8_size(text)
    if size <= max_bytes:
        return text
    half = max(0, max_bytes // 2 - 40)  # room for the marker
    head = text[:half].encode("utf-8", "surrogatepass")[:half].decode("utf-8", "ignore")
    tail_bytes = text[-half:].encode("utf-8", "surrogatepass") if half else b""
    tail = tail_bytes[len(tail_bytes) - half :].decode("utf-8", "ignore") if half else ""
    dropped = size - utf8_size(head) - utf8_size(tail)
    return head + truncation_marker(dropped) + tail


@dataclasses.dataclass(frozen=True)
class CappedError:
    ename: str
    evalue: str
    traceback: list[str]
    cut: bool  # something was cut
    received_bytes: int  # the size of what the kernel sent

    def to_json(self) -> dict[str, Any]:
        return {"ename": self.ename, "evalue": self.evalue, "traceback": list(self.traceback)}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def cap_error(content: dict[str, Any], max_bytes: int) -> CappedError:
    """An error's `ename`, `evalue` and `traceback` (from an `error` message or a failed
    execute_reply), the value and the traceback each cut to `max_bytes`."""
    ename = _text(content.get("ename", ""))
    evalue = _text(content.get("evalue", ""))
    raw = content.get("traceback") or []
    lines = [_text(line) for line in raw] if isinstance(raw, list) else [_text(raw)]
    received = len(ename) + len(evalue) + sum(len(line) for line in lines)
    capped_ename = clip_middle(ename, ENAME_BYTES)
    capped_value = clip_middle(evalue, max_bytes)
    traceback = _cap_lines(lines, max_bytes)
    cut = capped_ename is not ename or capped_value is not evalue or traceback != lines
    return CappedError(capped_ename, capped_value, traceback, cut, received)


def _cap_lines(lines: list[str], max_bytes: int) -> list[str]:
    """Each line cut to a quarter of the budget; then, if they are still over it, the first
    and last lines that fit in half of it each, with a line saying how many were left out."""
    per_line = max(1024, max_bytes // 4)
    lines = [clip_middle(line, per_line) for line in lines]
    sizes = [utf8_size(line) for line in lines]
    if sum(sizes) <= max_bytes:
        return lines
    half = max_bytes // 2
    head_end, used = 0, 0
    while head_end < len(lines) and used + sizes[head_end] <= half:
        used += sizes[head_end]
        head_end += 1
    tail_start, used = len(lines), 0
    while tail_start > head_end and used + sizes[tail_start - 1] <= half:
        used += sizes[tail_start - 1]
        tail_start -= 1
    left_out = tail_start - head_end
    marker = f"[... {left_out} traceback line(s) left out to keep {max_bytes} bytes ...]"
    return [*lines[:head_end], marker, *lines[tail_start:]]
