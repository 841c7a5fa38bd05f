"""Replay a notebook: its code cells, in order, in one fresh kernel, filling one run record.

Like `runner.Execution`, but for many cells in one sandbox (DESIGN.md decision 1): state
flows between the cells of the notebook and nowhere else. Each cell may run for
`min(cell_timeout, what is left of timeout)`. The first cell that fails stops the replay
unless `allow_errors` is set or the cell is tagged `raises-exception` (as in nbclient); a
timeout, a cancel, a limit or the kernel's death always stop it. Cells after the stop keep
no outputs and no execution count; empty cells and cells tagged `skip-execution` are not run.

Caps: each cell's stream text is capped as a single run's is; rich output (display_data,
execute_result; errors are always kept) and the output limit are budgets of the whole
notebook; the record's `stdout`, `stderr` and `output` keep the head and the tail of the
whole notebook's text. Notes name a cell by its position in the notebook and its
execution count ("Cell 3 (In [2])": the third cell, of any type).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any

import zmq.asyncio

from gateway.execution.charts import charts_from_outputs
from gateway.execution.collector import Caps
from gateway.execution.runner import (
    close_sandbox,
    error_of,
    exit_code_of,
    read_result,
    running,
    settle_status,
)
from gateway.execution.session import Cell, KernelSession, limits_from, open_session
from gateway.execution.textcap import HeadTailText
from gateway.runs.models import RunRecord
from gateway.runs.notebook import store_notebook
from gateway.runs.notebook_request import NotebookRequest, cell_source, is_code
from gateway.sandbox.base import SandboxBackend, SandboxSpec
from gateway.settings import Settings

EXPECTED_ERROR_TAG = "raises-exception"
SKIP_TAG = "skip-execution"
_RICH = ("display_data", "execute_result", "error")


class _Tally:
    """What the cells have produced so far: the record's texts, the first failure, and how
    much of the notebook's output budgets is left."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.texts = {
            name: HeadTailText(settings.stream_cap_bytes) for name in ("stdout", "stderr", "output")
        }
        self.cut = {name: False for name in self.texts}
        self.received = 0
        self.display = 0
        self.display_cap = settings.display_cap_bytes
        self.notes: list[str] = []
        self.failed = False
        self.error: dict[str, Any] | None = None
        self.exit_code: int | None = 0

    def caps(self) -> Caps:
        """The next cell's caps: output past what is left of the notebook's limit kills it."""
        settings = self.settings
        return Caps.from_settings(
            settings, limit_bytes=max(0, settings.output_limit_bytes - self.received)
        )

    def add(self, name: str, cell: Cell) -> list[dict[str, Any]]:
        """Count a cell's output in; returns its outputs, less rich ones past the budget."""
        collector = cell.collector
        if collector is None:
            return []
        for stream, text in (
            ("stdout", collector.stdout),
            ("stderr", collector.stderr),
            ("output", collector.output),
        ):
            self.texts[stream].add(text.text())
            self.cut[stream] = self.cut[stream] or text.truncated
        self.received += collector.received_bytes
        self.notes.extend(f"{name}: {note}" for note in collector.final_notes())
        kept, dropped = [], 0
        for output in collector.outputs():
            if output["output_type"] in _RICH:
                size = len(json.dumps(output))
                if output["output_type"] != "error" and self.display + size > self.display_cap:
                    dropped += 1
                    continue
                self.display += size
            kept.append(output)
        if dropped:
            self.notes.append(
                f"{name}: {dropped} rich output(s) were not returned: the notebook's rich "
                f"output reached its limit of {self.display_cap} bytes."
            )
        return kept

    def fail(self, cell: Cell, exit_code: int | None) -> None:
        """Remember the first failing cell: its error and exit code stand for the notebook."""
        if not self.failed:
            self.failed = True
            self.error = error_of(cell, self.settings.error_cap_bytes)
            self.exit_code = exit_code


