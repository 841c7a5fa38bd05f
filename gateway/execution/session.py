"""A started kernel in its sandbox, and the cells it runs.

`start_session` creates the sandbox, starts the kernel and waits until it is ready (or
gives up on cancel or on the kernel's exit); a start that fails is tried once more in a
fresh sandbox, since under load a start can fail that would succeed a moment later. The
session's owner calls `close()`, which destroys everything: a pool while the kernel waits
in it, then the run's `async with pools.kernel(...)` block (`gateway.execution.pool`),
which owns the kernel it takes or starts from acquiring it to its destruction.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Coroutine
from typing import Any, Literal

from gateway.errors import SandboxError
from gateway.execution.collector import Caps, DisplayUpdate, OutputCollector, OutputListener
from gateway.execution.config import ExecutionConfig
from gateway.execution.fence import CellFences, new_token
from gateway.execution.kernel import KernelClient, OverLimit, Wire
from gateway.execution.kernel_code import fence_code
from gateway.models.common import Language
from gateway.models.languages import LanguageTraits, traits
from gateway.sandbox.base import (
    Death,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
    to_the_end,
    wait_out,
)

# "exited": the program ended the kernel itself (`Deno.exit(n)`), after all its output
Ending = Literal["finished", "timeout", "cancelled", "died", "output_limit", "exited"]

IDLE_AFTER_REPLY = 2.0  # seconds to wait for iopub's `idle` once the execute_reply arrived
START_ATTEMPTS = 2  # a kernel that fails to start is tried once more, in a fresh sandbox


@dataclasses.dataclass
class CellRun:
    """One piece of code run in the kernel: what it printed and how it ended."""

    source: str
    ending: Ending = "finished"
    reply: dict[str, Any] | None = None
    collector: OutputCollector | None = None
    duration_ms: int = 0
    exit_code: int | None = None  # the program's exit status when it "exited"


class KernelSession:
    """A started kernel in its sandbox, ready to run cells until the deadline of each."""

    def __init__(
        self,
        sandbox: Sandbox,
        client: KernelClient,
        config: ExecutionConfig,
        language: Language = "python",
    ) -> None:
        self.sandbox = sandbox
        self.client = client
        self.config = config
        self.language = language
        self.traits: LanguageTraits = traits(language)
        # the kernel's fence token (`execution.fence`), for kernels that need fences
        self.fence_token = new_token() if self.traits.fenced_output else None
        self._fences_asked = 0
        self._last_message = 0.0  # when the kernel last sent anything on iopub
        self.dead = False
        self.start_seconds = 0.0
        self._closed = False
        self.released = False  # its sandbox given away (`give_away`)

    def give_away(self) -> Sandbox:
        """Close the client and hand the sandbox, still running, to a new owner (a kept
        snapshot): closing the session then leaves it alone."""
        self.released = True
        self._closed = True
        self.client.close()
        return self.sandbox

    async def close(self) -> None:
        """Close the client and destroy the sandbox (idempotent). Cancelled meanwhile, the
        destruction still runs to its end: half of one would leave the rest."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.close()
        finally:
            await to_the_end(self.sandbox.destroy())

    async def run_cell(
        self,
        source: str,
        until: float,
        cancel: asyncio.Event,
        listener: OutputListener | None = None,
        caps: Caps | None = None,
        on_display: DisplayUpdate | None = None,
        user_expressions: dict[str, str] | None = None,
    ) -> CellRun:
        """Run one cell until it ends, `cancel` is set, or the instant `until`
        (`time.monotonic()`; the program's `Deadline` says when) is past: then the kernel is
        interrupted, given `interrupt_grace` s to flush, and the cell ends `timeout`.
        `caps` default to the config's. The cell's outputs are told to `listener` as they
        arrive; `on_display` hears of display updates meant for outputs of earlier cells;
        `user_expressions` are evaluated by the kernel after the cell, if it succeeded, and
        come back in its reply (ipykernel), saving the gateway a request of its own.

        Once the cell has replied, its output has arrived with its `idle` status, or (for a
        kernel with fences) with a fence on both streams; past that, the cell waits for
        either only while the kernel keeps sending, up to `IDLE_AFTER_REPLY` s of quiet."""
        caps = self.config.caps() if caps is None else caps
        # a fenced kernel prints from another thread than the one that reports the error:
        # what it printed before the error may arrive after it, so the error waits for the
        # fences (`OutputCollector.hold_error`)
        collector = OutputCollector(
            caps, listener, on_display, hold_error=self.traits.fenced_output
        )
        cell = CellRun(source=source, collector=collector)
        assert cell.collector is not None
        started = time.monotonic()
        msg_id = self.client.execute(source, user_expressions=user_expressions)
        parents = {msg_id}  # the requests whose iopub messages belong to this cell
        fences = CellFences(self.fence_token) if self.fence_token is not None else None
        limit_hit = asyncio.Event()
        pump = asyncio.create_task(
            self._pump(
                msg_id, parents, fences, cell.collector, limit_hit, self.client.received_bytes
            )
        )
        reply = asyncio.create_task(self._reply(msg_id, limit_hit))
        waiters: dict[str, asyncio.Future[Any]] = {
            "pump": pump,
            "reply": reply,
            "cancel": asyncio.ensure_future(cancel.wait()),
            "limit": asyncio.ensure_future(limit_hit.wait()),
            "exit": asyncio.ensure_future(self.sandbox.wait_exit()),
        }
        deadline = until
        replied_at: float | None = None
        try:
            while not (pump.done() and reply.done()):
                now = time.monotonic()
                wait_until = deadline
                if reply.done():
                    if replied_at is None:
                        replied_at = now
                        if fences is not None:
                            parents.add(self._ask_fence(fences))
                    # iopub is lossy under a flood (PUB drops at the high-water mark): once
                    # the reply is in, wait only while the kernel keeps sending.
                    quiet = max(replied_at, self._last_message) + IDLE_AFTER_REPLY
                    if now >= quiet:
                        break
                    wait_until = min(deadline, quiet)
                if now >= deadline:
                    cell.ending = "timeout"
                    if self.traits.interruptible:
                        await self._interrupt(pump, reply)
                    break
                pending = [w for w in waiters.values() if not w.done()]
                await asyncio.wait(
                    pending, timeout=wait_until - now, return_when=asyncio.FIRST_COMPLETED
                )
                if cancel.is_set():
                    cell.ending = "cancelled"
                    break
                if limit_hit.is_set():
                    cell.ending = "output_limit"
                    break
                if fences is not None and fences.exit_code is not None:
                    cell.ending, cell.exit_code = "exited", fences.exit_code
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
        if fences is not None:
            for stream in ("stdout", "stderr"):
                held = fences.release(stream)
                if held:
                    cell.collector.add(_stream_message(msg_id, stream, held))
            cell.collector.release_error()
        cell.duration_ms = int((time.monotonic() - started) * 1000)
        return cell

    def _ask_fence(self, fences: CellFences) -> str:
        """Have the kernel write the end fence through both streams; the request's id."""
        self._fences_asked += 1
        label = f"end:{self._fences_asked}"
        fences.expect_end(label)
        return self.client.execute(fence_code(label), silent=True)

    async def _interrupt(self, pump: asyncio.Task[None], reply: asyncio.Task[Any]) -> None:
        with contextlib.suppress(Exception):
            self.client.interrupt()
        await asyncio.wait([pump], timeout=self.config.interrupt_grace)

    async def _pump(
        self,
        msg_id: str,
        parents: set[str],
        fences: CellFences | None,
        collector: OutputCollector,
        limit_hit: asyncio.Event,
        baseline: int,
    ) -> None:
        """Collect the cell's iopub messages until `idle` (or both fences). Every byte the
        kernel sends (on any channel, for any parent) counts against the cell's output
        limit; past the limit the kernel's meter stops reading (OverLimit)."""
        while True:
            try:
                msg = await self.client.iopub(timeout=3600)
            except OverLimit:
                limit_hit.set()
                return
            self._last_message = time.monotonic()
            collector.received_bytes = self.client.received_bytes - baseline
            if collector.limit_exceeded:
                limit_hit.set()
                return
            parent = msg["parent_header"].get("msg_id")
            if parent not in parents:
                continue
            kind = msg["header"]["msg_type"]
            if fences is None:
                if kind == "status" and msg["content"].get("execution_state") == "idle":
                    return
            elif kind == "stream":
                stream = msg["content"].get("name", "stdout")
                text = fences.feed(stream, str(msg["content"].get("text", "")))
                msg = _stream_message(msg_id, stream, text)
            elif parent != msg_id:
                continue  # the fence request's own status and input
            try:
                collector.add(msg)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                log.debug("dropped a kernel message of an unexpected shape: %r", exc)
            if fences is not None and fences.finished:
                return

    async def _reply(self, msg_id: str, limit_hit: asyncio.Event) -> dict[str, Any]:
        while True:
            try:
                msg = await self.client.shell(timeout=3600)
            except OverLimit:  # no reply will be read: the cell ends on `limit_hit`
                limit_hit.set()
                await asyncio.Event().wait()  # never set: the cell ends and cancels this
                raise
            if msg["parent_header"].get("msg_id") == msg_id:
                content: dict[str, Any] = msg["content"]
                return content

    async def display_value(self, code: str, timeout: float) -> dict[str, Any] | None:
        """Gateway code run without history: the data of the `execute_result` it shows
        (whenever it comes: a fenced kernel may send it after `idle`); None when it showed
        none in time, failed, or the kernel is gone. Nothing of it reaches a cell."""
        if self.dead:
            return None
        msg_id = self.client.execute(code, store_history=False)

        async def value() -> dict[str, Any] | None:
            while True:
                try:
                    msg = await self.client.iopub(timeout=timeout)
                except OverLimit:  # the run's output limit: the executor sees `over_limit`
                    return None
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind = msg["header"]["msg_type"]
                if kind == "execute_result":
                    data: dict[str, Any] = msg["content"].get("data") or {}
                    return data
                if kind == "error":
                    return None

        task = asyncio.ensure_future(value())
        exited = asyncio.ensure_future(self.sandbox.wait_exit())
        try:
            await asyncio.wait([task, exited], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return task.result() if task.done() and not task.exception() else None
        finally:
            for future in (task, exited):
                future.cancel()
            await asyncio.gather(task, exited, return_exceptions=True)

    async def run_silent(self, code: str, timeout: float, **kw: Any) -> dict[str, Any] | None:
        """Gateway code; None when it did not answer in time or the kernel is gone."""
        if self.dead:
            return None
        try:
            return await self.client.run_silent(code, timeout, **kw)
        except (TimeoutError, OverLimit):  # OverLimit: the executor sees `over_limit`
            return None


log = logging.getLogger(__name__)


def _stream_message(parent: str, name: str, text: str) -> dict[str, Any]:
    """A stream message of the cell `parent` (fences taken out of its text)."""
    return {
        "header": {"msg_type": "stream"},
        "parent_header": {"msg_id": parent},
        "content": {"name": name, "text": text},
        "metadata": {},
    }


async def start_session(
    backend: SandboxBackend,
    spec: SandboxSpec,
    config: ExecutionConfig,
    wire: Wire,
    cancel: asyncio.Event | None = None,
    source: Sandbox | None = None,
) -> KernelSession:
    """A ready kernel in a fresh sandbox, owned by the caller, who must `close()` it (a
    pool holds it first, then a run); with `source` (a kept snapshot's sandbox), a
    continuation of its kernel. On cancel while the sandbox starts it raises
    `StartCancelled`, everything already destroyed; on cancel while the kernel gets ready
    it returns at once (check `cancel.is_set()`). A kernel that cannot start is tried once
    more in a fresh sandbox; if that fails too it raises `SandboxError` with both reasons.
    Each try is bounded (`kernel_start_timeout` for the sockets, then for readiness)."""
    cancel = cancel if cancel is not None else asyncio.Event()
    failures: list[str] = []
    while True:
        try:
            return await _start_once(backend, spec, config, wire, cancel, source)
        except SandboxError as exc:
            failures.append(exc.message)
            if cancel.is_set() or len(failures) >= START_ATTEMPTS:
                raise _start_failed(failures) from exc
            log.warning("%s: a kernel did not start (%s); trying again", spec.run_id, exc.message)


def _start_failed(failures: list[str]) -> SandboxError:
    """The error of a start that failed `failures` times (the last reason first)."""
    if len(failures) == 1:
        return SandboxError(failures[0])
    *earlier, last = failures
    if all(reason == last for reason in earlier):
        return SandboxError(f"The kernel failed to start {len(failures)} times: {last}")
    before = " ".join(earlier)
    return SandboxError(
        f"The kernel failed to start {len(failures)} times: {last} (before: {before})"
    )


async def _start_once(
    backend: SandboxBackend,
    spec: SandboxSpec,
    config: ExecutionConfig,
    wire: Wire,
    cancel: asyncio.Event,
    source: Sandbox | None = None,
) -> KernelSession:
    started = time.monotonic()
    if source is not None:
        sandbox = await backend.branch(spec, source)
    else:
        sandbox = await backend.create(spec)
    try:
        try:
            info = await _unless_cancelled(sandbox.start(), cancel)
        except SandboxError as exc:
            if not sandbox.has_exited():
                raise
            how = _how(await sandbox.death())  # the sandbox's message has its output
            raise SandboxError(f"{exc.message} ({how})" if how else exc.message) from exc
        client = KernelClient(info, wire)
        session = KernelSession(sandbox, client, config, spec.language)
    except BaseException:
        await to_the_end(sandbox.destroy())
        raise
    try:
        await _until_ready(session, config.kernel_start_timeout, cancel)
    except BaseException:
        await session.close()
        raise
    session.start_seconds = time.monotonic() - started
    return session


class StartCancelled(Exception):
    """The run was cancelled while its sandbox and kernel were starting."""


async def _unless_cancelled(
    start: Coroutine[Any, Any, dict[str, Any]], cancel: asyncio.Event
) -> dict[str, Any]:
    """The sandbox's connection info; StartCancelled when `cancel` is set first. A start
    given up (cancelled, or this task cancelled) has ended when this returns: what it was
    still making (a forked kernel whose answer was on its way) is then the sandbox's, for
    the caller's `destroy()` to find; destroyed while the start went on, it was left."""
    task = asyncio.ensure_future(start)
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait([task, cancelled], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise StartCancelled
    finally:
        cancelled.cancel()
        if not task.done():
            task.cancel()
        try:
            await wait_out(task, cancelled)
        finally:
            if not task.cancelled():
                task.exception()  # its failure is the caller's to tell, or nobody's: retrieved


async def _until_ready(session: KernelSession, timeout: float, cancelled: asyncio.Event) -> None:
    """Wait for kernel start-up, giving up early on cancel or on the kernel's exit."""
    sandbox = session.sandbox
    task = asyncio.ensure_future(session.client.wait_ready(timeout))
    cancel = asyncio.ensure_future(cancelled.wait())
    exited = asyncio.ensure_future(sandbox.wait_exit())
    try:
        await asyncio.wait([task, cancel, exited], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        elif exited.done() and not cancel.done():
            raise SandboxError(
                f"The kernel exited while starting{_death_note(await sandbox.death())}"
            )
    finally:
        for future in (task, cancel, exited):
            future.cancel()
        await asyncio.gather(task, cancel, exited, return_exceptions=True)


def _death_note(death: Death | None) -> str:
    """How a kernel that exited while starting ended, for its error message: its exit
    status or signal (a kill from outside prints nothing), and the end of its own output."""
    if death is None:
        return "."
    detail = death.detail.strip()[-500:]
    return f" ({_how(death)}){': ' + detail if detail else '.'}"


def _how(death: Death | None) -> str:
    """'killed by SIGKILL', 'exit status 1', ...; empty when nothing is known."""
    if death is None:
        return ""
    code = death.exit_code
    if death.oom_killed:
        return "killed by its memory limit"
    if code is None:
        return "exit status unknown"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if code > 128:
        return f"exit status {code}, as if killed by {_signal_name(code - 128)}"
    return f"exit status {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
