"""Execute one run: sandbox -> stage files -> kernel -> execute -> collect -> deadline ->
return files -> destroy, and turn how it went into the run record.

The gateway enforces the deadline, not the kernel (DESIGN.md decision 4): at the deadline
the kernel is interrupted, gets `interrupt_grace` seconds to flush, then every process of
the sandbox is killed. What was produced before is returned with `timed_out: true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import zmq.asyncio

from gateway.execution.charts import charts_from_outputs
from gateway.execution.collector import Caps, OutputListener, json_size
from gateway.execution.errorcap import cap_error, clip_middle
from gateway.execution.session import Cell, KernelSession, limits_from, open_session
from gateway.runs.models import KillReason, RunRecord, RunRequest, StagedFile, now_rfc3339
from gateway.sandbox.base import Death, ReadLimits, Sandbox, SandboxBackend, SandboxSpec
from gateway.settings import Settings

log = logging.getLogger(__name__)

_RESULT_EXPRESSION = "__import__('kernels.python.startup', fromlist=['_']).result_value()"


def exit_code_of(reply: dict[str, Any] | None) -> int | None:
    """The exit code a finished cell's execute_reply stands for."""
    if reply is None:
        return None
    if "exit_code" in reply:  # our bash kernel reports `$?`
        return int(reply["exit_code"])
    if reply.get("status") == "ok":
        return 0
    if reply.get("ename") == "SystemExit":
        value = str(reply.get("evalue", "")).strip()
        if value in ("", "None"):
            return 0
        try:
            return int(value)
        except ValueError:
            return 1
    return 1


def setup_code(request: RunRequest) -> str | None:
    """Gateway code run silently before the user's cell (never shown, never in history)."""
    if not request.vars:
        return None
    if request.language == "python":
        payload = json.dumps(request.vars)
        return f"__import__('kernels.python.startup', fromlist=['_']).inject_vars({payload!r})"
    lines = [
        f"export {name}={shlex.quote(_bash_value(value))}" for name, value in request.vars.items()
    ]
    return "\n".join(lines)


def _bash_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


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
    """One run of a `RunRequest`, filling in its `RunRecord`."""

    def __init__(
        self,
        request: RunRequest,
        record: RunRecord,
        backend: SandboxBackend,
        settings: Settings,
        context: zmq.asyncio.Context,
        listener: OutputListener | None = None,
        extra_files: tuple[StagedFile, ...] = (),
    ) -> None:
        self.request = request
        self.record = record
        self.backend = backend
        self.settings = settings
        self.context = context
        self.listener = listener
        self.extra_files = extra_files
        self.cancel = asyncio.Event()
        self.kernel_start_seconds: float | None = None

    async def run(self) -> RunRecord:
        record, request = self.record, self.request
        spec = SandboxSpec(
            run_id=record.id,
            language=request.language,
            limits=limits_from(self.settings, request.memory_bytes),
            env=dict(request.env),
            network=request.network,
            workspace=request.working_dir,
        )
        files = self.extra_files + request.files
        async with (
            running(record, request.notes),
            open_session(
                self.backend, spec, files, self.settings, self.context, self.cancel
            ) as session,
        ):
            self.kernel_start_seconds = session.start_seconds
            if self.cancel.is_set():
                cell = Cell(source=request.source, ending="cancelled")
            else:
                cell = await self._run_user_code(session)
            await self._finish(session.sandbox, session, cell)
        return record

    async def _run_user_code(self, session: KernelSession) -> Cell:
        setup = setup_code(self.request)
        if setup is not None:
            reply = await session.run_silent(setup, timeout=10)
            if reply is None or reply.get("status") != "ok":
                self.record.notes.append("`vars` could not be set in the kernel.")
        caps = Caps.from_settings(self.settings)
        return await session.run_cell(
            self.request.source, self.request.timeout, self.listener, caps=caps
        )

    async def _finish(self, sandbox: Sandbox, session: KernelSession, cell: Cell) -> None:
        record, request = self.record, self.request
        if cell.ending == "finished" and request.language == "python":
            await read_result(session, record, self.settings)
        events, death = await close_sandbox(
            sandbox, self.settings, record, request.return_files, died=cell.ending == "died"
        )
        apply_cell(record, cell, self.settings.error_cap_bytes)
        settle_status(record, cell, events, death)


