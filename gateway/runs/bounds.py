"""Keep a run record within a byte budget: `max_record_bytes` for every record the gateway
keeps and answers, and a WebSocket event's own budget for a `done` event.

Each part of a record has its own cap as it arrives (stdout, stderr and output, rich
outputs, the error, `result`, returned files), but together they can still add up, and a
notebook replay collects many cells' worth. So once a run is over, if its record is over
the budget, its largest parts are cut, largest first, until it fits:

- an output becomes a small stand-in of the same type that says how large it was (the
  `outputs` list keeps its length, so that a notebook's cells keep their outputs' places),
- a chart is left out (its image is among the outputs, or was),
- a returned file's content becomes `{path, size, error}`,
- `result` becomes null, the error keeps its name and the head of its value,
- stdout, stderr and output keep their head and tail.

Notes, which quote things the run chose (file names, exception names), are always clipped
to `NOTE_CHARS` each and `MAX_NOTES` in all. A note says when the budget cut anything.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

from gateway.execution.errorcap import clip_middle
from gateway.models.record import RunRecord

NOTE_CHARS = 1000
MAX_NOTES = 100
STUB_TEXT_BYTES = 4096  # what is kept of a cut text: its head and tail


def _size(value: Any) -> int:
    return len(json.dumps(value))


@dataclasses.dataclass
class _Part:
    size: int
    cut: Callable[[dict[str, Any]], int]  # replaces the part in the record; its new size


def _stub_output(output: dict[str, Any], size: int) -> dict[str, Any]:
    kind = output.get("output_type")
    if kind == "stream":
        text = output.get("text", "")
        text = "".join(text) if isinstance(text, list) else str(text)
        return {
            "output_type": "stream",
            "name": output.get("name", "stdout"),
            "text": clip_middle(text, STUB_TEXT_BYTES),
        }
    if kind == "error":
        return {"output_type": "error", **_small_error(output)}
    stub: dict[str, Any] = {
        "output_type": "execute_result" if kind == "execute_result" else "display_data",
        "data": {"text/plain": f"[an output of {size} bytes, left out: the record's limit]"},
        "metadata": {},
    }
    if kind == "execute_result":
        stub["execution_count"] = output.get("execution_count")
    return stub


def _small_error(error: dict[str, Any]) -> dict[str, Any]:
    return {
        "ename": clip_middle(str(error.get("ename", "")), 200),
        "evalue": clip_middle(str(error.get("evalue", "")), 1000),
        "traceback": [],
    }


def _replace_item(
    key: str, index: int, make: Callable[[], Any], copied: set[str]
) -> Callable[[dict[str, Any]], int]:
    """Replace one item of the list `record[key]`. The list is copied on its first cut only
    (`copied` is shared by the cuts of one record), so that cutting n items costs n, not
    n times the list's length."""

    def cut(record: dict[str, Any]) -> int:
        if key not in copied:
            record[key] = list(record[key])
            copied.add(key)
        items = record[key]
        items[index] = make()
        return _size(items[index])

    return cut


def _replace(key: str, make: Callable[[], Any]) -> Callable[[dict[str, Any]], int]:
    def cut(record: dict[str, Any]) -> int:
        record[key] = make()
        return _size(record[key])

    return cut


def _cut_text(name: str) -> Callable[[dict[str, Any]], int]:
    def cut(record: dict[str, Any]) -> int:
        record[name] = clip_middle(record[name], STUB_TEXT_BYTES)
        record[f"{name}_truncated"] = True
        return _size(record[name])

    return cut


def _file_stub(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "path": item.get("path", ""),
        "size": item.get("size"),
        "error": "not returned: the run record was over its size limit",
    }


def _parts(data: dict[str, Any]) -> list[_Part]:
    """Every part of a record's JSON that can be cut, with its size and how to cut it."""
    parts: list[_Part] = []
    copied: set[str] = set()  # the lists already copied by a cut
    for index, output in enumerate(data.get("outputs") or []):
        size = _size(output)
        stub = functools.partial(_stub_output, output, size)
        parts.append(_Part(size, _replace_item("outputs", index, stub, copied)))
    for index, chart in enumerate(data.get("charts") or []):
        parts.append(_Part(_size(chart), _replace_item("charts", index, lambda: None, copied)))
    for index, item in enumerate(data.get("files") or []):
        stub = functools.partial(_file_stub, item)
        parts.append(_Part(_size(item), _replace_item("files", index, stub, copied)))
    if data.get("result") is not None:
        parts.append(_Part(_size(data["result"]), _replace("result", lambda: None)))
    error = data.get("error")
    if error:
        parts.append(_Part(_size(error), _replace("error", functools.partial(_small_error, error))))
    for name in ("stdout", "stderr", "output"):
        text = data.get(name)
        if isinstance(text, str) and text:
            parts.append(_Part(_size(text), _cut_text(name)))
    return parts


def clip_notes(notes: list[str]) -> list[str]:
    clipped = [clip_middle(str(note), NOTE_CHARS) for note in notes]
    if len(clipped) <= MAX_NOTES:
        return clipped
    head, tail = MAX_NOTES // 2, MAX_NOTES // 2 - 1
    left_out = len(clipped) - head - tail
    return [*clipped[:head], f"[... {left_out} notes left out ...]", *clipped[-tail:]]


def bound_json(data: dict[str, Any], max_bytes: int, note: str) -> dict[str, Any]:
    """A copy of a record's JSON (`to_json` or `to_storage`) of at most `max_bytes` when
    its cuttable parts allow it, cutting the largest first; `note` is added when anything
    was cut. `data` itself is not changed."""
    bounded = dict(data)
    bounded["notes"] = clip_notes(list(data.get("notes") or []))
    total = _size(bounded)
    if total <= max_bytes:
        return bounded
    for part in sorted(_parts(bounded), key=lambda p: p.size, reverse=True):
        if total <= max_bytes:
            break
        total -= part.size - part.cut(bounded)
    bounded["charts"] = [chart for chart in bounded.get("charts") or [] if chart is not None]
    bounded["notes"] = [*bounded["notes"], note]
    return bounded


def bound_record(record: RunRecord, max_bytes: int) -> None:
    """Cut the record in place to at most `max_bytes` (as stored) when it is over."""
    data = record.to_storage()
    bounded = bound_json(
        data,
        max_bytes,
        f"The run record was over its limit of {max_bytes} bytes: its largest parts were "
        "cut (each says so where it was).",
    )
    for name in RunRecord.model_fields:
        if name in bounded and name != "usage" and bounded[name] is not data[name]:
            setattr(record, name, bounded[name])
