"""Collect a kernel's iopub messages into nbformat outputs, applying caps as they arrive.

The run record's `stdout`, `stderr`, `output` and `outputs`, the WebSocket's `output`
events and the `.ipynb` export all come from here (DESIGN.md decision 5). However much a
run prints, memory stays within the caps: head and tail are kept, the middle is marked.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from nbformat import ValidationError
from nbformat.v4 import output_from_msg

from gateway.execution.charts import slimmed
from gateway.execution.errorcap import cap_error
from gateway.execution.textcap import (
    HeadTail,
    HeadTailText,
    truncation_marker,
    utf8_drop_front,
    utf8_head,
    utf8_size,
)
from gateway.jsoncodec import too_deep

# (output as nbformat dict, display_id or None, True when it replaces an earlier output)
OutputListener = Callable[[dict[str, Any], str | None, bool], None]
# (display_id, data, metadata): a display's new content, for outputs of earlier cells
DisplayUpdate = Callable[[str, dict[str, Any], dict[str, Any]], None]

MAX_DISPLAY_ID_CHARS = 256  # a longer display id is treated as none (it cannot be updated)


@dataclasses.dataclass(frozen=True)
class Caps:
    stream_bytes: int
    display_bytes: int  # rich output this cell may still add
    limit_bytes: int  # output (all bytes the kernel sends) past which the cell is killed
    error_bytes: int = 256 * 1024  # an error's value, and its traceback, each
    max_depth: int = 64  # deepest nesting of an output's JSON that is kept
    display_total: int | None = None  # the run's whole rich-output budget, for notes


@dataclasses.dataclass
class _Entry:
    output: dict[str, Any]
    display_id: str | None = None
    size: int = 0  # of the output as JSON, for the display cap
    payload: int | None = None  # of its {"data", "metadata"} as JSON, once it was updated
    spec: Any = None  # the chart's data its metadata carried (`charts.slimmed`)


class _KeptOutputs(HeadTail[_Entry]):
    """A cell's kept outputs: the head and tail of its stream text, within the stream cap;
    a rich output stays where it arrived and is lost when the cut middle reaches it."""

    def size(self, piece: _Entry) -> int:
        output = piece.output
        return utf8_size(output["text"]) if output["output_type"] == "stream" else 0

    def take(self, piece: _Entry, nbytes: int) -> tuple[_Entry, _Entry]:
        output = piece.output
        head = utf8_head(output["text"], nbytes)
        rest = {**output, "text": output["text"][len(head) :]}
        return _Entry({**output, "text": head}), _Entry(rest)

    def drop_front(self, piece: _Entry, nbytes: int) -> _Entry:
        piece.output["text"] = utf8_drop_front(piece.output["text"], nbytes)
        return piece

    def join(self, last: _Entry, piece: _Entry) -> bool:
        """Consecutive text of one stream is one output."""
        before, output = last.output, piece.output
        if before["output_type"] != "stream" or output["output_type"] != "stream":
            return False
        if before["name"] != output["name"]:
            return False
        before["text"] += output["text"]
        return True


class OutputCollector:
    """Feed it iopub messages of one execution (`add`); read the capped results after."""

    def __init__(
        self,
        caps: Caps,
        listener: OutputListener | None = None,
        on_display: DisplayUpdate | None = None,
        *,
        hold_error: bool = False,
    ) -> None:
        self.caps = caps
        # the uncaught error is kept back until `release_error` (after the cell's streams)
        self.hold_error = hold_error
        self._held_error: dict[str, Any] | None = None
        self.listener = listener
        self.on_display = on_display
        self.stdout = HeadTailText(caps.stream_bytes)
        self.stderr = HeadTailText(caps.stream_bytes)
        self.output = HeadTailText(caps.stream_bytes)
        self.error: dict[str, Any] | None = None
        self.notes: list[str] = []
        # everything the kernel sent during this cell, set by the session from the raw
        # messages (any channel, any parent): what the output limit is checked against
        self.received_bytes = 0
        self._kept = _KeptOutputs(caps.stream_bytes)
        self._display_bytes = 0
        self._dropped_displays = 0
        self._dropped_updates = 0
        self._not_kept_deep = 0
        self._clear_pending = False

    @property
    def limit_exceeded(self) -> bool:
        return self.received_bytes > self.caps.limit_bytes

    # --- feeding ----------------------------------------------------------------------

    def add(self, msg: dict[str, Any]) -> None:
        kind = msg["header"]["msg_type"]
        content = msg["content"]
        if kind == "stream":
            self._flush_clear()
            self._add_stream(content.get("name", "stdout"), content.get("text", ""))
        elif kind == "error":
            self._flush_clear()
            if self.hold_error:
                self._held_error = content
            else:
                self._add_error(content)
        elif kind in ("display_data", "execute_result"):
            self._flush_clear()
            try:
                output = output_from_msg(msg)
            except ValidationError:  # `{"image/png": 12345}`: nothing an .ipynb may hold
                self._note_invalid()
                return
            display_id = _display_id(content)
            if kind == "display_data" and display_id:
                self._update_display(content)  # earlier outputs with its id show it too
            self._add_rich(_Entry(dict(output), display_id))
        elif kind == "update_display_data":
            self._update_display(content)
        elif kind == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()

    def _note_invalid(self) -> None:
        note = "An output the kernel sent is not a valid nbformat output: it was left out."
        if note not in self.notes:
            self.notes.append(note)

    def release_error(self) -> None:
        """Add the uncaught error kept back by `hold_error`, after what came before it."""
        held, self._held_error = self._held_error, None
        if held is not None:
            self._add_error(held)

    def _add_error(self, content: dict[str, Any]) -> None:
        """An uncaught error, cut to the error cap as it arrives (value and traceback)."""
        capped = cap_error(content, self.caps.error_bytes)
        self.error = capped.to_json()
        if capped.cut:
            self.notes.append(
                f"The error's value or traceback was longer than {self.caps.error_bytes} "
                "bytes: the middle was cut."
            )
        output = {"output_type": "error", **capped.to_json()}
        self._keep_rich(_Entry(output), json_size(output) or 0)

    def _notify(self, output: dict[str, Any], display_id: str | None, update: bool) -> None:
        if self.listener is not None:
            self.listener(output, display_id, update)

    def _add_stream(self, name: str, text: str) -> None:
        if name not in ("stdout", "stderr") or not text:
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        (self.stdout if name == "stdout" else self.stderr).add(text)
        self.output.add(text)
        if self.output.total <= self.caps.stream_bytes:  # live events stop at the cap
            self._notify({"output_type": "stream", "name": name, "text": text}, None, False)
        self._kept.add(_Entry({"output_type": "stream", "name": name, "text": text}), size)

    def _add_rich(self, entry: _Entry) -> None:
        size = json_size(entry.output, self.caps.max_depth)  # the chart's data counted too
        if size is None:
            self._not_kept_deep += 1
            return
        entry.output["metadata"], entry.spec = slimmed(entry.output.get("metadata"))
        self._keep_rich(entry, size)

    def _keep_rich(self, entry: _Entry, size: int) -> None:
        if self._display_bytes + size > self.caps.display_bytes:
            self._dropped_displays += 1
            return
        self._display_bytes += size
        entry.size = size
        self._kept.add(entry, 0)
        self._notify(entry.output, entry.display_id, False)

    def _update_display(self, content: dict[str, Any]) -> None:
        display_id = _display_id(content)
        if not display_id:
            return
        update = {"data": content.get("data", {}), "metadata": content.get("metadata", {})}
        size = json_size(update, self.caps.max_depth)
        if size is None:
            self._not_kept_deep += 1
            return
        update["metadata"], spec = slimmed(update["metadata"])
        for entry in self._kept.pieces():
            if entry.display_id != display_id:
                continue
            if entry.payload is None:
                output = entry.output
                current = {"data": output.get("data"), "metadata": output.get("metadata")}
                entry.payload = json_size(current) or 0
            new = entry.size - entry.payload + size  # the same output, its payload replaced
            if self._display_bytes - entry.size + new > self.caps.display_bytes:
                self._dropped_updates += 1
                continue
            self._display_bytes += new - entry.size
            entry.output = {**entry.output, **update}
            entry.size, entry.payload, entry.spec = new, size, spec
            self._notify(entry.output, display_id, True)
        if self.on_display is not None:  # earlier cells' outputs, as Jupyter does
            self.on_display(display_id, update["data"], update["metadata"])

    def _flush_clear(self) -> None:
        if self._clear_pending:
            self._clear_pending = False
            self._clear()

    def _clear(self) -> None:
        self._dropped_displays += self._kept.lost
        self._kept = _KeptOutputs(self.caps.stream_bytes)
        self._notify({"output_type": "clear_output"}, None, True)

    # --- results ----------------------------------------------------------------------

    def chart_specs(self) -> dict[int, Any]:
        """The chart data each kept output carried, by the output's `id()` (the outputs
        themselves keep only its title: `charts.slimmed`)."""
        return {id(e.output): e.spec for e in self._kept.pieces() if e.spec is not None}

    def outputs(self) -> list[dict[str, Any]]:
        """The nbformat outputs, in order, with the cut middle marked."""
        result = [e.output for e in self._kept.head]
        if self._kept.dropped:
            marker = truncation_marker(self._kept.dropped)
            result.append({"output_type": "stream", "name": "stderr", "text": marker})
        result.extend(e.output for e in self._kept.tail)
        merged: list[dict[str, Any]] = []
        for output in result:
            if (
                merged
                and output["output_type"] == "stream"
                and merged[-1]["output_type"] == "stream"
                and merged[-1]["name"] == output["name"]
            ):
                merged[-1] = {**merged[-1], "text": merged[-1]["text"] + output["text"]}
            else:
                merged.append(output)
        return merged

    def displays(self) -> list[tuple[dict[str, Any], str]]:
        """The kept outputs that carry a display id (the same objects `outputs()` holds)."""
        return [(e.output, e.display_id) for e in self._kept.pieces() if e.display_id]

    def final_notes(self) -> list[str]:
        notes = list(self.notes)
        if self.output.truncated:
            notes.append(
                f"Output was {self.output.total} bytes; the middle was cut to keep "
                f"{self.caps.stream_bytes} bytes."
            )
        total = self.caps.display_total or self.caps.display_bytes
        dropped_displays = self._dropped_displays + self._kept.lost
        if dropped_displays:
            notes.append(
                f"{dropped_displays} rich output(s) were not returned: the limit of "
                f"{total} bytes of rich output was reached."
            )
        if self._dropped_updates:
            notes.append(
                f"{self._dropped_updates} display update(s) were not applied: the limit of "
                f"{total} bytes of rich output was reached."
            )
        if self._not_kept_deep:
            notes.append(
                f"{self._not_kept_deep} output(s) were not returned: their JSON is nested more "
                f"than {self.caps.max_depth} levels deep."
            )
        return notes


def _display_id(content: dict[str, Any]) -> str | None:
    display_id = (content.get("transient") or {}).get("display_id")
    if not isinstance(display_id, str) or len(display_id) > MAX_DISPLAY_ID_CHARS:
        return None
    return display_id


def json_size(value: Any, max_depth: int | None = None) -> int | None:
    """The size of `value` as JSON; None when it is nested more than `max_depth` deep
    (or too deep for the encoder), so that it is not kept."""
    if max_depth is not None and too_deep(value, max_depth):
        return None
    try:
        return len(json.dumps(value))
    except (RecursionError, TypeError, ValueError):
        return None
