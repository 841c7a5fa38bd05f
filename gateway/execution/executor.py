"""The one executor: run a `Program` in one fresh kernel and fill in its `RunRecord`.

sandbox -> stage files (the archive first, then `files`) -> kernel ready -> the run's
environment and `vars` -> each cell until one stops the program -> `result` -> (with
`return_files`: freeze, or kill, then read back) -> usage, limits, death; then
`outcome.apply` writes the record, and off the answer's path: kill -> destroy. These last
steps are the same for every backend (`gateway.sandbox.base`); a backend that cannot
freeze is killed before the read back instead.

ipykernel evaluates `result` as a user expression of the last cell's own request when that
cell succeeds (one kernel round trip fewer per run); after a failed or interrupted last cell
it is read with a silent request of its own, as Deno's is always.

The gateway enforces the deadline, not the kernel (DESIGN.md decision 4): at a cell's
deadline the kernel is interrupted, gets `interrupt_grace` seconds to flush, then every
process of the sandbox is killed; what was produced before is kept with `timed_out`.
A cell may run for `min(cell_timeout, what is left of timeout)`. The first cell that fails
stops the program unless `allow_errors` is set or the cell is tagged `raises-exception`
(as in nbclient); a timeout, a cancel, a limit or the kernel's death always stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from gateway.execution.collector import OutputListener, json_size
from gateway.execution.errorcap import clip_middle
from gateway.execution.kernel_code import python_result, result_code, setup_code
from gateway.execution.outcome import Outcome, Tally, apply_outcome, exit_code_of
from gateway.execution.pool import Pools
from gateway.execution.program import EXPECTED_ERROR_TAG, Program, tags
from gateway.execution.session import Cell, KernelSession, StartCancelled, limits_from
from gateway.models.common import now_rfc3339
from gateway.models.languages import traits
from gateway.models.record import RunRecord
from gateway.models.request import StagedFile
from gateway.sandbox.base import ReadLimits, SandboxSpec
from gateway.settings import Settings

SETUP_TIMEOUT = 10.0  # seconds for the gateway's own silent requests
RESULT_EXPRESSION = "gateway_result"  # the name of `result` among a request's user expressions

# The files to stage and notes about them, awaited once the run holds a slot (an archive
# is unpacked only then).
FilesToStage = Callable[[], Awaitable[tuple[Sequence[StagedFile], Sequence[str]]]]


@contextlib.asynccontextmanager
async def running(record: RunRecord, notes: Sequence[str]) -> AsyncIterator[None]:
    """The record is `running` inside the block; its wall time and finish time are set on
    the way out, however the block ends."""
    record.status = "running"
    record.started_at = now_rfc3339()
    record.notes.extend(notes)
    started = time.monotonic()
    try:
        yield
    finally:
        record.usage.wall_ms = int((time.monotonic() - started) * 1000)
        record.finished_at = now_rfc3339()


class Execution:
    """One run of a `Program`, filling in its `RunRecord`."""

    def __init__(
        self,
        program: Program,
        record: RunRecord,
        kernels: Pools,
        settings: Settings,
        files: FilesToStage,
        teardown: Callable[[Awaitable[None]], None],
        listener: OutputListener | None = None,
        cancel: asyncio.Event | None = None,
    ) -> None:
        self.program = program
        self.record = record
        self.kernels = kernels
        self.settings = settings
        self.teardown = teardown  # destroys the sandbox after the record is answered
        self.files = files  # awaited inside the run: the archive is unpacked only then
        self.listener = listener
        self.cancel = cancel if cancel is not None else asyncio.Event()
        self.tally = Tally(settings, program)
        self._cpu_before: int | None = None  # the sandbox's CPU when the run's code began

    async def run(self) -> RunRecord:
        program, record = self.program, self.record
        spec = SandboxSpec(
            run_id=record.id,
            language=program.language,
            limits=limits_from(self.settings, program.memory_bytes),
            network=program.network,
            workspace=program.workspace,
        )
        async with running(record, program.notes):
            files, notes = await self.files()
            self.tally.notes.extend(notes)
            try:
                session = await self.kernels.acquire(spec, self.cancel)
            except StartCancelled:
                outcome = Outcome(last=Cell(source="", ending="cancelled"))
            else:
                try:
                    # nothing past the run's output limit is even read from the kernel
                    session.client.meter.limit_from_now(self.settings.output_limit_bytes)
                    await session.sandbox.stage_files(files)
                    # the run's CPU counts from here: not the kernel's start, nor (a pooled
                    # kernel) its preloads, so that pooled and cold runs report alike
                    self._cpu_before = (await session.sandbox.usage()).cpu_ms
                    last = await self._run_cells(session)
                    outcome = await self._close(session, last)
                finally:
                    # off the answer's path: the record is final without it
                    self.teardown(end(session))
            apply_outcome(record, program, self.tally, outcome)
        return record

    async def _run_cells(self, session: KernelSession) -> Cell:
        """Run the cells in order; the cell whose ending decides the record's status."""
        program, tally = self.program, self.tally
        if self.cancel.is_set():
            return Cell(source="", ending="cancelled")
        setup = setup_code(
            program.language, program.env, program.vars, session.fence_token, program.network
        )
        if setup is not None:
            reply = await session.run_silent(setup, timeout=SETUP_TIMEOUT)
            if reply is None or reply.get("status") != "ok":
                tally.notes.append("`vars` or `env` could not be set in the kernel.")
        cells = program.notebook["cells"]
        runnable = program.runnable()
        deadline = time.monotonic() + program.timeout
        last = Cell(source="")
        for count, index in enumerate(runnable, start=1):
            cell_json = cells[index]
            name = f"Cell {index + 1} (In [{count}])"
            left = deadline - time.monotonic()
            if self.cancel.is_set():
                return Cell(source="", ending="cancelled")
            if left <= 0:
                tally.notes.append(
                    f"The notebook ran out of its timeout ({program.timeout:g} s) before "
                    f"cell {index + 1}; it and the cells after it did not run."
                )
                return Cell(source="", ending="timeout")
            limit = min(program.cell_timeout, left)
            more = count < len(runnable)
            last = await session.run_cell(
                cell_json["source"],
                limit,
                self.listener,
                caps=tally.caps(),
                on_display=tally.update_display,
                user_expressions=None if more else self._result_expressions(),
            )
            outputs = tally.add(name, last)
            for output in outputs:
                if output["output_type"] == "execute_result":
                    output["execution_count"] = count
            cell_json["outputs"], cell_json["execution_count"] = outputs, count
            if last.ending != "finished":
                tally.note_stop(name, last, limit, more)
                return last
            exit_code = exit_code_of(last.reply)
            if exit_code != 0 and EXPECTED_ERROR_TAG not in tags(cell_json):
                tally.fail(last, exit_code)
                if not program.allow_errors:
                    if more:
                        tally.notes.append(
                            f"{name} failed, so the cells after it did not run "
                            "(allow_errors is false)."
                        )
                    return last
        return last

    def _result_expressions(self) -> dict[str, str] | None:
        """What the last cell's request asks ipykernel to evaluate after it: `result`."""
        if self.program.reads_result and self._ipykernel:
            return result_expressions(self.settings)
        return None

    @property
    def _ipykernel(self) -> bool:
        return traits(self.program.language).kernel == "ipykernel"

    async def _close(self, session: KernelSession, last: Cell) -> Outcome:
        """After the last cell: read `result` back; stop the sandbox and read
        `return_files` back; take usage and the limits that struck, and learn how the
        kernel died (if it did). The kill and the destruction follow (`end`)."""
        outcome = Outcome(last=last)
        if last.ending == "finished" and self.program.reads_result:
            outcome.result, outcome.result_note, failure = await read_result(
                session,
                self.settings,
                self._ipykernel,
                last.reply,
                result_code(self.program.language, self.settings.result_cap_bytes),
            )
            if failure:
                self.tally.notes.append(failure)
        sandbox, settings = session.sandbox, self.settings
        if self.program.return_files:
            limits = ReadLimits(
                max_files=settings.max_return_files,
                max_file_bytes=settings.max_return_file_bytes,
                max_total_bytes=settings.max_return_files_bytes,
            )
            # nothing may change the working folder while it is read: frozen where the
            # sandbox can be (its kill follows off the answer's path), else killed now
            if not await sandbox.freeze():
                await sandbox.kill()
            outcome.files = await sandbox.read_files(self.program.return_files, limits)
        outcome.usage = await sandbox.usage()  # before the sandbox goes, its cgroup with it
        if outcome.usage.cpu_ms is not None and self._cpu_before is not None:
            outcome.usage.cpu_ms = max(0, outcome.usage.cpu_ms - self._cpu_before)
        outcome.events = await sandbox.limit_events()
        outcome.death = await sandbox.death() if last.ending == "died" else None
        if session.client.over_limit and last.ending == "finished":
            last.ending = "output_limit"  # reading `result` back went past the limit
        return outcome


