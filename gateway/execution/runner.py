"""Execute one run: sandbox -> stage files -> kernel -> execute -> collect -> deadline ->
return files -> destroy. The only module that drives a sandbox and a kernel together.

The gateway enforces the deadline, not the kernel (DESIGN.md decision 4): at the deadline
the kernel is interrupted, gets `interrupt_grace` seconds to flush, then every process of
the sandbox is killed. What was produced before is returned with `timed_out: true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shlex
import time
from collections.abc import Awaitable
from typing import Any, Literal

import zmq.asyncio

from gateway.errors import SandboxError
from gateway.execution.charts import charts_from_outputs
from gateway.execution.collector import Caps, OutputCollector, OutputListener
from gateway.execution.kernel import KernelClient, KernelDied, connect
from gateway.runs.models import KillReason, RunRecord, RunRequest, StagedFile, now_rfc3339
from gateway.sandbox.base import Limits, ReadLimits, Sandbox, SandboxBackend, SandboxSpec
from gateway.settings import Settings

log = logging.getLogger(__name__)

Ending = Literal["finished", "timeout", "cancelled", "died", "output_limit"]

IDLE_AFTER_REPLY = 2.0  # seconds to wait for iopub's `idle` once the execute_reply arrived

_RESULT_EXPRESSION = "__import__('kernels.python.startup', fromlist=['_']).result_value()"


@dataclasses.dataclass
class Cell:
    """One piece of code run in the kernel: what it printed and how it ended."""

    source: str
    ending: Ending = "finished"
    reply: dict[str, Any] | None = None
    collector: OutputCollector | None = None
    duration_ms: int = 0


def limits_from(settings: Settings) -> Limits:
    return Limits(
        cpus=settings.cpus,
        memory_bytes=settings.memory_bytes,
        pids=settings.pids,
        workdir_bytes=settings.workdir_bytes,
        tmp_bytes=settings.tmp_bytes,
    )


def caps_from(settings: Settings) -> Caps:
    return Caps(
        stream_bytes=settings.stream_cap_bytes,
        display_bytes=settings.display_cap_bytes,
        limit_bytes=settings.output_limit_bytes,
    )


def exit_code_of(language: str, reply: dict[str, Any] | None) -> int | None:
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


class KernelSession:
    """A started kernel in its sandbox, ready to run cells until the deadline of each."""

    def __init__(
        self,
        sandbox: Sandbox,
        client: KernelClient,
        settings: Settings,
        cancel: asyncio.Event,
    ) -> None:
        self.sandbox = sandbox
        self.client = client
        self.settings = settings
        self.cancel = cancel
        self.dead = False

    async def run_cell(
        self, source: str, timeout: float, listener: OutputListener | None = None
    ) -> Cell:
        cell = Cell(source=source, collector=OutputCollector(caps_from(self.settings), listener))
        assert cell.collector is not None
        started = time.monotonic()
        msg_id = self.client.execute(source)
        limit_hit = asyncio.Event()
        pump = asyncio.create_task(self._pump(msg_id, cell.collector, limit_hit))
        reply = asyncio.create_task(self._reply(msg_id))
        waiters: dict[str, asyncio.Future[Any]] = {
            "pump": pump,
            "reply": reply,
            "cancel": asyncio.ensure_future(self.cancel.wait()),
            "limit": asyncio.ensure_future(limit_hit.wait()),
            "exit": asyncio.ensure_future(self.sandbox.wait_exit()),
        }
        deadline = started + timeout
        try:
            while not (pump.done() and reply.done()):
                now = time.monotonic()
                if reply.done():
                    # iopub is lossy under a flood (PUB drops at the high-water mark): once
                    # the reply is in, wait only a little longer for the final `idle`.
                    deadline = min(deadline, now + IDLE_AFTER_REPLY)
                    if now >= deadline:
                        break
                remaining = deadline - now
                pending = [w for w in waiters.values() if not w.done()]
                if remaining <= 0:
                    cell.ending = "timeout"
                    await self._interrupt(pump, reply)
                    break
                await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if self.cancel.is_set():
                    cell.ending = "cancelled"
                    break
                if limit_hit.is_set():
                    cell.ending = "output_limit"
                    break
                if waiters["exit"].done() and not (pump.done() and reply.done()):
                    await asyncio.wait([pump], timeout=0.2)  # let the last output arrive
                    cell.ending = "died"
                    self.dead = True
                    break
            if reply.done() and not reply.cancelled():
                cell.reply = reply.result()
        finally:
            for waiter in waiters.values():
                waiter.cancel()
            await asyncio.gather(*waiters.values(), return_exceptions=True)
        cell.duration_ms = int((time.monotonic() - started) * 1000)
        return cell

    async def _interrupt(self, pump: asyncio.Task[None], reply: asyncio.Task[Any]) -> None:
        with contextlib.suppress(Exception):
            self.client.interrupt()
        await asyncio.wait([pump], timeout=self.settings.interrupt_grace)

    async def _pump(
        self, msg_id: str, collector: OutputCollector, limit_hit: asyncio.Event
    ) -> None:
        while True:
            msg = await self.client.iopub(timeout=3600)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "status" and msg["content"].get("execution_state") == "idle":
                return
            collector.add(msg)
            if collector.limit_exceeded:
                limit_hit.set()
                return

    async def _reply(self, msg_id: str) -> dict[str, Any]:
        while True:
            msg = await self.client.shell(timeout=3600)
            if msg["parent_header"].get("msg_id") == msg_id:
                content: dict[str, Any] = msg["content"]
                return content

    async def run_silent(self, code: str, timeout: float, **kw: Any) -> dict[str, Any] | None:
        """Gateway code; None when it did not answer in time or the kernel is gone."""
        if self.dead:
            return None
        try:
            return await self.client.run_silent(code, timeout, **kw)
        except TimeoutError:
            return None


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

    async def run(self) -> RunRecord:
        record, request = self.record, self.request
        record.status = "running"
        record.started_at = now_rfc3339()
        record.notes.extend(request.notes)
        started = time.monotonic()
        spec = SandboxSpec(
            run_id=record.id,
            language=request.language,
            limits=limits_from(self.settings),
            env=dict(request.env),
            network=request.network,
            workspace=request.working_dir,
        )
        try:
            async with self.backend.sandbox(spec) as sandbox:
                await sandbox.stage_files(self.extra_files + request.files)
                info = await sandbox.start()
                async with connect(info, self.context) as client:
                    session = KernelSession(sandbox, client, self.settings, self.cancel)
                    await self._until_cancelled(
                        client.wait_ready(self.settings.kernel_start_timeout, lambda: True),
                        sandbox,
                    )
                    if self.cancel.is_set():
                        cell = Cell(source=request.source, ending="cancelled")
                    else:
                        cell = await self._run_user_code(session)
                    await self._finish(sandbox, session, cell)
        except KernelDied as exc:
            raise SandboxError(f"The kernel could not start: {exc}") from exc
        finally:
            record.usage.wall_ms = int((time.monotonic() - started) * 1000)
            record.finished_at = now_rfc3339()
        return record

    async def _until_cancelled(self, work: Awaitable[None], sandbox: Sandbox) -> None:
        """Wait for kernel start-up, giving up early on cancel or on the kernel's exit."""
        task = asyncio.ensure_future(work)
        cancel = asyncio.ensure_future(self.cancel.wait())
        exited = asyncio.ensure_future(sandbox.wait_exit())
        try:
            await asyncio.wait([task, cancel, exited], return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
            elif exited.done() and not cancel.done():
                death = await sandbox.death()
                detail = f": {death.detail.strip()[-500:]}" if death and death.detail else ""
                raise SandboxError(f"The kernel exited while starting{detail}")
        finally:
            for future in (task, cancel, exited):
                future.cancel()
            await asyncio.gather(task, cancel, exited, return_exceptions=True)

    async def _run_user_code(self, session: KernelSession) -> Cell:
        setup = setup_code(self.request)
        if setup is not None:
            reply = await session.run_silent(setup, timeout=10)
            if reply is None or reply.get("status") != "ok":
                self.record.notes.append("`vars` could not be set in the kernel.")
        return await session.run_cell(self.request.source, self.request.timeout, self.listener)

    async def _finish(self, sandbox: Sandbox, session: KernelSession, cell: Cell) -> None:
        record, request = self.record, self.request
        if cell.ending == "finished" and request.language == "python":
            await self._read_result(session)
        if request.return_files:
            limits = ReadLimits(
                max_files=self.settings.max_return_files,
                max_file_bytes=self.settings.max_return_file_bytes,
                max_total_bytes=self.settings.max_return_files_bytes,
            )
            read = await sandbox.read_files(request.return_files, limits)
            record.files = read.files
            record.notes.extend(read.notes)
        record.usage = await sandbox.usage()
        death = await sandbox.death() if cell.ending == "died" else None
        await sandbox.kill()
        events = await sandbox.limit_events()
        apply_cell(record, request.language, cell)
        settle_status(record, cell, events, death)

    async def _read_result(self, session: KernelSession) -> None:
        reply = await session.run_silent("", timeout=10, user_expressions={"r": _RESULT_EXPRESSION})
        if reply is None:
            self.record.notes.append("`result` could not be read back from the kernel.")
            return
        expression = (reply.get("user_expressions") or {}).get("r", {})
        value = (expression.get("data") or {}).get("application/json")
        if not isinstance(value, dict) or not value.get("present"):
            return
        if "error" in value:
            self.record.notes.append(
                f"`{value.get('name')}` was not returned: it is not JSON-serialisable "
                f"({value['error']})."
            )
            return
        self.record.result = value.get("value")


def apply_cell(record: RunRecord, language: str, cell: Cell) -> None:
    """Copy a cell's outputs into the record."""
    collector = cell.collector
    if collector is None:
        return
    record.stdout, record.stdout_truncated = collector.stdout.text(), collector.stdout.truncated
    record.stderr, record.stderr_truncated = collector.stderr.text(), collector.stderr.truncated
    record.output, record.output_truncated = collector.output.text(), collector.output.truncated
    record.outputs = collector.outputs()
    record.charts = charts_from_outputs(record.outputs)
    record.error = collector.error
    record.notes.extend(collector.final_notes())
    if cell.reply is not None and cell.reply.get("status") == "error" and record.error is None:
        record.error = {
            "ename": cell.reply.get("ename", ""),
            "evalue": cell.reply.get("evalue", ""),
            "traceback": list(cell.reply.get("traceback", [])),
        }
    record.exit_code = exit_code_of(language, cell.reply) if cell.ending == "finished" else None


def settle_status(record: RunRecord, cell: Cell, events: frozenset[str], death: Any) -> None:
    """The record's status and kill reason, from how the cell ended and what limits struck."""
    limit: KillReason | None = (
        "memory" if "memory" in events else "pids" if "pids" in events else None
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
