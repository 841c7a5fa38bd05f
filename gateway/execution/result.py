"""`RunResult`: a run's results, built up as it runs, and the one place that writes them into
its record.

As the cells finish (`add`), it keeps the record's texts (each cell's stream text is capped
as it arrives; the record keeps the head and the tail of all of them), the cells' outputs
less rich ones past the program's budget, the charts, the first failure and the notes, and
says how much of the program's budgets is left (`caps`). Once the last cell ended, the
executor gives it what the sandbox reported (`close`: `result`, returned files, usage, the
limits that struck, how the kernel died). `write` then fills in the record and finishes it
with the verdict `judge` reaches: nothing else writes a run's results or its final status.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gateway.execution.charts import charts_from_outputs, is_saved_chart
from gateway.execution.collector import Caps
from gateway.execution.config import ExecutionConfig
from gateway.execution.errorcap import cap_error
from gateway.execution.program import Program
from gateway.execution.session import CellRun, Ending
from gateway.execution.textcap import HeadTailText
from gateway.models.common import KillReason
from gateway.models.ipynb import store_notebook
from gateway.models.languages import traits
from gateway.models.record import RunRecord, Usage, Verdict
from gateway.sandbox.base import Death, FilesRead, LimitEvent

_RICH = ("display_data", "execute_result", "error")
STREAMS = ("stdout", "stderr", "output")


def exit_code_of(reply: dict[str, Any] | None) -> int | None:
    """The exit code a finished cell's execute_reply stands for. The reply is the kernel's
    word (hostile input): an exit code that is not a whole number of 32 bits is 1."""
    if reply is None:
        return None
    if "exit_code" in reply:  # our bash kernel reports `$?`
        return _whole(reply["exit_code"])
    if reply.get("status") == "ok":
        return 0
    if reply.get("ename") == "SystemExit":
        value = str(reply.get("evalue", "")).strip()
        if value in ("", "None"):
            return 0
        return _whole(value)
    return 1


def _whole(value: Any) -> int:
    """An int or a decimal string within 32 bits, else 1 (a failure of unknown code)."""
    if not isinstance(value, int | str) or (isinstance(value, str) and len(value) > 12):
        return 1
    try:
        number = int(value)
    except ValueError:
        return 1
    return number if -(2**31) <= number < 2**31 else 1


def error_of(cell: CellRun, max_bytes: int) -> dict[str, Any] | None:
    """A cell's uncaught error: its `error` output (already cut), else that of a failed
    execute_reply, cut to `max_bytes` like an error output."""
    if cell.collector is not None and cell.collector.error is not None:
        return cell.collector.error
    if cell.reply is not None and cell.reply.get("status") == "error":
        return cap_error(cell.reply, max_bytes).to_json()
    return None


class _Text:
    """One of the record's texts: a single cell's as it was capped, or the head and tail of
    several cells' together."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[tuple[str, bool]] = []

    def add(self, text: str, truncated: bool) -> None:
        self.parts.append((text, truncated))

    def value(self) -> tuple[str, bool]:
        if len(self.parts) == 1:
            return self.parts[0]
        whole = HeadTailText(self.cap)
        for text, _ in self.parts:
            whole.add(text)
        return whole.text(), whole.truncated or any(cut for _, cut in self.parts)


@dataclasses.dataclass
class Closing:
    """What the sandbox reported once the last cell ended."""

    result: Any = None
    result_note: str | None = None
    files: FilesRead | None = None
    usage: Usage = dataclasses.field(default_factory=Usage)
    events: frozenset[LimitEvent] = frozenset()
    death: Death | None = None