async def end(session: KernelSession) -> None:
    """A run's last two steps, the same on every backend: every process of the sandbox
    ends, then everything it made goes (and the kernel client is closed)."""
    try:
        await session.sandbox.kill()
    finally:
        await session.close()


async def read_result(
    session: KernelSession,
    settings: Settings,
    user_expressions: bool,
    last_reply: dict[str, Any] | None = None,
    code: str = "",
) -> tuple[Any, str | None, str | None]:
    """The kernel's global `result` (else `output`); why the code's value was not returned
    (not JSON-serialisable, larger than `result_cap_bytes` as JSON, nested deeper than
    `max_json_depth`), or why nothing could be read back at all.

    ipykernel evaluates it as a user expression: of the last cell's request when that cell
    succeeded (`last_reply` carries it), else of a silent request made now. Deno's and
    IRkernel's have no user expressions, so there it is the `execute_result` of `code`
    (`kernel_code.result_code`) in a request without history, which no cell sees."""
    data: dict[str, Any] | None
    if user_expressions:
        evaluated = evaluated_result(last_reply)
        if evaluated is None:
            reply = await session.run_silent(
                "", timeout=SETUP_TIMEOUT, user_expressions=result_expressions(settings)
            )
            evaluated = evaluated_result(reply)
        if evaluated is not None and evaluated.get("status") == "error":
            why = clip_middle(f"{evaluated.get('ename')}: {evaluated.get('evalue')}", 300)
            return None, None, f"`result` could not be read back from the kernel ({why})."
        if evaluated is None:
            data = None
        else:
            found = evaluated.get("data")
            data = found if isinstance(found, dict) else {}
    else:
        data = await session.display_value(code, timeout=SETUP_TIMEOUT)
    if data is None:
        return None, None, "`result` could not be read back from the kernel."
    value = data.get("application/json")
    if not isinstance(value, dict) or not value.get("present"):
        return None, None, None
    name = clip_middle(str(value.get("name")), 100)
    if "error" in value:
        reason = clip_middle(str(value["error"]), 500)
        return None, f"`{name}` was not returned: it is not JSON-serialisable ({reason}).", None
    large = "`{}` was not returned: it is {} bytes as JSON, over the limit of {} bytes."
    if "size" in value:  # the kernel's own measure: it sent no value (ipykernel)
        size_text = clip_middle(str(value["size"]), 40)
        return None, large.format(name, size_text, settings.result_cap_bytes), None
    result = value.get("value")
    size = json_size(result, settings.max_json_depth)
    if size is None:
        deep = f"it is nested more than {settings.max_json_depth} levels deep"
        return None, f"`{name}` was not returned: {deep}.", None
    if size > settings.result_cap_bytes:  # a kernel that sent more than it was asked for
        return None, large.format(name, size, settings.result_cap_bytes), None
    return result, None, None


def result_expressions(settings: Settings) -> dict[str, str]:
    """The user expressions that have ipykernel evaluate `result` (within its cap)."""
    return {RESULT_EXPRESSION: python_result(settings.result_cap_bytes)}


def evaluated_result(reply: Any) -> dict[str, Any] | None:
    """The `result` user expression as ipykernel evaluated it (`{"status", "data"}`, or
    `{"status": "error", "ename", "evalue"}`) from an execute_reply's content; None when
    the reply has none (no reply, a failed request: ipykernel then evaluates no user
    expressions). A kernel's reply is hostile input: any other shape reads as no value."""
    if not isinstance(reply, dict) or reply.get("status") != "ok":
        return None
    expressions = reply.get("user_expressions")
    if not isinstance(expressions, dict) or RESULT_EXPRESSION not in expressions:
        return None
    evaluated = expressions[RESULT_EXPRESSION]
    return evaluated if isinstance(evaluated, dict) else {}
