"""The one executor: run a `Program` in one fresh kernel and finish its `RunRecord`.

Who calls what, in order (the run service, once the run holds a slot and its record is
`running`):

    execution = Execution(program, record, config, cancel, events)
    async with pools.kernel(execution.spec, cancel) as session:
                                 the run's kernel, pooled or cold, owned by this block: when
                                 it ends, however, its sandbox is killed and destroyed (off
                                 the answer's path; `Pools.kernel`)
        await execution.run(session, files)
                                 stage files -> the run's environment and `vars` -> each
                                 cell until one stops the program (its own CPU read around
                                 it: `execution.meter`) -> `result` -> (with
                                 `return_files`: freeze, or kill, then read back) -> usage,
                                 limits, death; then the result builder writes and
                                 finishes the record
    execution.cancelled_before_start()
                                 instead, when `cancel` came before the kernel was ready
                                 (`StartCancelled` from `pools.kernel`)

The gateway enforces the deadline, not the kernel (DESIGN.md decision 4): the program's
`Deadline` says until when each cell may run; at that instant the kernel is interrupted,
gets `interrupt_grace` seconds to flush, then every process of the sandbox is killed; what
was produced before is kept with `timed_out`. The first cell that fails stops the program
unless `allow_errors` is set or the cell is tagged `raises-exception` (as in nbclient); a
timeout, a cancel, a limit or the kernel's death always stop it.

What the run does is published on `events` as it happens (a cell starts, its outputs, it
finishes), for those who watch it; nothing of the layers above is called from here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from gateway.errors import GatewayError
from gateway.execution.config import ExecutionConfig
from gateway.execution.deadline import Deadline
from gateway.execution.events import CellFinished, CellOutput, CellStarted, CellStatus, RunEvents
from gateway.execution.kernel_code import result_code, setup_code
from gateway.execution.meter import UsageMeter, cell_cpu, unused
from gateway.execution.program import EXPECTED_ERROR_TAG, Program, tags
from gateway.execution.result import RunResult, exit_code_of
from gateway.execution.session import CellRun, KernelSession, StartCancelled
from gateway.execution.value import SETUP_TIMEOUT, read_result, result_expressions
from gateway.models.common import KillReason
from gateway.models.languages import traits
from gateway.models.record import RunRecord, Usage
from gateway.models.request import StagedFile
from gateway.sandbox.base import SandboxSpec

T = TypeVar("T")


@dataclasses.dataclass(eq=False, repr=False)  # its program is user code
class Execution:
    """One run of a `Program`; see the module docstring. `cancel` is the run's own signal
    (set by the service on a cancel; read here, never set)."""

    program: Program
    record: RunRecord
    config: ExecutionConfig
    cancel: asyncio.Event
    events: RunEvents = dataclasses.field(default_factory=RunEvents)
    # `keep: "cells"`: after each cell that lets the program go on, the kernel's state is
    # kept and the next cell runs in a continuation of it, which this returns (the layer
    # above keeps and owns them: `gateway.runs.service`); the same session: nothing kept
    advance: Callable[[KernelSession, int], Awaitable[KernelSession]] | None = None
    result: RunResult = dataclasses.field(init=False)
    session: KernelSession | None = dataclasses.field(default=None, init=False)  # the last
    # the run's CPU and peak memory, over every kernel it runs in, and each cell's CPU
    meter: UsageMeter = dataclasses.field(default_factory=UsageMeter, init=False)
    _index: int = dataclasses.field(default=0, init=False)  # the cell being run, for its events

    def __post_init__(self) -> None:
        self.result = RunResult(self.config, self.program)
        forget_measures(self.program.notebook["cells"])

    @property
    def spec(self) -> SandboxSpec:
        """The sandbox the program asks for."""
        program = self.program
        return SandboxSpec(
            run_id=self.record.id,
            language=program.language,
            limits=self.config.limits(program.memory_bytes),
            network=program.network,
            workspace=program.workspace,
        )

    async def run(self, session: KernelSession, files: Sequence[StagedFile]) -> RunRecord:
        """Run the program in `session`'s kernel and finish the record (see the module
        docstring). Raises the GatewayError that stopped it before any code ran (files could
        not be staged); the service then fails the record."""
        # nothing past the run's output limit is even read from the kernel
        session.client.meter.limit_from_now(self.config.output_limit_bytes)
        try:
            await session.sandbox.stage_files(files)
        except GatewayError:
            # no code ran, but the sandbox did: the record the service fails says what it held
            self.record.usage = unused(await session.sandbox.usage())
            raise
        # the run's CPU counts from here: not the kernel's start, nor (a pooled kernel) its
        # preloads, so that pooled and cold runs report alike
        await self.meter.begin(session.sandbox)
        self.session = session
        session = await self._run_cells(session)
        await self._close(session)
        self.result.write(self.record)
        return self.record

    def cancelled_before_start(self) -> RunRecord:
        """Finish the record of a run cancelled while its kernel was starting."""
        self.result.stop("cancelled")
        self.result.write(self.record)
        return self.record

    async def _run_cells(self, session: KernelSession) -> KernelSession:
        """Run the cells in order until one stops the program; the session of the last."""
        program, result = self.program, self.result
        if self.cancel.is_set():
            result.stop("cancelled")
            return session
        setup = setup_code(
            program.language, program.env, program.vars, session.fence_token, program.network
        )
        if setup is not None:
            self.meter.stale()  # the run's CPU, not its first cell's
            reply = await session.run_silent(setup, timeout=SETUP_TIMEOUT)
            if reply is None or reply.get("status") != "ok":
                result.notes.append("`vars` or `env` could not be set in the kernel.")
        cells = program.notebook["cells"]
        runnable = program.runnable()
        deadline = Deadline(program.timeout, program.cell_timeout)
        if program.prelude:
            self.meter.stale()
            if not await self._replay(session, deadline):
                return session
        for count, index in enumerate(runnable, start=1):
            cell_json = cells[index]
            name = f"In [{count}]"  # as Jupyter numbers a cell: its execution count
            if self.cancel.is_set():
                result.stop("cancelled")
                return session
            if deadline.passed:
                result.notes.append(
                    f"The notebook ran out of its timeout ({program.timeout:g} s) before "
                    f"In [{count}]; it and the cells after it did not run."
                )
                result.stop("timeout")
                return session
            cell_time = deadline.next_cell()
            more = count < len(runnable)
            self._index = index
            cell_id = cell_json.get("id")
            self.events.publish(CellStarted(index=index, cell_id=cell_id))
            before = await self.meter.cpu_now()
            cell = await session.run_cell(
                cell_json["source"],
                cell_time.until,
                self.cancel,
                self._output,
                caps=result.caps(),
                on_display=result.update_display,
                user_expressions=None if more else self._result_expressions(),
            )
            usage = await self.meter.read(session.sandbox)  # before anything else runs
            cpu_ms = cell_cpu(before, usage.cpu_ms)
            cell_json.setdefault("metadata", {})["gateway"] = {
                "cpu_ms": cpu_ms,
                "duration_ms": cell.duration_ms,
            }
            outputs = result.add(name, cell)
            for output in outputs:
                if output["output_type"] == "execute_result":
                    output["execution_count"] = count
            cell_json["outputs"], cell_json["execution_count"] = outputs, count
            exit_code = exit_code_of(cell.reply) if cell.ending == "finished" else None
            self.events.publish(
                CellFinished(
                    index=index,
                    cell_id=cell_id,
                    execution_count=count,
                    status=_status(cell, exit_code),
                    duration_ms=cell.duration_ms,
                    cpu_ms=cpu_ms,
                )
            )
            if cell.ending != "finished":
                result.note_stop(name, cell, cell_time.by_cell, more)
                return session
            if exit_code != 0 and EXPECTED_ERROR_TAG not in tags(cell_json):
                result.fail(cell, exit_code)
                if not program.allow_errors:
                    if more:
                        result.notes.append(
                            f"{name} failed, so the cells after it did not run "
                            "(allow_errors is false)."
                        )
                    return session
            if more and self.advance is not None:
                successor = await self._advance(session, index, name, usage)
                if successor is None:
                    return session  # given away, and nothing continues from it
                session = successor
        return session

    async def _advance(
        self, session: KernelSession, index: int, name: str, usage: Usage
    ) -> KernelSession | None:
        """The session the cell after `index` runs in (`advance`); the run's usage and
        output limit carry over to it. `usage` is the kernel's own, read after the cell,
        before its state is kept. None when no kernel could continue from the state kept
        (the program stops there, its results so far kept)."""
        assert self.advance is not None
        try:
            successor = await self.advance(session, index)
        except (StartCancelled, GatewayError) as exc:
            self.meter.leave(usage)
            if isinstance(exc, StartCancelled):
                self.result.stop("cancelled")
                return None
            self.result.notes.append(
                f"The cells after {name} did not run: no kernel could continue from its "
                f"state ({exc.message})."
            )
            self.result.stop("died")
            return None
        if successor is session:
            return session
        self.meter.leave(usage)
        meter = session.client.meter
        if meter.ceiling is not None:
            successor.client.meter.limit_from_now(max(0, meter.ceiling - meter.total))
        await self.meter.begin(successor.sandbox)
        self.session = successor
        return successor

    async def _replay(self, session: KernelSession, deadline: Deadline) -> bool:
        """Run a rebuilt continuation's chain silently, within the program's timeout; False
        if it stopped the program (a cancel, or the time ran out)."""
        prelude, result = self.program.prelude, self.result
        for piece in prelude:
            left = deadline.left()
            reply = (
                None
                if left <= 0
                else await self._heeding_cancel(session.run_silent(piece, timeout=left))
            )
            if self.cancel.is_set():
                result.stop("cancelled")
                return False
            if reply is None:
                result.notes.append(
                    f"Replaying the snapshot's chain ({len(prelude)} cells) did not finish "
                    f"within the timeout ({self.program.timeout:g} s); the run's own code did "
                    "not run."
                )
                result.stop("timeout")
                return False
        return True

    async def _heeding_cancel(self, request: Awaitable[T]) -> T | None:
        """A request of the gateway's own to the kernel (a rebuilt chain's code, reading
        `result` back), given up (None) when the program is cancelled or stopped first: the
        kernel may still be busy with it, and goes with its sandbox at the end."""
        reply = asyncio.ensure_future(request)
        cancelled = asyncio.ensure_future(self.cancel.wait())
        try:
            await asyncio.wait([reply, cancelled], return_when=asyncio.FIRST_COMPLETED)
            return reply.result() if reply.done() else None
        finally:
            for task in (reply, cancelled):
                if not task.done():
                    task.cancel()
            await asyncio.gather(reply, cancelled, return_exceptions=True)

    def stop(self, reason: KillReason) -> None:
        """End the program as one of the gateway's limits does (`cpu_quota`): the cell in
        progress is interrupted as by a cancel, the results so far kept (a program already
        cancelled stays cancelled). What takes no cancel (a rebuilt chain's code, the
        setup, reading `result` back) is ended by `kill`."""
        if self.cancel.is_set():
            return
        self.result.stopped_by = reason
        self.cancel.set()

    async def kill(self) -> None:
        """Kill the sandbox of the kernel the program runs in (a `stop` it did not heed)."""
        session = self.session
        if session is not None and not session.released:
            await session.sandbox.kill()

    async def cpu_spent(self) -> int | None:
        """The CPU milliseconds the program has spent so far (as `usage.cpu_ms` counts
        them), or None before its code was sent or where the sandbox cannot tell."""
        session = self.session
        if session is None or session.released:
            return None
        return await self.meter.spent()

    @property
    def last_cell(self) -> int:
        """The position, in the notebook's cells, of the last cell that started."""
        return self._index

    def _output(self, output: dict[str, Any], display_id: str | None, replaces: bool) -> None:
        self.events.publish(CellOutput(self._index, output, display_id, replaces))

    def _result_expressions(self) -> dict[str, str] | None:
        """What the last cell's request asks ipykernel to evaluate after it: `result`."""
        if self.program.reads_result and self._ipykernel:
            return result_expressions(self.config)
        return None

    @property
    def _ipykernel(self) -> bool:
        return traits(self.program.language).kernel == "ipykernel"

    async def _close(self, session: KernelSession) -> None:
        """After the last cell: read `result` back; stop the sandbox and read
        `return_files` back; take usage and the limits that struck, and learn how the
        kernel died (if it did). The kill and the destruction follow (`end`)."""
        result, closing = self.result, self.result.closing
        last = result.last
        if session.released:  # kept, and no kernel continued from it: its sandbox is not ours
            closing.usage = self.meter.total(None)
            return
        if last.ending == "finished" and self.program.reads_result:
            read = await self._heeding_cancel(
                read_result(
                    session,
                    self.config,
                    self._ipykernel,
                    last.reply,
                    result_code(self.program.language, self.config.result_cap_bytes),
                )
            )
            if read is None:
                result.notes.append("`result` was not read back: the run was stopped.")
            else:
                closing.result, closing.result_note, failure = read
                if failure:
                    result.notes.append(failure)
        sandbox = session.sandbox
        if self.program.return_files:
            limits = self.config.read_limits()
            # nothing may change the working folder while it is read: frozen where the
            # sandbox can be (its kill follows off the answer's path), else killed now
            if not await sandbox.freeze():
                await sandbox.kill()
            closing.files = await sandbox.read_files(self.program.return_files, limits)
        # before the sandbox goes, its cgroup with it
        closing.usage = self.meter.total(await sandbox.usage())
        closing.events = await sandbox.limit_events()
        closing.death = await sandbox.death() if last.ending == "died" else None
        if session.client.over_limit and last.ending == "finished":
            last.ending = "output_limit"  # reading `result` back went past the limit


def forget_measures(cells: list[dict[str, Any]]) -> None:
    """A code cell's `metadata.gateway` is the gateway's: what it measured of the cell in
    this run. One the notebook brought (a replay of a replay's notebook) goes, so that a
    cell that does not run this time shows no figures of another run."""
    for cell in cells:
        metadata = cell.get("metadata")
        if cell.get("cell_type") == "code" and isinstance(metadata, dict):
            metadata.pop("gateway", None)


def _status(cell: CellRun, exit_code: int | None) -> CellStatus:
    if cell.ending != "finished":
        return cell.ending
    return "ok" if exit_code == 0 else "error"
