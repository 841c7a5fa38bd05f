"""Collect a kernel's iopub messages into nbformat outputs, applying caps as they arrive.

The run record's `stdout`, `stderr`, `output` and `outputs`, the WebSocket's `output`
events and the `.ipynb` export all come from here (DESIGN.md decision 5). However much a
run prints, memory stays within the caps: head and tail are kept, the middle is marked.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from nbformat.v4 import output_from_msg

from gateway.execution.textcap import HeadTailText, truncation_marker

# (output as nbformat dict, display_id or None, True when it replaces an earlier output)
OutputListener = Callable[[dict[str, Any], str | None, bool], None]
# (display_id, data, metadata): a display's new content, for outputs of earlier cells
DisplayUpdate = Callable[[str, dict[str, Any], dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Caps:
    stream_bytes: int
    display_bytes: int  # rich output this cell may still add
    limit_bytes: int  # output (all bytes the kernel sends) past which the cell is killed
    display_total: int | None = None  # the run's whole rich-output budget, for notes


@dataclasses.dataclass
class _Entry:
    output: dict[str, Any]
    display_id: str | None = None


def _stream_size(entry: _Entry) -> int:
    if entry.output["output_type"] != "stream":
        return 0
    return len(entry.output["text"].encode("utf-8", "surrogatepass"))


class OutputCollector:
    """Feed it iopub messages of one execution (`add`); read the capped results after."""

    def __init__(
        self,
        caps: Caps,
        listener: OutputListener | None = None,
        on_display: DisplayUpdate | None = None,
    ) -> None:
        self.caps = caps
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
        self._head: list[_Entry] = []
        self._head_bytes = 0
        self._tail: collections.deque[_Entry] = collections.deque()
        self._tail_bytes = 0
        self._dropped_stream = 0
        self._display_bytes = 0
        self._dropped_displays = 0
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
        elif kind in ("display_data", "execute_result", "error"):
            self._flush_clear()
            output = output_from_msg(msg)
            display_id = (content.get("transient") or {}).get("display_id")
            if kind == "error":
                self.error = {
                    "ename": content.get("ename", ""),
                    "evalue": content.get("evalue", ""),
                    "traceback": list(content.get("traceback", [])),
                }
            if kind == "display_data" and display_id:
                self._show_everywhere(display_id, content)  # earlier ones show it too
            self._add_rich(_Entry(dict(output), display_id))
        elif kind == "update_display_data":
            self._update_display(content)
        elif kind == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()

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
        self._place_stream(name, text, size)

    def _place_stream(self, name: str, text: str, size: int) -> None:
        head_cap = self.caps.stream_bytes // 2
        if not self._tail and self._head_bytes + size <= head_cap:
            self._append(self._head, name, text)
            self._head_bytes += size
            return
        if not self._tail and self._head_bytes < head_cap:
            room = head_cap - self._head_bytes
            head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
            self._append(self._head, name, head)
            self._head_bytes = head_cap
            text = text[len(head) :]
            size = len(text.encode("utf-8", "surrogatepass"))
        self._append(self._tail, name, text)
        self._tail_bytes += size
        self._trim_tail()

    @staticmethod
    def _append(entries: list[_Entry] | collections.deque[_Entry], name: str, text: str) -> None:
        if entries and entries[-1].output["output_type"] == "stream":
            last = entries[-1].output
            if last["name"] == name:
                last["text"] += text
                return
        entries.append(_Entry({"output_type": "stream", "name": name, "text": text}))

    def _trim_tail(self) -> None:
        tail_cap = self.caps.stream_bytes - self.caps.stream_bytes // 2
        while self._tail_bytes > tail_cap and self._tail:
            first = self._tail[0]
            size = _stream_size(first)
            excess = self._tail_bytes - tail_cap
            if size == 0:
                self._tail.popleft()
                self._dropped_displays += 1
            elif size <= excess:
                self._tail.popleft()
                self._tail_bytes -= size
                self._dropped_stream += size
            else:
                data = first.output["text"].encode("utf-8", "surrogatepass")[excess:]
                first.output["text"] = data.decode("utf-8", "ignore")
                removed = size - _stream_size(first)
                self._tail_bytes -= removed
                self._dropped_stream += removed

    def _add_rich(self, entry: _Entry) -> None:
        size = len(json.dumps(entry.output))
        if self._display_bytes + size > self.caps.display_bytes:
            self._dropped_displays += 1
            return
        self._display_bytes += size
        (self._tail if self._tail else self._head).append(entry)
        self._notify(entry.output, entry.display_id, False)

    def _update_display(self, content: dict[str, Any]) -> None:
        display_id = (content.get("transient") or {}).get("display_id")
        if not display_id:
            return
        self._show_everywhere(display_id, content)

    def _show_everywhere(self, display_id: str, content: dict[str, Any]) -> None:
        """Give every earlier output with this display id the new content, in this cell and
        (through `on_display`) in earlier ones, as Jupyter does for `update_display_data`
        and for a `display_data` that reuses an id."""
        data, metadata = content.get("data", {}), content.get("metadata", {})
        for entry in [*self._head, *self._tail]:
            if entry.display_id == display_id:
                entry.output["data"] = data
                entry.output["metadata"] = metadata
                self._notify(entry.output, display_id, True)
        if self.on_display is not None:
            self.on_display(display_id, data, metadata)

    def _flush_clear(self) -> None:
        if self._clear_pending:
            self._clear_pending = False
            self._clear()

    def _clear(self) -> None:
        self._head.clear()
        self._tail.clear()
        self._head_bytes = self._tail_bytes = self._dropped_stream = 0
        self._notify({"output_type": "clear_output"}, None, True)

    # --- results ----------------------------------------------------------------------

    def outputs(self) -> list[dict[str, Any]]:
        """The nbformat outputs, in order, with the cut middle marked."""
        result = [e.output for e in self._head]
        if self._dropped_stream:
            marker = truncation_marker(self._dropped_stream)
            result.append({"output_type": "stream", "name": "stderr", "text": marker})
        result.extend(e.output for e in self._tail)
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
        return [(e.output, e.display_id) for e in [*self._head, *self._tail] if e.display_id]

    def final_notes(self) -> list[str]:
        notes = list(self.notes)
        if self.output.truncated:
            notes.append(
                f"Output was {self.output.total} bytes; the middle was cut to keep "
                f"{self.caps.stream_bytes} bytes."
            )
        if self._dropped_displays:
            notes.append(
                f"{self._dropped_displays} rich output(s) were not returned: the limit of "
                f"{self.caps.display_total or self.caps.display_bytes} bytes of rich output "
                "was reached."
            )
        return notes