class NotebookExecution:
    """One replay of a `NotebookRequest`, filling in its `RunRecord` (and its notebook)."""

    def __init__(
        self,
        request: NotebookRequest,
        record: RunRecord,
        backend: SandboxBackend,
        settings: Settings,
        context: zmq.asyncio.Context,
    ) -> None:
        self.request = request
        self.record = record
        self.backend = backend
        self.settings = settings
        self.context = context
        self.cancel = asyncio.Event()
        self.kernel_start_seconds: float | None = None
        self.notebook: dict[str, Any] = copy.deepcopy(request.notebook)
        self.tally = _Tally(settings)

    async def run(self) -> RunRecord:
        record, request = self.record, self.request
        spec = SandboxSpec(
            run_id=record.id, language=request.language, limits=limits_from(self.settings)
        )
        async with (
            running(record, request.notes),
            open_session(
                self.backend, spec, request.files, self.settings, self.context, self.cancel
            ) as session,
        ):
            self.kernel_start_seconds = session.start_seconds
            last = await self._run_cells(session)
            await self._finish(session, last)
        return record

    async def _run_cells(self, session: KernelSession) -> Cell:
        """Run the code cells in order; the cell whose ending decides the record's status."""
        request, tally = self.request, self.tally
        cells = self.notebook["cells"]
        runnable = [i for i, c in enumerate(cells) if _runnable(c)]
        deadline = time.monotonic() + request.timeout
        last = Cell(source="")
        for count, index in enumerate(runnable, start=1):
            position, cell_json = index + 1, cells[index]
            name = f"Cell {position} (In [{count}])"
            left = deadline - time.monotonic()
            if self.cancel.is_set():
                return Cell(source="", ending="cancelled")
            if left <= 0:
                tally.notes.append(
                    f"The notebook ran out of its timeout ({request.timeout:g} s) before "
                    f"cell {position}; it and the cells after it did not run."
                )
                return Cell(source="", ending="timeout")
            limit = min(request.cell_timeout, left)
            last = await session.run_cell(cell_source(cell_json), limit, caps=tally.caps())
            outputs = tally.add(name, last)
            for output in outputs:
                if output["output_type"] == "execute_result":
                    output["execution_count"] = count
            cell_json["outputs"], cell_json["execution_count"] = outputs, count
            more = count < len(runnable)
            if last.ending != "finished":
                self._note_stop(name, last, limit, more)
                return last
            exit_code = exit_code_of(last.reply)
            if exit_code != 0 and EXPECTED_ERROR_TAG not in _tags(cell_json):
                tally.fail(last, exit_code)
                if not request.allow_errors:
                    if more:
                        tally.notes.append(
                            f"{name} failed, so the cells after it did not run "
                            "(allow_errors is false)."
                        )
                    return last
        return last

    def _note_stop(self, name: str, cell: Cell, limit: float, more: bool) -> None:
        request = self.request
        after = " The cells after it did not run." if more else ""
        if cell.ending == "timeout":
            if limit >= request.cell_timeout:
                why = f"{name} ran longer than cell_timeout ({request.cell_timeout:g} s)"
            else:
                why = (
                    f"The notebook ran longer than its timeout ({request.timeout:g} s) "
                    f"during {name}"
                )
            self.tally.notes.append(f"{why} and was stopped.{after}")
        elif more:
            self.tally.notes.append(f"The run ended during {name}.{after}")

    async def _finish(self, session: KernelSession, last: Cell) -> None:
        record, request, tally = self.record, self.request, self.tally
        if last.ending == "finished" and request.language == "python":
            await read_result(session, record, self.settings)
        events, death = await close_sandbox(
            session.sandbox, self.settings, record, request.return_files, last.ending == "died"
        )
        store_notebook(record, self.notebook)
        record.stdout, record.stdout_truncated = self._text("stdout")
        record.stderr, record.stderr_truncated = self._text("stderr")
        record.output, record.output_truncated = self._text("output")
        record.charts = charts_from_outputs(record.outputs)
        record.error = tally.error
        record.notes.extend(tally.notes)
        record.exit_code = tally.exit_code if last.ending == "finished" else None
        settle_status(record, last, events, death)

    def _text(self, name: str) -> tuple[str, bool]:
        text = self.tally.texts[name]
        return text.text(), text.truncated or self.tally.cut[name]


def _tags(cell: dict[str, Any]) -> list[Any]:
    tags = (cell.get("metadata") or {}).get("tags") or []
    return tags if isinstance(tags, list) else []


def _runnable(cell: dict[str, Any]) -> bool:
    return is_code(cell) and bool(cell_source(cell).strip()) and SKIP_TAG not in _tags(cell)
