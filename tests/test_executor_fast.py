"""The executor and the run service against the fake backend (fake_backend.py): a scripted
kernel over real libzmq sockets, no sandbox, no process. The whole file runs in seconds,
beside the real-kernel suite, which stays the judge of real kernels and sandboxes.

What it holds the execution layer to, with expected values from docs/API.md: a run's
status as it goes (queued, running, final), the deadline (interrupt, then kill), cancel,
the output limit, a kernel that dies or never replies, `result` read back, `return_files`
read back only once nothing runs, the sandbox's last steps in one order on every backend
(stop -> read back -> ... -> kill -> destroy), a pooled kernel that serves one run only,
and a notebook's cell stop rules (`allow_errors`, `raises-exception`, `skip-execution`,
`cell_timeout`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import settings as settings_module
from gateway.budget import ByteBudget
from gateway.execution.config import ExecutionConfig
from gateway.execution.executor import Execution
from gateway.execution.kernel import Wire
from gateway.execution.pool import Pools
from gateway.execution.program import Program, from_notebook, from_run
from gateway.execution.session import StartCancelled
from gateway.metrics import Metrics
from gateway.models.common import new_run_id
from gateway.models.record import RunRecord
from gateway.models.request import NotebookRequest, RunRequest, StagedFile
from gateway.runs.config import RunServiceConfig
from gateway.runs.service import RunService
from gateway.sandbox.base import SandboxSpec
from gateway.store.config import StoreConfig
from gateway.store.factory import make_store
from tests.api import code_notebook
from tests.fake_backend import START_CPU_MS, FakeBackend, FakeSandbox
from tests.fake_kernel import script
from tests.support import part_config

pytestmark = pytest.mark.fast

MiB = 1024 * 1024
SCENARIO_TIMEOUT = 20.0  # a scenario that hangs fails instead of waiting for pytest's timeout


def make_settings(tmp_path: Path, **overrides: Any) -> settings_module.Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "pool_python": 0,
        "pool_bash": 0,
        "pool_deno": 0,
        "interrupt_grace": 0.2,
        "kernel_start_timeout": 5.0,
        **overrides,
    }
    return settings_module.Settings(**values)


class Harness:
    """One fake backend, the real pools and wire."""

    def __init__(self, settings: settings_module.Settings, backend: FakeBackend) -> None:
        self.config = part_config(ExecutionConfig, settings)
        self.backend = backend
        self.wire = Wire(max_message_bytes=8 * MiB, budget=ByteBudget("kernel messages", 64 * MiB))
        sizes = {"ipykernel": settings.pool_python}
        self.pools = Pools(self.config, backend, self.wire, Metrics(), sizes=sizes)

    async def execute(
        self, program: Program, cancel: asyncio.Event | None = None
    ) -> tuple[RunRecord, FakeSandbox]:
        """Run a program to its final record, its sandbox's teardown included (as the run
        service does: the record started, the end steps once it is final)."""
        record = RunRecord(id=new_run_id(), language=program.language, user="fast")
        record.start()
        created = len(self.backend.sandboxes)
        cancel = cancel if cancel is not None else asyncio.Event()
        execution = Execution(program, record, self.config, cancel)
        try:
            async with self.pools.kernel(execution.spec, cancel) as session:
                await execution.run(session, program.files)
        except StartCancelled:
            execution.cancelled_before_start()
        finally:
            await self.pools.destroyed()
        used = [s for s in self.backend.sandboxes if s.calls.count("stage_files")]
        return record, (used or self.backend.sandboxes[created:])[-1]


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path, backend: FakeBackend | None = None, **overrides: Any
) -> AsyncIterator[Harness]:
    """A harness whose pools are closed on the way out, and that fails a scenario that left
    a sandbox undestroyed."""
    fake = backend if backend is not None else FakeBackend()
    made = Harness(make_settings(tmp_path, **overrides), fake)
    try:
        yield made
    finally:
        await made.pools.close()  # and every sandbox still being destroyed
    assert not fake.live, [s.calls for s in fake.live]
    left = await asyncio.to_thread(lambda: [s.root for s in fake.sandboxes if s.root.exists()])
    assert not left, left


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), SCENARIO_TIMEOUT)

    asyncio.run(bounded())


def single(code: str, **fields: Any) -> Program:
    return from_run(RunRequest(language="python", code=code, **fields))


def notebook(*cells: tuple[str, list[str]], **fields: Any) -> Program:
    """A replay of code cells given as (source, tags)."""
    nb = code_notebook(*cells)
    return from_notebook(NotebookRequest(notebook=nb, language="python", **fields))


def tail(calls: list[str], after: str) -> list[str]:
    """The calls after the last `after`."""
    index = len(calls) - 1 - calls[::-1].index(after)
    return calls[index + 1 :]


# --- one run ------------------------------------------------------------------------------


def test_a_run_returns_its_output_value_and_result(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            code = script(
                ["stdout", "hello\n"],
                ["stderr", "careful\n"],
                ["execute_result", {"text/plain": "42"}],
                ["result", {"answer": [4, 2]}],
            )
            record, sandbox = await h.execute(single(code))
        assert record.status == "succeeded" and record.exit_code == 0
        assert record.stdout == "hello\n" and record.stderr == "careful\n"
        assert record.output == "hello\ncareful\n"
        assert record.result == {"answer": [4, 2]}
        kinds = [o["output_type"] for o in record.outputs]
        assert kinds == ["stream", "stream", "execute_result"]
        # the kernel's start is not the run's CPU (API.md, `usage`)
        assert record.usage.cpu_ms is not None and 0 <= record.usage.cpu_ms < START_CPU_MS
        assert sandbox.executed[-1] == code

    run(scenario)


def test_a_failing_run_keeps_its_error_and_still_returns_result(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            code = script(["result", 7], ["error", "ValueError", "boom"])
            record, _ = await h.execute(single(code))
        assert record.status == "failed" and record.exit_code == 1
        assert record.error is not None and record.error["ename"] == "ValueError"
        assert record.result == 7  # read with a request of its own after the failure

    run(scenario)


@pytest.mark.parametrize(
    ("step", "says"),
    [
        (["result_error", "Object of type set is not JSON serializable"], "not JSON-serialisable"),
        (["result", "x" * 500], "over the limit of 100 bytes"),
    ],
)
def test_a_result_that_cannot_be_returned_is_null_with_a_note(
    tmp_path: Path, step: list[Any], says: str
) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, result_cap_bytes=100) as h:
            record, _ = await h.execute(single(script(step)))
        assert record.status == "succeeded" and record.result is None
        assert record.result_note is not None and says in record.result_note

    run(scenario)


def test_the_deadline_interrupts_and_keeps_what_came_before(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            code = script(["stdout", "before\n"], ["wait", "never"], ["stdout", "after\n"])
            record, sandbox = await h.execute(single(code, timeout=0.5))
        assert record.status == "timed_out" and record.kill_reason == "timeout"
        assert record.timed_out and record.exit_code is None
        assert record.stdout == "before\n"
        assert sandbox.kernel is not None and sandbox.kernel.interrupts == 1  # interrupted first
        assert tail(sandbox.calls, "limit_events")[-2:] == ["kill", "destroy"]

    run(scenario)


def test_code_that_ignores_the_interrupt_is_killed_at_the_deadline(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            record, sandbox = await h.execute(single(script(["hang"]), timeout=0.5))
        assert record.status == "timed_out" and record.kill_reason == "timeout"
        assert sandbox.killed and sandbox.kernel is not None and not sandbox.kernel.alive

    run(scenario)


def test_a_reply_that_never_comes_ends_at_the_deadline(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            code = script(["stdout", "partial\n"], ["no_reply"])
            record, _ = await h.execute(single(code, timeout=0.5))
        assert record.status == "timed_out" and record.stdout == "partial\n"

    run(scenario)


def test_cancel_ends_a_running_cell(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            cancel = asyncio.Event()
            code = script(["stdout", "started\n"], ["mark", "started"], ["wait", "never"])
            running = asyncio.ensure_future(h.execute(single(code), cancel=cancel))
            await h.backend.signals.mark("started").wait()
            cancel.set()
            record, sandbox = await running
        assert record.status == "cancelled" and record.kill_reason == "cancelled"
        assert record.exit_code is None
        assert sandbox.calls[-2:] == ["kill", "destroy"]

    run(scenario)


def test_output_past_the_limit_kills_the_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, output_limit_bytes=64 * 1024) as h:
            record, _ = await h.execute(single(script(["flood", 4 * MiB])))
        assert record.status == "killed" and record.kill_reason == "output_limit"
        assert len(record.stdout) <= 64 * 1024

    run(scenario)


def test_a_kernel_that_dies_mid_cell_fails_the_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            record, sandbox = await h.execute(single(script(["die", 3])))
        assert record.status == "failed" and record.exit_code == 3
        assert any("died unexpectedly" in note for note in record.notes), record.notes
        assert "death" in sandbox.calls

    run(scenario)


def test_a_kernel_killed_by_its_memory_limit_is_a_memory_kill(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            record, _ = await h.execute(single(script(["die", 137, "memory"])))
        assert record.status == "killed" and record.kill_reason == "memory"

    run(scenario)


def test_vars_and_env_are_set_before_the_code(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            code = script(["stdout", "x\n"])
            record, sandbox = await h.execute(single(code, vars={"n": 1}, env={"A": "b"}))
        assert record.status == "succeeded"
        assert sandbox.executed[-1] == code and len(sandbox.executed) == 2  # setup, then code

    run(scenario)


# --- the sandbox's last steps -------------------------------------------------------------


@pytest.mark.parametrize("can_freeze", [True, False], ids=["freezes", "cannot-freeze"])
def test_return_files_are_read_once_nothing_runs_then_kill_then_destroy(
    tmp_path: Path, can_freeze: bool
) -> None:
    """With return_files: stop (freeze, else kill) -> read back -> usage, limits -> kill ->
    destroy, on every backend; the fake refuses a read back while its kernel runs."""

    async def scenario() -> None:
        async with harness(tmp_path, FakeBackend(can_freeze=can_freeze)) as h:
            files = (StagedFile("data/in.txt", b"staged\n"),)
            program = single(script(["stdout", "ok\n"]), files=files, return_files=("data/*",))
            record, sandbox = await h.execute(program)
        assert record.status == "succeeded"
        assert [(f["path"], f["content"]) for f in record.files] == [("data/in.txt", "staged\n")]
        stop = ["freeze"] if can_freeze else ["freeze", "kill"]
        end = ["read_files", "usage", "limit_events", "kill", "destroy"]
        assert tail(sandbox.calls, "stage_files")[-len(stop) - len(end) :] == stop + end
        assert sandbox.calls.count("destroy") == 1

    run(scenario)


def test_without_return_files_the_sandbox_is_only_killed_and_destroyed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            record, sandbox = await h.execute(single(script(["stdout", "ok\n"])))
        assert record.status == "succeeded"
        assert tail(sandbox.calls, "stage_files") == [
            "usage",  # the run's CPU counts from here (and the cell's: no setup code)
            "usage",  # after the cell: its own CPU
            "usage",
            "limit_events",
            "kill",
            "destroy",
        ]

    run(scenario)


# --- pools ----------------------------------------------------------------------------------


async def fill_pool(h: Harness) -> FakeSandbox:
    """One pooled kernel, started as the refiller would (which these tests do not run)."""
    await h.pools.pools["ipykernel"].fill_one()
    sandbox = h.backend.sandboxes[-1]
    assert h.pools.ready == 1 and not sandbox.destroyed
    return sandbox


def test_a_pooled_kernel_serves_one_run_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, pool_python=1) as h:
            pooled = await fill_pool(h)
            first, first_box = await h.execute(single(script(["stdout", "1\n"])))
            again = await fill_pool(h)
            second, second_box = await h.execute(single(script(["stdout", "2\n"])))
        assert first.status == second.status == "succeeded"
        assert first_box is pooled and second_box is again
        assert first_box.destroyed and second_box.destroyed
        assert [c for c in first_box.executed if c.startswith("[")] == [script(["stdout", "1\n"])]

    run(scenario)


@pytest.mark.parametrize("can_lower", [True, False], ids=["lowers", "cannot-lower"])
def test_a_run_asking_for_less_memory_takes_a_pooled_kernel_only_if_it_can_be_lowered(
    tmp_path: Path, can_lower: bool
) -> None:
    async def scenario() -> None:
        backend = FakeBackend(can_lower_memory=can_lower)
        async with harness(tmp_path, backend, pool_python=1) as h:
            pooled = await fill_pool(h)
            record, used = await h.execute(single(script(["stdout", "x\n"]), memory_bytes=64 * MiB))
        assert record.status == "succeeded"
        assert "set_memory_limit" in pooled.calls
        if can_lower:
            assert used is pooled and used.memory_bytes == 64 * MiB
        else:  # the capability's default: a kernel of its own, started with the lower limit
            assert used is not pooled and used.memory_bytes == 64 * MiB
            assert pooled.destroyed and "stage_files" not in pooled.calls

    run(scenario)


class FailingDestroy(FakeBackend):
    """The first sandbox's destruction fails (after it has ended its kernel)."""

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = (Failing if not self.sandboxes else FakeSandbox)(self, spec)
        self.sandboxes.append(sandbox)
        return sandbox