class RunResult:
    """A program's results so far; see the module docstring."""

    def __init__(self, config: ExecutionConfig, program: Program) -> None:
        self.config = config
        self.program = program
        self.texts = {name: _Text(config.stream_cap_bytes) for name in STREAMS}
        self.received = 0
        self.display = 0
        self.notes: list[str] = []
        self.charts: list[dict[str, Any]] = []  # the record's, in order, savefig ones too
        self.failed = False
        self.displays: dict[str, list[dict[str, Any]]] = {}  # kept outputs by display id
        self.error: dict[str, Any] | None = None
        self.exit_code: int | None = 0
        self.last = CellRun(source="")  # the cell whose ending decides the status
        self.closing = Closing()
        self.stopped_by: KillReason | None = None  # a limit of the gateway's that stopped it

    # --- as the cells finish ------------------------------------------------------------

    def caps(self) -> Caps:
        """The next cell's caps: output past what is left of the program's limit kills it."""
        config = self.config
        return config.caps(
            limit_bytes=max(0, config.output_limit_bytes - self.received),
            display_bytes=max(0, config.display_cap_bytes - self.display),
        )

    def _named(self, name: str, note: str) -> str:
        return f"{name}: {note}" if self.program.cell_names else note

    def add(self, name: str, cell: CellRun) -> list[dict[str, Any]]:
        """Count a finished cell in (it is now the last); returns the outputs it keeps."""
        self.last = cell
        collector = cell.collector
        if collector is None:
            return []
        for stream in STREAMS:
            text = getattr(collector, stream)
            self.texts[stream].add(text.text(), text.truncated)
        self.received += collector.received_bytes
        self.notes.extend(self._named(name, note) for note in collector.final_notes())
        kept: list[dict[str, Any]] = []
        specs = collector.chart_specs()
        for output in collector.outputs():
            if output["output_type"] in _RICH:
                self.display += len(json.dumps(output))
                self.charts.extend(charts_from_outputs([output], specs))
                if is_saved_chart(output) and not self.program.keep_saved_charts:
                    # Jupyter shows nothing for a savefig call: the chart is the record's
                    continue
            kept.append(output)
        kept_ids = {id(output) for output in kept}
        for output, display_id in collector.displays():
            if id(output) in kept_ids:
                self.displays.setdefault(display_id, []).append(output)
        return kept

    def stop(self, ending: Ending) -> None:
        """The program stopped before a cell ran (cancelled, out of time): that decides."""
        self.last = CellRun(source="", ending=ending)

    def update_display(self, display_id: str, data: dict[str, Any], metadata: Any) -> None:
        """A later cell updated a display: earlier cells' outputs with its id show it too."""
        for output in self.displays.get(display_id, []):
            output["data"], output["metadata"] = data, metadata

    def fail(self, cell: CellRun, exit_code: int | None) -> None:
        """Remember the first failing cell: its error and exit code stand for the program."""
        if not self.failed:
            self.failed = True
            self.error = error_of(cell, self.config.error_cap_bytes)
            self.exit_code = exit_code

    def note_stop(self, name: str, cell: CellRun, by_cell_timeout: bool, more: bool) -> None:
        program = self.program
        after = " The cells after it did not run." if more else ""
        if cell.ending == "timeout" and program.cell_names:
            if by_cell_timeout:
                why = f"{name} ran longer than cell_timeout ({program.cell_timeout:g} s)"
            else:
                why = (
                    f"The notebook ran longer than its timeout ({program.timeout:g} s) "
                    f"during {name}"
                )
            self.notes.append(f"{why} and was stopped.{after}")
        elif more:
            self.notes.append(f"The run ended during {name}.{after}")

    # --- once the last cell ended -------------------------------------------------------

    def verdict(self) -> Verdict:
        last = self.last
        exit_code = (
            self.exit_code
            if last.ending == "finished"
            else last.exit_code
            if last.ending == "exited"
            else None
        )
        closing = self.closing
        return judge(
            last,
            exit_code,
            self.error,
            closing.events,
            closing.death,
            traits(self.program.language).exit_is_program_exit,
            self.stopped_by,
        )

    def write(self, record: RunRecord) -> None:
        """Fill in the record's results and finish it (the one writer of both)."""
        closing = self.closing
        store_notebook(record, self.program.notebook)
        for stream in STREAMS:
            text, truncated = self.texts[stream].value()
            setattr(record, stream, text)
            setattr(record, f"{stream}_truncated", truncated)
        record.charts = self.charts
        record.error = self.error
        record.notes.extend(self.notes)
        record.result = closing.result
        record.result_note = closing.result_note
        if closing.result_note:
            record.notes.append(closing.result_note)
        if closing.files is not None:
            record.files = closing.files.files
            record.notes.extend(closing.files.notes)
        record.usage = closing.usage  # `finish` adds the wall time
        record.finish(self.verdict())


def judge(
    cell: CellRun,
    exit_code: int | None,
    error: dict[str, Any] | None,
    events: frozenset[str],
    death: Death | None,
    exit_is_program_exit: bool = False,
    stopped_by: KillReason | None = None,
) -> Verdict:
    """How a run ended: from how its last cell ended, the program's exit code, the limits
    that struck and how the kernel died. A cell that "exited" (the program ended its
    kernel, with its exit code) is judged as a finished one. For a language whose kernel
    ending is the program ending (`exit_is_program_exit`: Deno, where `Deno.exit(n)` ends
    the process), a kernel that "died" with an exit status did so on purpose: that status
    is the run's exit code, not a crash."""
    # When both struck, a process storm is the likelier cause of the memory pressure.
    limit: KillReason | None = (
        "pids" if "pids" in events else "memory" if "memory" in events else None
    )
    if stopped_by == "cpu_quota":  # whatever its cell did after: the budget ended it
        note = "The run was stopped: its user's CPU-seconds budget ran out (GET /v1/usage)."
        return Verdict("killed", kill_reason="cpu_quota", notes=(note,))
    if cell.ending == "cancelled":
        return Verdict("cancelled", kill_reason="cancelled")
    if cell.ending == "output_limit":
        note = "The run was killed: it produced more output than the limit."
        return Verdict("killed", kill_reason="output_limit", notes=(note,))
    if cell.ending == "died":
        if (death is not None and death.oom_killed) or limit == "memory":
            note = "The run was killed: it used more memory than its limit."
            return Verdict("killed", kill_reason="memory", notes=(note,))
        if (
            exit_is_program_exit
            and death is not None
            and death.exit_code is not None
            and death.exit_code >= 0
        ):
            if death.exit_code == 0:
                return Verdict("succeeded", exit_code=0)
            return Verdict("failed", exit_code=death.exit_code)
        code = None if death is None else death.exit_code
        if code is not None and code < 0:
            code = 128 - code
        note = f"The kernel died unexpectedly (exit status {code})."
        return Verdict("failed", exit_code=code, notes=(note,))
    if cell.ending == "timeout":
        if limit is not None:
            note = f"The {limit} limit was reached before the timeout."
            return Verdict("killed", kill_reason=limit, timed_out=True, notes=(note,))
        return Verdict("timed_out", kill_reason="timeout", timed_out=True)
    if exit_code == 0:
        notes = () if limit is None else (f"The {limit} limit was reached during the run.",)
        exited = error is not None and error.get("ename") == "SystemExit"
        return Verdict("succeeded", exit_code=0, notes=notes, keep_error=not exited)
    if limit is not None:
        return Verdict("killed", kill_reason=limit, notes=(f"The {limit} limit was reached.",))
    return Verdict("failed", exit_code=exit_code)
