"""A started kernel in its sandbox, and the cells it runs.

`open_session` owns the sandbox and the kernel client for as long as its `async with`
lasts: it creates the sandbox, stages files, starts the kernel, waits until it is ready
(or gives up on cancel or on the kernel's exit), and always destroys everything on exit.
Single runs (`runner.Execution`) and notebook replays use it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Literal

import zmq.asyncio

from gateway.errors import SandboxError
from gateway.execution.collector import Caps, DisplayUpdate, OutputCollector, OutputListener
from gateway.execution.kernel import KernelClient, connect
from gateway.sandbox.base import Limits, Sandbox, SandboxBackend, SandboxSpec
from gateway.settings import Settings

Ending = Literal["finished", "timeout", "cancelled", "died", "output_limit"]

IDLE_AFTER_REPLY = 2.0  # seconds to wait for iopub's `idle` once the execute_reply arrived


@dataclasses.dataclass
class Cell:
    """One piece of code run in the kernel: what it printed and how it ended."""

    source: str
    ending: Ending = "finished"
    reply: dict[str, Any] | None = None
    collector: OutputCollector | None = None
    duration_ms: int = 0


def limits_from(settings: Settings, memory_bytes: int | None = None) -> Limits:
    return Limits(
        cpus=settings.cpus,
        memory_bytes=min(settings.memory_bytes, memory_bytes or settings.memory_bytes),
        pids=settings.pids,
        workdir_bytes=settings.workdir_bytes,
        tmp_bytes=settings.tmp_bytes,
    )


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
        self.cancel = cancel  # the run's: a pooled session gets it when a run takes it
        self.dead = False
        self.start_seconds = 0.0
        self._closed = False

    async def close(self) -> None:
        """Close the client and destroy the sandbox (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.close()
        finally:
            await self.sandbox.destroy()

    async def run_cell(
        self,
        source: str,
        timeout: float,
        listener: OutputListener | None = None,
        caps: Caps | None = None,
        on_display: DisplayUpdate | None = None,
    ) -> Cell:
        """Run one cell until it ends or `timeout` s pass; `caps` default to the settings'.
        `on_display` hears of display updates meant for outputs of earlier cells."""
        caps = Caps.from_settings(self.settings) if caps is None else caps
        cell = Cell(source=source, collector=OutputCollector(caps, listener, on_display))
        assert cell.collector is not None
        started = time.monotonic()
        msg_id = self.client.execute(source)
        limit_hit = asyncio.Event()
        pump = asyncio.create_task(
            self._pump(msg_id, cell.collector, limit_hit, self.client.received_bytes)
        )
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
        self, msg_id: str, collector: OutputCollector, limit_hit: asyncio.Event, baseline: int
    ) -> None:
        """Collect the cell's iopub messages until `idle`. Every byte the kernel sends
        (on any channel, for any parent) counts against the cell's output limit."""
        while True:
            msg = await self.client.iopub(timeout=3600)
            collector.received_bytes = self.client.received_bytes - baseline
            if collector.limit_exceeded:
                limit_hit.set()
                return
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "status" and msg["content"].get("execution_state") == "idle":
                return
            try:
                collector.add(msg)
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                log.debug("dropped a kernel message of an unexpected shape: %r", exc)

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


log = logging.getLogger(__name__)


async def start_session(
    backend: SandboxBackend,
    spec: SandboxSpec,
    settings: Settings,
    context: zmq.asyncio.Context,
    cancel: asyncio.Event | None = None,
) -> KernelSession:
    """A ready kernel in a fresh sandbox, owned by the caller, who must `close()` it (a
    pool holds it first, then a run). On cancel while the sandbox starts it raises
    `StartCancelled`, everything already destroyed; on cancel while the kernel gets ready
    it returns at once (check `cancel.is_set()`); a kernel that cannot start raises
    `SandboxError`."""
    cancel = cancel if cancel is not None else asyncio.Event()
    started = time.monotonic()
    sandbox = await backend.create(spec)
    try:
        info = await _unless_cancelled(sandbox.start(), cancel)
        session = KernelSession(sandbox, connect(info, context), settings, cancel)
    except BaseException:
        await sandbox.destroy()
        raise
    try:
        await _until_ready(session, settings.kernel_start_timeout)
    except BaseException:
        await session.close()
        raise
    session.start_seconds = time.monotonic() - started
    return session


@contextlib.asynccontextmanager
async def open_session(
    backend: SandboxBackend,
    spec: SandboxSpec,
    settings: Settings,
    context: zmq.asyncio.Context,
    cancel: asyncio.Event | None = None,
) -> AsyncIterator[KernelSession]:
    """`start_session` scoped to a block: everything is destroyed when it exits."""
    session = await start_session(backend, spec, settings, context, cancel)
    try:
        yield session
    finally:
        await session.close()


class StartCancelled(Exception):
    """The run was cancelled while its sandbox and kernel were starting."""


async def _unless_cancelled(
    start: Coroutine[Any, Any, dict[str, Any]], cancel: asyncio.Event
) -> dict[str, Any]:
    """The sandbox's connection info; StartCancelled when `cancel` is set first."""
    task = asyncio.ensure_future(start)
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait([task, cancelled], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise StartCancelled
    finally:
        for future in (task, cancelled):
            future.cancel()
        await asyncio.gather(task, cancelled, return_exceptions=True)


async def _until_ready(session: KernelSession, timeout: float) -> None:
    """Wait for kernel start-up, giving up early on cancel or on the kernel's exit."""
    sandbox = session.sandbox
    task = asyncio.ensure_future(session.client.wait_ready(timeout))
    cancel = asyncio.ensure_future(session.cancel.wait())
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
