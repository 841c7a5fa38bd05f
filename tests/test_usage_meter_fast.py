"""The usage meter against the fake backend (fake_backend.py), whose scripted kernel spends
10 ms of "CPU" per request and 500 ms on its start (`START_CPU_MS`): each cell's own CPU in
its `metadata.gateway` and on its `CellFinished` event, adding up to at most the run's (the
gateway's own requests are the run's); a cell in a continued kernel (`advance`) counts in
that kernel only, never its start; a run whose files could not be staged still says what
its sandbox held; a sandbox that cannot tell CPU gives no figure at all. The real kernels'
figures are `test_usage_meter.py`'s."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import InvalidPath
from gateway.execution.events import CellFinished, RunEvent
from gateway.execution.executor import Execution
from gateway.execution.session import KernelSession
from gateway.models.common import new_run_id
from gateway.models.record import RunRecord, Usage
from gateway.models.request import StagedFile
from gateway.sandbox.base import SandboxSpec
from tests.fake_backend import START_CPU_MS, FakeBackend, FakeSandbox
from tests.fake_kernel import script
from tests.test_executor_fast import Harness, harness, notebook, run, single

pytestmark = pytest.mark.fast

PER_REQUEST = 10  # the fake kernel's CPU per request
OK = script(["stdout", "a\n"])


async def execute(
    h: Harness, execution: Execution, files: tuple[StagedFile, ...] = ()
) -> list[RunEvent]:
    """Run `execution` as the service does; the events it published."""
    events: list[RunEvent] = []
    execution.events.subscribe(events.append)
    execution.record.start()
    try:
        async with contextlib.AsyncExitStack() as kernels:
            session = await kernels.enter_async_context(
                h.pools.kernel(execution.spec, execution.cancel)
            )
            if execution.program.keep_cells:

                async def advance(_: KernelSession, __: int) -> KernelSession:
                    return await kernels.enter_async_context(
                        h.pools.kernel(execution.spec, execution.cancel)
                    )

                execution.advance = advance
            await execution.run(session, files)
    finally:
        await h.pools.destroyed()
    return events


def new_execution(h: Harness, program: Any) -> Execution:
    record = RunRecord(id=new_run_id(), language=program.language, user="fast")
    return Execution(program, record, h.config, asyncio.Event())


def test_each_cell_gets_its_own_cpu_and_the_gateways_code_is_the_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            program = notebook((OK, []), (OK, ["skip-execution"]), (OK, []), vars={"n": 1})
            cells = program.notebook["cells"]
            for cell in cells:  # another run's figures, in a replayed notebook
                cell["metadata"]["gateway"] = {"cpu_ms": 99999, "duration_ms": 99999}
            execution = new_execution(h, program)
            events = await execute(h, execution)
        record = execution.record
        assert record.status == "succeeded"
        figures = [c["metadata"].get("gateway") for c in cells]
        assert [f and f["cpu_ms"] for f in figures] == [PER_REQUEST, None, PER_REQUEST]
        assert all(f is None or 0 <= f["duration_ms"] < 5000 for f in figures), figures
        finished = [e for e in events if isinstance(e, CellFinished)]
        assert [e.cpu_ms for e in finished] == [PER_REQUEST, PER_REQUEST]
        # the run's: its two cells and the request that set `vars`, not the kernel's start
        assert record.usage.cpu_ms == 3 * PER_REQUEST, record.usage
        # the record's notebook (GET .../notebook, a replay's answer) has them
        assert record.notebook is not None
        assert record.notebook["cells"][0]["metadata"]["gateway"]["cpu_ms"] == PER_REQUEST

    run(scenario)


def test_with_keep_cells_each_cell_counts_in_its_own_kernel_from_when_it_began(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            program = notebook((OK, []), (OK, []), (OK, []), keep_cells=True)
            execution = new_execution(h, program)
            await execute(h, execution)
        record = execution.record
        assert record.status == "succeeded"
        assert len(h.backend.sandboxes) == 3  # one kernel per cell
        spent = [c["metadata"]["gateway"]["cpu_ms"] for c in program.notebook["cells"]]
        assert spent == [PER_REQUEST] * 3
        # every kernel's start (500 ms each) is no cell's and not the run's
        assert record.usage.cpu_ms == 3 * PER_REQUEST < START_CPU_MS, record.usage

    run(scenario)


class StagingFails(FakeBackend):
    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = RefusesFiles(self, spec)
        self.sandboxes.append(sandbox)
        return sandbox


class RefusesFiles(FakeSandbox):
    async def stage_files(self, files: Any) -> None:
        await super().stage_files(files)
        raise InvalidPath("pipe is a folder, a FIFO or another special file.")


def test_a_run_whose_files_were_refused_says_what_its_sandbox_held(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, StagingFails()) as h:
            execution = new_execution(h, single(OK))
            with pytest.raises(InvalidPath):
                await execute(h, execution, (StagedFile("pipe", b"x"),))
        assert execution.record.usage == Usage(cpu_ms=0, peak_memory_bytes=64 << 20)

    run(scenario)


class Blind(FakeBackend):
    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = NoCpu(self, spec)
        self.sandboxes.append(sandbox)
        return sandbox


class NoCpu(FakeSandbox):
    async def usage(self) -> Usage:
        return Usage(cpu_ms=None, peak_memory_bytes=None)


def test_a_sandbox_that_cannot_tell_cpu_gives_no_figure(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, Blind()) as h:
            program = notebook((OK, []), (OK, []))
            execution = new_execution(h, program)
            events = await execute(h, execution)
        assert execution.record.usage.cpu_ms is None
        cells = program.notebook["cells"]
        assert [c["metadata"]["gateway"]["cpu_ms"] for c in cells] == [None, None]
        assert [e.cpu_ms for e in events if isinstance(e, CellFinished)] == [None, None]

    run(scenario)