async def read_result(session: KernelSession, record: RunRecord, settings: Settings) -> None:
    """Read the kernel's global `result` (else `output`) into the record, or note why not.
    A value larger than `result_cap_bytes` as JSON, or nested deeper than `max_json_depth`,
    is not returned."""
    reply = await session.run_silent("", timeout=10, user_expressions={"r": _RESULT_EXPRESSION})
    if reply is None:
        record.notes.append("`result` could not be read back from the kernel.")
        return
    expression = (reply.get("user_expressions") or {}).get("r", {})
    value = (expression.get("data") or {}).get("application/json")
    if not isinstance(value, dict) or not value.get("present"):
        return
    name = clip_middle(str(value.get("name")), 100)
    if "error" in value:
        reason = clip_middle(str(value["error"]), 500)
        record.notes.append(f"`{name}` was not returned: it is not JSON-serialisable ({reason}).")
        return
    result = value.get("value")
    size = json_size(result, settings.max_json_depth)
    if size is None:
        record.notes.append(
            f"`{name}` was not returned: it is nested more than {settings.max_json_depth} "
            "levels deep."
        )
    elif size > settings.result_cap_bytes:
        record.notes.append(
            f"`{name}` was not returned: it is {size} bytes as JSON, over the limit of "
            f"{settings.result_cap_bytes} bytes."
        )
    else:
        record.result = result


async def close_sandbox(
    sandbox: Sandbox,
    settings: Settings,
    record: RunRecord,
    return_files: tuple[str, ...],
    died: bool,
) -> tuple[frozenset[str], Any]:
    """After the last cell: read `return_files` back into the record, take its usage and the
    limits that struck, learn how the kernel died (if it did), then kill every process.
    Returns (limit events, death) for `settle_status`."""
    if return_files:
        limits = ReadLimits(
            max_files=settings.max_return_files,
            max_file_bytes=settings.max_return_file_bytes,
            max_total_bytes=settings.max_return_files_bytes,
        )
        read = await sandbox.read_files(return_files, limits)
        record.files = read.files
        record.notes.extend(read.notes)
    record.usage = await sandbox.usage()  # usage and limits: before kill() ends the cgroup
    events = await sandbox.limit_events()
    death = await sandbox.death() if died else None
    await sandbox.kill()
    return events, death


def error_of(cell: Cell, max_bytes: int) -> dict[str, Any] | None:
    """A cell's uncaught error: its `error` output (already cut), else that of a failed
    execute_reply, cut to `max_bytes` like an error output."""
    if cell.collector is not None and cell.collector.error is not None:
        return cell.collector.error
    if cell.reply is not None and cell.reply.get("status") == "error":
        return cap_error(cell.reply, max_bytes).to_json()
    return None


def apply_cell(record: RunRecord, cell: Cell, error_bytes: int) -> None:
    """Copy a cell's outputs into the record."""
    collector = cell.collector
    if collector is None:
        return
    record.stdout, record.stdout_truncated = collector.stdout.text(), collector.stdout.truncated
    record.stderr, record.stderr_truncated = collector.stderr.text(), collector.stderr.truncated
    record.output, record.output_truncated = collector.output.text(), collector.output.truncated
    record.outputs = collector.outputs()
    record.charts = charts_from_outputs(record.outputs)
    record.error = error_of(cell, error_bytes)
    record.notes.extend(collector.final_notes())
    record.exit_code = exit_code_of(cell.reply) if cell.ending == "finished" else None


def settle_status(
    record: RunRecord, cell: Cell, events: frozenset[str], death: Death | None
) -> None:
    """The record's status and kill reason, from how the cell ended and what limits struck."""
    # When both struck, a process storm is the likelier cause of the memory pressure.
    limit: KillReason | None = (
        "pids" if "pids" in events else "memory" if "memory" in events else None
    )
    if cell.ending == "cancelled":
        record.status, record.kill_reason = "cancelled", "cancelled"
    elif cell.ending == "output_limit":
        record.status, record.kill_reason = "killed", "output_limit"
        record.notes.append("The run was killed: it produced more output than the limit.")
    elif cell.ending == "died":
        if (death is not None and death.oom_killed) or limit == "memory":
            record.status, record.kill_reason = "killed", "memory"
            record.notes.append("The run was killed: it used more memory than its limit.")
        else:
            record.status = "failed"
            code = None if death is None else death.exit_code
            if code is not None and code < 0:
                code = 128 - code
            record.exit_code = code
            record.notes.append(f"The kernel died unexpectedly (exit status {code}).")
    elif cell.ending == "timeout":
        record.timed_out = True
        if limit is not None:
            record.status, record.kill_reason = "killed", limit
            record.notes.append(f"The {limit} limit was reached before the timeout.")
        else:
            record.status, record.kill_reason = "timed_out", "timeout"
    elif record.exit_code == 0:
        record.status = "succeeded"
        record.error = (
            None if record.error and record.error.get("ename") == "SystemExit" else record.error
        )
        if limit is not None:
            record.notes.append(f"The {limit} limit was reached during the run.")
    elif limit is not None:
        record.status, record.kill_reason = "killed", limit
        record.notes.append(f"The {limit} limit was reached.")
    else:
        record.status = "failed"
    if record.status in ("timed_out", "killed", "cancelled"):
        record.exit_code = None
