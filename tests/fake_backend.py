"""A sandbox backend for the fast tests: each sandbox is a temporary folder and a scripted
kernel (fake_kernel.py) on the test's own event loop, no isolation at all.

It is no plug-in: no entry point names it, so `--backend` can never choose it; tests make
it themselves (`FakeBackend()`) and hand it to the execution layer (`Pools`,
`RunService`). Each sandbox writes down what was asked of it, in order (`calls`), and
refuses what the sandbox interface forbids (a read back while the kernel still runs, a
second `destroy`), so the tests can hold the executor to the call order of
`gateway.sandbox.base`. Staging and read back are the real ones (`staging.py`,
`readback.py`) on the folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.models.record import Usage
from gateway.models.request import StagedFile
from gateway.sandbox.base import (
    BackendContext,
    Death,
    FilesRead,
    LimitEvent,
    ReadLimits,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
)
from gateway.sandbox.kernelspec import connection_info, new_key
from gateway.sandbox.readback import read_files
from gateway.sandbox.staging import write_staged_files
from tests.fake_kernel import ScriptedKernel, Signals

START_CPU_MS = 500  # what a kernel's start "costs": never counted in a run's usage


class FakeBackend(SandboxBackend):
    name = "fake"

    def __init__(
        self,
        config: Any = None,
        context: BackendContext | None = None,
        *,
        can_freeze: bool = True,
        can_lower_memory: bool = False,
    ) -> None:
        super().__init__(config, context or BackendContext(instance_id="fake"))
        self.can_freeze = can_freeze
        self.can_lower_memory = can_lower_memory
        self.signals = Signals()
        self.sandboxes: list[FakeSandbox] = []

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = FakeSandbox(self, spec)
        self.sandboxes.append(sandbox)
        return sandbox

    @property
    def live(self) -> list[FakeSandbox]:
        """Sandboxes not destroyed yet."""
        return [s for s in self.sandboxes if not s.destroyed]


class FakeSandbox(Sandbox):
    def __init__(self, backend: FakeBackend, spec: SandboxSpec) -> None:
        self.backend = backend
        self.spec = spec
        self.calls: list[str] = ["create"]
        self.root = Path(tempfile.mkdtemp(prefix="fake-sandbox-"))
        self.work = self.root / "work"
        self.work.mkdir()
        self.kernel: ScriptedKernel | None = None
        self.exited: asyncio.Future[tuple[int, bool]] = asyncio.get_running_loop().create_future()
        self.killed = False  # by us: no death to tell
        self.destroyed = False
        self.memory_bytes = spec.limits.memory_bytes

    @property
    def executed(self) -> list[str]:
        """The code the kernel was asked to run, in order."""
        return [] if self.kernel is None else self.kernel.executed

    def _on_exit(self, code: int, oom: bool) -> None:
        if not self.exited.done():
            self.exited.set_result((code, oom))

    # --- what every backend must do -----------------------------------------------------

    async def start(self) -> dict[str, Any]:
        self.calls.append("start")
        info = connection_info(str(self.root / "k"), new_key())
        self.kernel = ScriptedKernel(info["ip"], info["key"], self.backend.signals, self._on_exit)
        self.kernel.cpu_ms = START_CPU_MS
        return info

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        self.calls.append("stage_files")
        fd = os.open(self.work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            await asyncio.to_thread(write_staged_files, fd, files, os.getuid(), os.getgid())
        finally:
            os.close(fd)

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        self.calls.append("read_files")
        kernel = self.kernel
        if kernel is not None and kernel.alive and not kernel.frozen:
            raise AssertionError("return files read while the kernel could still change them")
        fd = os.open(self.work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return await asyncio.to_thread(read_files, fd, str(self.work), list(patterns), limits)
        finally:
            os.close(fd)

    async def wait_exit(self) -> None:
        await asyncio.wait([self.exited])

    def has_exited(self) -> bool:
        return self.exited.done()

    async def death(self) -> Death | None:
        self.calls.append("death")
        if not self.exited.done() or self.killed:
            return None
        code, oom = self.exited.result()
        return Death(exit_code=code, oom_killed=oom)

    async def kill(self) -> None:
        self.calls.append("kill")
        if self.kernel is not None and self.kernel.alive:
            self.killed = True
            await self.kernel.stop()
        self._on_exit(-9, False)

    async def destroy(self) -> None:
        self.calls.append("destroy")
        if self.destroyed:
            raise AssertionError("a sandbox destroyed twice")
        self.destroyed = True
        if self.kernel is not None and self.kernel.alive:
            self.killed = True
            await self.kernel.stop()
        self._on_exit(-9, False)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- capabilities -------------------------------------------------------------------

    async def freeze(self) -> bool:
        self.calls.append("freeze")
        if not self.backend.can_freeze or self.kernel is None or not self.kernel.alive:
            return False
        self.kernel.frozen = True
        return True

    async def usage(self) -> Usage:
        self.calls.append("usage")
        cpu = None if self.kernel is None else self.kernel.cpu_ms
        return Usage(cpu_ms=cpu, peak_memory_bytes=64 << 20)

    async def limit_events(self) -> frozenset[LimitEvent]:
        self.calls.append("limit_events")
        if self.exited.done() and not self.killed and self.exited.result()[1]:
            return frozenset({"memory"})
        return frozenset()

    async def set_memory_limit(self, memory_bytes: int) -> bool:
        self.calls.append("set_memory_limit")
        if not self.backend.can_lower_memory:
            return await super().set_memory_limit(memory_bytes)  # the default: cannot
        self.memory_bytes = memory_bytes
        return True