class Failing(FakeSandbox):
    async def destroy(self) -> None:
        await super().destroy()
        raise OSError("the sandbox could not be removed")


@pytest.mark.logs_errors
def test_closing_the_pools_destroys_every_idle_kernel_when_one_destruction_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing the pools destroys every idle kernel, however the destruction of one ends;
    the failure is logged, not raised: the gateway's stop goes on to the backend's, which
    stops the warm parents (a failure raised out of the close left them running)."""

    async def scenario() -> None:
        backend = FailingDestroy()
        h = Harness(make_settings(tmp_path, pool_python=2), backend)
        try:
            for _ in range(2):
                await h.pools.pools["ipykernel"].fill_one()
        finally:
            await h.pools.close()
        assert [s.destroyed for s in backend.sandboxes] == [True, True]
        assert not [s.root for s in backend.sandboxes if s.root.exists()]

    run(scenario)
    assert "a sandbox could not be destroyed" in caplog.text


# --- a notebook's stop rules --------------------------------------------------------------

OK = script(["stdout", "a\n"])
FAILS = script(["error", "RuntimeError", "cell 2"])
AFTER = script(["stdout", "c\n"])


def test_the_first_failing_cell_stops_the_notebook(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            record, sandbox = await h.execute(notebook((OK, []), (FAILS, []), (AFTER, [])))
        assert record.status == "failed" and record.error is not None
        assert AFTER not in sandbox.executed
        assert any("did not run" in note for note in record.notes), record.notes

    run(scenario)


@pytest.mark.parametrize(
    ("tags", "allow_errors", "status"),
    [(["raises-exception"], False, "succeeded"), ([], True, "failed")],
    ids=["raises-exception", "allow_errors"],
)
def test_an_expected_or_allowed_error_lets_the_cells_after_it_run(
    tmp_path: Path, tags: list[str], allow_errors: bool, status: str
) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            program = notebook((OK, []), (FAILS, tags), (AFTER, []), allow_errors=allow_errors)
            record, sandbox = await h.execute(program)
        assert record.status == status
        assert AFTER in sandbox.executed and record.stdout == "a\nc\n"

    run(scenario)


def test_a_cell_tagged_skip_execution_does_not_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            record, sandbox = await h.execute(notebook((OK, []), (FAILS, ["skip-execution"])))
        assert record.status == "succeeded" and FAILS not in sandbox.executed

    run(scenario)


def test_a_cell_over_cell_timeout_stops_the_notebook(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            slow = script(["wait", "never"])
            program = notebook((OK, []), (slow, []), (AFTER, []), timeout=30, cell_timeout=0.5)
            record, sandbox = await h.execute(program)
        assert record.status == "timed_out" and AFTER not in sandbox.executed
        assert any("cell_timeout (0.5 s)" in note for note in record.notes), record.notes

    run(scenario)


# --- the run service --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def service(tmp_path: Path, backend: FakeBackend) -> AsyncIterator[RunService]:
    settings = make_settings(tmp_path)
    store = make_store(part_config(StoreConfig, settings), "fast")
    await store.open()
    wire = Wire(max_message_bytes=8 * MiB, budget=ByteBudget("kernel messages", 64 * MiB))
    runs = RunService(part_config(RunServiceConfig, settings), backend, store, wire, Metrics())
    runs.start()
    try:
        yield runs
    finally:
        await runs.drain()
        await store.close()
    assert not backend.live


def test_a_run_is_queued_then_running_then_final_and_stored(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = FakeBackend()
        async with service(tmp_path, backend) as runs:
            code = script(["mark", "started"], ["wait", "go"], ["stdout", "done\n"])
            active = await runs.submit(RunRequest(language="python", code=code))
            assert active.record.status == "queued"
            await backend.signals.mark("started").wait()
            assert active.record.status == "running"
            running = await runs.store.get(active.record.id)
            assert running is not None and running.status == "running"
            backend.signals.gate("go").set()
            assert active.task is not None
            record = await active.task
            assert record.status == "succeeded" and record.stdout == "done\n"
            stored = await runs.store.get(record.id)
            assert stored is not None and stored.status == "succeeded"
            assert stored.stdout == "done\n"

    run(scenario)


def test_the_service_cancels_a_running_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        backend = FakeBackend()
        async with service(tmp_path, backend) as runs:
            code = script(["stdout", "started\n"], ["mark", "started"], ["wait", "never"])
            active = await runs.submit(RunRequest(language="python", code=code, user="u"))
            await backend.signals.mark("started").wait()
            record = await runs.cancel(active.record.id, "u", admin=False)
            assert record.status == "cancelled" and record.kill_reason == "cancelled"
            stored = await runs.store.get(record.id)
            assert stored is not None and stored.status == "cancelled"

    run(scenario)


def test_a_runs_events_tell_each_cell_as_it_starts_prints_and_finishes(tmp_path: Path) -> None:
    """What the WebSocket (and a notebook front end) hears of a replay, in order: a cell
    starts, its outputs, it finishes with its status; then the next. And a record said to
    be `running` already has the time it started."""

    async def scenario() -> None:
        backend = FakeBackend()
        async with service(tmp_path, backend) as runs:
            program = notebook((OK, []), (FAILS, []), (AFTER, []))
            request = NotebookRequest(notebook=program.notebook, language="python")
            active = await runs.submit_notebook(request)
            heard: list[Any] = []
            active.events.subscribe(heard.append)  # before the run's task starts
            assert active.task is not None
            record = await active.task
        assert record.status == "failed"
        kinds = [
            (type(event).__name__, event.index, getattr(event, "status", None)) for event in heard
        ]
        assert kinds == [
            ("CellStarted", 0, None),
            ("CellOutput", 0, None),
            ("CellFinished", 0, "ok"),
            ("CellStarted", 1, None),
            ("CellOutput", 1, None),
            ("CellFinished", 1, "error"),
        ], kinds
        first_output = heard[1].output
        assert first_output == {"output_type": "stream", "name": "stdout", "text": "a\n"}
        assert [event.cell_id for event in heard if hasattr(event, "cell_id")] == [
            "c0",
            "c0",
            "c1",
            "c1",
        ]
        assert [e.execution_count for e in heard if type(e).__name__ == "CellFinished"] == [1, 2]

    run(scenario)


def test_a_running_record_always_has_its_start_time(tmp_path: Path) -> None:
    """Status and start time move together (a client polling a background run once saw
    `running` with `started_at: null`)."""

    async def scenario() -> None:
        backend = FakeBackend()
        async with service(tmp_path, backend) as runs:
            code = script(["mark", "started"], ["wait", "go"])
            active = await runs.submit(RunRequest(language="python", code=code))
            seen: list[tuple[str, str | None]] = []
            while not backend.signals.mark("started").is_set():
                seen.append((active.record.status, active.record.started_at))
                await asyncio.sleep(0)
            backend.signals.gate("go").set()
            assert active.task is not None
            await active.task
        assert ("running", None) not in seen, seen
        assert any(status == "running" for status, _ in seen)

    run(scenario)
