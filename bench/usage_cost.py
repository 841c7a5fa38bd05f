"""What metering costs (issue 34): the machine CPU the usage meter spends per run and per
replayed cell, on each backend; and with `--budgets`, what a CPU budget adds to a run.

Metering cannot be turned off (the record's `usage`, each cell's `metadata.gateway`, the
CPU quota all read it), so this times the meter's own work where it happens: every
`Sandbox.usage()` call of a real gateway's runs (the cgroup reads: the meter's whole
contact with the machine) is wrapped, in the gateway's process, and its CPU taken with the
calling thread's clock (`time.thread_time_ns`: the event loop's thread, where the reads run;
they do not suspend, so nothing else runs inside the span), its wall time too. The meter's
own arithmetic (`UsageMeter`, no reads) is timed apart, on a stand-in sandbox. Workloads:
`print(1)` runs (one cell) and replays of a notebook of `--cells` small code cells.

`--budgets`: one gateway (forkserver, else local; the SQLite store) and two users, one
with a CPU budget (per hour and per day, never spent here) and one without, their runs
alternated: `print(1)` (over before the first tick), `time.sleep(1)` (ticks, few with CPU
to write) and a second of CPU (every tick writes). For each run, the gateway's CPU (the
process's clock less the client's threads'), to the answer and until the gateway settled
again; inside the 1 s runs, a window after the pool's refill (the steady cost per second
of a running run); the parts timed where they happen (readings, admissions, ticks, the
ledger's SQL, the run's end: its usage handed to the final record's store call); and the
ledger's calls made one by one on the idle gateway. An unbudgeted run's metering is its
readings and the ledger's share of its final record's store call (`finish` adds the run's
usage row in the same trip to the store's thread: no hop of its own).

    .venv/bin/python bench/usage_cost.py [--runs 50] [--cells 20] [--backends forkserver,local]
    .venv/bin/python bench/usage_cost.py --budgets [--budget-runs 15] [--control]  # 2 min

A script, not a test: nothing is asserted. Results (JSON) also go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.execution.meter import UsageMeter  # noqa: E402
from gateway.models.record import Usage  # noqa: E402
from gateway.runs.quotas import DAY, HOUR, TICK, CpuMeter, Quotas, minute_of  # noqa: E402
from gateway.sandbox.base import Sandbox  # noqa: E402
from gateway.sandbox.forkserver.backend import probe_forkserver  # noqa: E402
from gateway.store.base import UsageRow  # noqa: E402
from gateway.store.sqlite import SQLiteStore  # noqa: E402
from tests.support import DOCKER_IMAGE, Client, GatewayThread  # noqa: E402


@dataclasses.dataclass
class Calls:
    """The `usage()` calls seen: how many, their CPU and wall time (ns)."""

    count: int = 0
    cpu_ns: int = 0
    wall_ns: int = 0

    def since(self, before: Calls) -> Calls:
        return Calls(
            self.count - before.count, self.cpu_ns - before.cpu_ns, self.wall_ns - before.wall_ns
        )

    def plus(self, other: Calls) -> Calls:
        return Calls(
            self.count + other.count, self.cpu_ns + other.cpu_ns, self.wall_ns + other.wall_ns
        )


def instrument(cls: type[Sandbox], seen: Calls) -> Callable[[], None]:
    """Wrap `cls.usage` to count and time every call; returns the undo."""
    original: Callable[[Sandbox], Awaitable[Usage]] = cls.usage

    async def usage(self: Sandbox) -> Usage:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return await original(self)
        finally:
            seen.count += 1
            seen.cpu_ns += time.thread_time_ns() - cpu
            seen.wall_ns += time.perf_counter_ns() - wall

    setattr(cls, "usage", usage)  # noqa: B010 - the class's own method, swapped for a while

    def undo() -> None:
        setattr(cls, "usage", original)  # noqa: B010

    return undo


def notebook(cells: int) -> dict[str, Any]:
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {
                "cell_type": "code",
                "id": f"c{i}",
                "metadata": {},
                "source": f"x{i} = {i}",
                "outputs": [],
                "execution_count": None,
            }
            for i in range(cells)
        ],
    }


def per(calls: Calls, units: int) -> dict[str, float]:
    return {
        "reads": calls.count / units,
        "cpu_us": calls.cpu_ns / units / 1000,
        "wall_us": calls.wall_ns / units / 1000,
        "cpu_us_per_read": calls.cpu_ns / max(1, calls.count) / 1000,
    }


def measure(backend: str, runs: int, cells: int) -> dict[str, Any]:
    gateway = GatewayThread(backend=backend).start()
    seen = Calls()
    try:
        services = gateway.gateway.services
        assert services is not None
        client = Client(gateway.port)
        record = client.run(code="print(1)")  # a first run: its sandbox's class, and warm
        assert record["status"] == "succeeded", record
        sandbox_class = _sandbox_class(services.backend)
        undo = instrument(sandbox_class, seen)
        try:
            start = dataclasses.replace(seen)
            for _ in range(runs):
                record = client.run(code="print(1)")
                assert record["status"] == "succeeded", record
            single = seen.since(start)
            start = dataclasses.replace(seen)
            replays = max(1, runs // 5)
            for _ in range(replays):
                answer = client.request("POST", "/v1/notebooks/run", notebook(cells))
                assert answer.status == 200, answer.body[:300]
            replayed = seen.since(start)
        finally:
            undo()
    finally:
        gateway.stop()
    return {
        "backend": backend,
        "class": sandbox_class.__name__,
        "runs": runs,
        "per_run": per(single, runs),
        "replays": replays,
        "cells": cells,
        "per_replay": per(replayed, replays),
        "per_cell": per(replayed, replays * cells),
    }


def _sandbox_class(backend: Any) -> type[Sandbox]:
    """The class of the sandboxes `backend` makes (by its module's naming)."""
    module = sys.modules[type(backend).__module__]
    found = getattr(module, type(backend).__name__.replace("Backend", "Sandbox"))
    assert isinstance(found, type) and issubclass(found, Sandbox), found
    return found


class _Still(Sandbox):
    """A stand-in whose `usage()` costs nothing: the meter's own arithmetic alone."""

    async def usage(self) -> Usage:
        return Usage(cpu_ms=1, peak_memory_bytes=1)

    async def start(self) -> dict[str, Any]:
        raise NotImplementedError

    async def stage_files(self, files: Any) -> None:
        raise NotImplementedError

    async def read_files(self, patterns: Any, limits: Any) -> Any:
        raise NotImplementedError

    async def wait_exit(self) -> None:
        raise NotImplementedError

    def has_exited(self) -> bool:
        return False

    async def death(self) -> None:
        return None

    async def kill(self) -> None:
        return None

    async def destroy(self) -> None:
        return None


def meter_arithmetic(rounds: int = 20000) -> float:
    """CPU µs of one run's meter work (begin, a cell's two readings, total), no reads."""
    sandbox = _Still()

    async def once() -> None:
        meter = UsageMeter()
        await meter.begin(sandbox)
        await meter.cpu_now()
        await meter.read(sandbox)
        meter.total(await sandbox.usage())

    async def idle() -> None:  # the stand-in's own calls, taken out
        for _ in range(3):
            await sandbox.usage()

    async def loop(work: Callable[[], Awaitable[None]]) -> int:
        began = time.thread_time_ns()
        for _ in range(rounds):
            await work()
        return time.thread_time_ns() - began

    async def both() -> float:
        return (await loop(once) - await loop(idle)) / rounds / 1000

    return asyncio.run(both())


# --- a user with a CPU budget against one without -------------------------------------------

FREE, BUDGETED = "free-user-token-0001", "budgeted-user-token-1"  # users `free`, `budgeted`
# generous: never spent in a bench, both windows set (each tick sums both in SQL)
BUDGET = {"cpu_seconds_per_hour": 1e6, "cpu_seconds_per_day": 1e7}
# code; runs of each user, as a multiple of --budget-runs (short runs vary more); whether
# a steady window inside the run is measured too
WORKLOADS = {
    "print(1)": ("print(1)", 3, False),
    "sleep(1)": ("import time\ntime.sleep(1)", 1, True),
    # a second of CPU: every tick has CPU to write
    "busy(1)": (
        "import time\nend = time.process_time() + 1\nwhile time.process_time() < end:\n    pass",
        1,
        True,
    ),
}


@dataclasses.dataclass
class Seen:
    """What the instruments saw. `reads`: the sandbox readings (`Sandbox.usage`), the event
    loop's CPU. `admissions`, `ticks`: `Quotas.admit` and `CpuMeter.tick`, the process's CPU
    across each: the event loop's part, the hop to the store's thread and back and the SQL
    there (little else runs in the gateway meanwhile: the run's request alone, or a run
    that goes on); `writing_ticks`: the ticks with CPU to add (the others write nothing).
    `closes`: the run's end on the event loop (`CpuMeter.close`, which makes the usage row
    the final record's store call carries, and `counted`, Prometheus' counters), the loop's
    CPU. `*_sql`: the store thread's CPU in `SQLiteStore`'s functions: `_spend` (a tick's
    write and sums), `_spent` (admission), `_add_usage` inside `_finish` (`end_sql`: the
    ledger's share of the final record's store call, every run's) and `_finish` itself
    (`finish_sql`: that call's whole SQL, the record's upsert and quota check too)."""

    reads: Calls = dataclasses.field(default_factory=Calls)
    admissions: Calls = dataclasses.field(default_factory=Calls)
    ticks: Calls = dataclasses.field(default_factory=Calls)
    writing_ticks: Calls = dataclasses.field(default_factory=Calls)  # of `ticks`
    closes: Calls = dataclasses.field(default_factory=Calls)
    tick_sql: Calls = dataclasses.field(default_factory=Calls)
    admit_sql: Calls = dataclasses.field(default_factory=Calls)
    end_sql: Calls = dataclasses.field(default_factory=Calls)
    finish_sql: Calls = dataclasses.field(default_factory=Calls)

    def copy(self) -> Seen:
        return Seen(**{f.name: dataclasses.replace(getattr(self, f.name)) for f in _FIELDS})

    def since(self, before: Seen) -> Seen:
        return Seen(
            **{f.name: getattr(self, f.name).since(getattr(before, f.name)) for f in _FIELDS}
        )

    def plus(self, other: Seen) -> Seen:
        return Seen(**{f.name: getattr(self, f.name).plus(getattr(other, f.name)) for f in _FIELDS})


_FIELDS = dataclasses.fields(Seen)


def instrument_ledger(seen: Seen) -> Callable[[], None]:
    """Time `Quotas.admit` and `CpuMeter.tick` with the process's clock, `CpuMeter.close`
    and `counted` with the event loop's, and the SQLite store's ledger SQL (`_spend`,
    `_spent`, `_add_usage` and the final record's `_finish`: plain functions on the store's
    one thread) with that thread's; returns the undo."""
    admit, tick, close, counted = Quotas.admit, CpuMeter.tick, CpuMeter.close, CpuMeter.counted
    spend, spent = SQLiteStore._spend, SQLiteStore._spent
    add_usage, finish = SQLiteStore._add_usage, SQLiteStore._finish
    # `_spend` calls `_add_usage` and `_spent`: counted once, as the spend's
    inside = threading.local()

    async def timed_admit(self: Quotas, user: str) -> None:
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        try:
            await admit(self, user)
        finally:
            _add(seen.admissions, cpu, wall, time.process_time_ns)

    async def timed_tick(self: CpuMeter, spent_ms: int) -> str | None:
        writes = spent_ms > self.reported
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        try:
            return await tick(self, spent_ms)
        finally:
            also = seen.writing_ticks if writes else None
            _add(seen.ticks, cpu, wall, time.process_time_ns, also)

    def timed_close(self: CpuMeter, spent_ms: int | None, peak: int | None) -> UsageRow:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return close(self, spent_ms, peak)
        finally:
            _add(seen.closes, cpu, wall)

    def timed_counted(self: CpuMeter) -> None:  # the close's, not a call of its own
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            counted(self)
        finally:
            _add(seen.closes, cpu, wall, calls=0)

    def timed_spend(self: SQLiteStore, *args: Any) -> tuple[int, ...]:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        inside.on = True
        try:
            return spend(self, *args)
        finally:
            inside.on = False
            _add(seen.tick_sql, cpu, wall)

    def timed_add_usage(self: SQLiteStore, usage: UsageRow) -> None:
        if getattr(inside, "on", False):
            return add_usage(self, usage)
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return add_usage(self, usage)
        finally:
            _add(seen.end_sql, cpu, wall)

    def timed_finish(self: SQLiteStore, *args: Any) -> int:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return finish(self, *args)
        finally:
            _add(seen.finish_sql, cpu, wall)

    def timed_spent(self: SQLiteStore, user: str, minute: int, windows: Any) -> tuple[int, ...]:
        if getattr(inside, "on", False):
            return spent(self, user, minute, windows)
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return spent(self, user, minute, windows)
        finally:
            _add(seen.admit_sql, cpu, wall)

    swapped: list[tuple[type, str, Any, Any]] = [  # (class, name, instrumented, original)
        (Quotas, "admit", timed_admit, admit),
        (CpuMeter, "tick", timed_tick, tick),
        (CpuMeter, "close", timed_close, close),
        (CpuMeter, "counted", timed_counted, counted),
        (SQLiteStore, "_spend", timed_spend, spend),
        (SQLiteStore, "_spent", timed_spent, spent),
        (SQLiteStore, "_add_usage", timed_add_usage, add_usage),
        (SQLiteStore, "_finish", timed_finish, finish),
    ]
    for cls, name, new, _ in swapped:
        setattr(cls, name, new)

    def undo() -> None:
        for cls, name, _, old in swapped:
            setattr(cls, name, old)

    return undo


def _add(
    counts: Calls,
    cpu: int,
    wall: int,
    clock: Callable[[], int] = time.thread_time_ns,
    also: Calls | None = None,
    calls: int = 1,
) -> None:
    """Count a call begun at `cpu` (by `clock`) and `wall` in `counts`, and in `also`
    (`calls` 0: its time only, as part of the call counted before it)."""
    cpu_ns, wall_ns = clock() - cpu, time.perf_counter_ns() - wall
    for each in (counts, also):
        if each is not None:
            each.count += calls
            each.cpu_ns += cpu_ns
            each.wall_ns += wall_ns


def gateway_cpu_of_run(
    gateway: GatewayThread, client: Client, code: str, seen: Seen, middle: bool
) -> dict[str, float]:
    """The gateway's CPU (µs) for one run: from its request to its answer (`answer`: every
    step a budget adds is in it), and on until the gateway is settled again (`settled`: its
    sandbox destroyed, its pool refilled). The process's CPU clock (every thread: the
    gateway's loop, its store's, its executors') less the client's threads' (this one, and
    the one that waits for the answer); the gateway is settled before the request.

    With `middle`, also the CPU of a window while the run goes on (`middle`, its length in
    seconds and the ticks in it): from once the pool is refilled (at least `MIDDLE[0]` s
    after the request) to `MIDDLE[1]` s after it, the gateway's steady cost of a running
    run, without the refill's CPU and its variance."""
    settle(gateway)
    this_thread = time.pthread_getcpuclockid(threading.get_ident())
    process, own = time.process_time_ns(), time.clock_gettime_ns(this_thread)
    began = time.monotonic()
    asked: dict[str, Any] = {}
    asker_ns = [0]  # the CPU of the thread that asks, once it has its answer

    def gateway_us() -> float:  # from any thread
        client_ns = time.clock_gettime_ns(this_thread) - own + asker_ns[0]
        return (time.process_time_ns() - process - client_ns) / 1000

    def ask() -> None:
        mine = time.thread_time_ns()
        try:
            asked["record"] = client.run(code=code)
        finally:
            asker_ns[0] = time.thread_time_ns() - mine
            asked["answer"] = gateway_us()

    asker = threading.Thread(target=ask)
    asker.start()
    found: dict[str, float] = {}
    if middle:
        found |= steady_window(gateway, seen, began, gateway_us)
    asker.join()
    record = asked["record"]
    assert record["status"] == "succeeded", record
    settle(gateway)
    return found | {"answer": asked["answer"], "settled": gateway_us()}


MIDDLE = (0.3, 0.95)  # seconds after a 1 s run's request: a steady window inside it


def steady_window(
    gateway: GatewayThread, seen: Seen, began: float, gateway_us: Callable[[], float]
) -> dict[str, float]:
    """The gateway's CPU (µs) from once its pools are refilled (at least `MIDDLE[0]` s
    after `began`) to `MIDDLE[1]` s after it, while the run goes on; nothing when the pools
    were not refilled before then."""
    services = gateway.gateway.services
    assert services is not None
    start, end = began + MIDDLE[0], began + MIDDLE[1]
    while time.monotonic() < start or services.runs.pools.busy:
        if time.monotonic() > end - 0.1:
            return {}
        time.sleep(0.002)
    cpu, ticks, opened = gateway_us(), seen.ticks.count, time.monotonic()
    time.sleep(max(0.0, end - opened))
    return {
        "middle": gateway_us() - cpu,
        "middle_seconds": time.monotonic() - opened,
        "middle_ticks": seen.ticks.count - ticks,
    }


def settle(gateway: GatewayThread) -> None:
    deadline = time.monotonic() + 60
    while not gateway.idle():
        assert time.monotonic() < deadline, "the gateway did not settle"
        time.sleep(0.002)


def budget_cost(backend: str, runs: int, budget: dict[str, float]) -> dict[str, Any]:
    """Per workload, `runs` runs of each user, alternated (which goes first too), in one
    gateway on the SQLite store: the gateway's CPU of each, and what the instruments saw.
    User `budgeted` has `budget` (none: a control, the measurement's noise)."""
    folder = Path(tempfile.mkdtemp(prefix="usage-cost-"))
    tokens = folder / "tokens.json"
    tokens.write_text(
        json.dumps({FREE: {"user": "free"}, BUDGETED: {"user": "budgeted", **budget}})
    )
    gateway = GatewayThread(backend=backend, tokens=tokens).start()
    seen = Seen()
    found: dict[str, Any] = {"backend": backend, "budget": budget}
    load_before = os.getloadavg()
    try:
        services = gateway.gateway.services
        assert services is not None and isinstance(services.runs.store, SQLiteStore)
        clients = {FREE: Client(gateway.port, FREE), BUDGETED: Client(gateway.port, BUDGETED)}
        for client in clients.values():  # warm: the sandbox class, caches, the ledger's rows
            gateway_cpu_of_run(gateway, client, "print(1)", seen, middle=False)
        undo = [instrument(_sandbox_class(services.backend), seen.reads), instrument_ledger(seen)]
        try:
            for name, (code, times, middle) in WORKLOADS.items():
                found[name] = workload(gateway, clients, code, runs * times, seen, middle)
            found["idle_calls_us"] = idle_calls(gateway, clients[FREE], seen)
        finally:
            for each in undo:
                each()
    finally:
        gateway.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return found | {"load_average": [load_before, os.getloadavg()]}


# the final record's store call on the idle gateway, without and with a run's usage row
FINISH = "the final record's store call (`finish`), without usage"
FINISH_USAGE = "the same with the run's usage row"
SQL = ": its SQL alone (`_finish`, the store thread's CPU)"


def idle_calls(
    gateway: GatewayThread, client: Client, seen: Seen, rounds: int = 60, gap: float = 0.02
) -> dict[str, float]:
    """Each call of the ledger's, a bare hop to the store's thread, and a run's final
    record's store call with and without its usage row (a record of `client`'s run, stored
    again), made on the idle gateway's loop `rounds` times, `gap` seconds apart (its
    threads asleep between, as between a run's ticks): the gateway's CPU (µs, median) less
    an empty call's (the bench's own hop to the loop). For the final record's calls, also
    their SQL alone (`seen.finish_sql`, median): without the event loop's part and the
    wake-ups, whose noise is larger than the usage row's share."""
    services = gateway.gateway.services
    assert services is not None
    quotas, store = services.runs.quotas, services.runs.store
    assert isinstance(store, SQLiteStore)
    quota = services.runs.config.records_quota()
    answer = client.run(code="print(1)")
    assert answer["status"] == "succeeded", answer
    record = gateway.call(store.get(answer["id"]))
    assert record is not None
    this_thread = time.pthread_getcpuclockid(threading.get_ident())

    async def nothing() -> None:
        return None

    async def closed(user: str) -> None:  # a run's end on the loop: its usage row, counted
        meter = quotas.meter(user)
        meter.close(5, 10**8)
        meter.counted()

    async def watched(user: str) -> None:  # a run shorter than a tick: no tick, no execution
        async with services.runs._metered(cast(Any, None), quotas.meter(user)):
            await asyncio.sleep(0)  # the watcher's first step: its sleep until the tick

    def calls() -> dict[str, Callable[[], Awaitable[Any]]]:
        minute = minute_of(time.time())
        return {
            "empty": nothing,
            "a hop to the store's thread (nothing there)": lambda: store._call(lambda: None),
            "admission, free user": lambda: quotas.admit("free"),
            "admission, budgeted user": lambda: quotas.admit("budgeted"),
            "a run's tick watcher, free user (none)": lambda: watched("free"),
            "a run's tick watcher, budgeted user (cancelled before a tick)": lambda: watched(
                "budgeted"
            ),
            "a run's end on the loop (`CpuMeter.close`, `counted`)": lambda: closed("free"),
            FINISH: lambda: store.finish(record, quota),
            FINISH_USAGE: lambda: store.finish(
                record, quota, UsageRow("free", minute, 5, 1, 10**8)
            ),
            "ledger write of a tick": lambda: store.spend("budgeted", minute, 1, (HOUR, DAY)),
        }

    found: dict[str, list[float]] = {name: [] for name in calls()}
    sql: dict[str, list[float]] = {FINISH: [], FINISH_USAGE: []}
    for _ in range(rounds):
        for name, call in calls().items():
            time.sleep(gap)
            process, own = time.process_time_ns(), time.clock_gettime_ns(this_thread)
            store_ns = seen.finish_sql.cpu_ns
            gateway.call(call())
            client_ns = time.clock_gettime_ns(this_thread) - own
            found[name].append((time.process_time_ns() - process - client_ns) / 1000)
            if name in sql:
                sql[name].append((seen.finish_sql.cpu_ns - store_ns) / 1000)
    empty = statistics.median(found.pop("empty"))
    return {name: statistics.median(us) - empty for name, us in found.items()} | {
        name + SQL: statistics.median(us) for name, us in sql.items()
    }


def workload(
    gateway: GatewayThread,
    clients: dict[str, Client],
    code: str,
    runs: int,
    seen: Seen,
    middle: bool,
) -> dict[str, Any]:
    for token in clients:  # warm for this code
        gateway_cpu_of_run(gateway, clients[token], code, seen, middle)
    cpu: dict[str, list[dict[str, float]]] = {token: [] for token in clients}
    saw = {token: Seen() for token in clients}
    for i in range(runs):
        for token in (FREE, BUDGETED) if i % 2 == 0 else (BUDGETED, FREE):
            before = seen.copy()
            cpu[token].append(gateway_cpu_of_run(gateway, clients[token], code, seen, middle))
            saw[token] = saw[token].plus(seen.since(before))
    found: dict[str, Any] = {
        "runs": runs,
        "free": summary(cpu[FREE], saw[FREE], runs),
        "budgeted": summary(cpu[BUDGETED], saw[BUDGETED], runs),
    }
    for window in WINDOWS:
        paired = [b[window] - f[window] for f, b in zip(cpu[FREE], cpu[BUDGETED], strict=True)]
        found[f"budgeted_minus_free_{window}_us"] = {
            "median": statistics.median(paired),
            "mean": statistics.fmean(paired),
            "mean_ci95": 1.96 * statistics.stdev(paired) / len(paired) ** 0.5,
        }
    return found


WINDOWS = ("answer", "settled")  # see gateway_cpu_of_run


def summary(cpu_us: list[dict[str, float]], saw: Seen, runs: int) -> dict[str, Any]:
    """One user's runs of one workload: the gateway's CPU per run (µs: median, p90, mean),
    per second of the steady windows, and each instrument's calls per run and CPU each."""
    found: dict[str, Any] = {
        f"gateway_cpu_{w}_us": spread([run[w] for run in cpu_us]) for w in WINDOWS
    }
    windows = [run for run in cpu_us if "middle" in run]
    if windows:
        found["steady"] = {
            "windows": len(windows),
            "cpu_us_per_second": spread([w["middle"] / w["middle_seconds"] for w in windows]),
            "ticks_per_second": sum(w["middle_ticks"] for w in windows)
            / sum(w["middle_seconds"] for w in windows),
        }
    for field in _FIELDS:
        calls: Calls = getattr(saw, field.name)
        found[field.name] = {
            "per_run": calls.count / runs,
            "cpu_us_each": calls.cpu_ns / max(1, calls.count) / 1000,
        }
    return found | {"all_us": cpu_us}


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "p90": statistics.quantiles(values, n=10)[-1],
        "mean": statistics.fmean(values),
    }


def print_budgets(found: dict[str, Any]) -> None:
    load = found["load_average"]
    control = "" if found["budget"] else " (control: user `budgeted` has no budget)"
    print(
        f"\n{found['backend']}, SQLite{control}; each user's runs alternated with the other's;"
        f" load average {load[0][0]:.1f} before, {load[1][0]:.1f} after"
    )
    print("| run | user | runs | gateway CPU to the answer, p50 (p90) | to settled, p50 (p90) |")
    print("|---|---|---:|---:|---:|")
    for name in WORKLOADS:
        runs = found[name]["runs"]
        for user in USERS:
            answer, settled = (found[name][user][f"gateway_cpu_{w}_us"] for w in WINDOWS)
            print(
                f"| {name} | {user} | {runs} | {answer['median']:.0f} µs ({answer['p90']:.0f})"
                f" | {settled['median']:.0f} µs ({settled['p90']:.0f}) |"
            )
        answer, settled = (found[name][f"budgeted_minus_free_{w}_us"] for w in WINDOWS)
        print(
            f"| {name} | budgeted - free, paired: p50; mean ± 95 % | | {answer['median']:.0f};"
            f" {answer['mean']:.0f} ± {answer['mean_ci95']:.0f} µs | {settled['median']:.0f};"
            f" {settled['mean']:.0f} ± {settled['mean_ci95']:.0f} µs |"
        )
    print(f"\nwhile a run goes on ({MIDDLE[0]}-{MIDDLE[1]} s after its request, pools refilled):")
    print("| run | user | windows | gateway CPU per second, p50 (p90) | ticks per second |")
    print("|---|---|---:|---:|---:|")
    for name in STEADY:
        for user in USERS:
            steady = found[name][user]["steady"]
            cpu = steady["cpu_us_per_second"]
            print(
                f"| {name} | {user} | {steady['windows']} | {cpu['median']:.0f} µs"
                f" ({cpu['p90']:.0f}) | {steady['ticks_per_second']:.2f} |"
            )
    columns = [(w, user) for w in WORKLOADS for user in USERS]
    print(
        "\n| instrument: calls per run (CPU each) | "
        + " | ".join(f"{w}, {user}" for w, user in columns)
        + " |"
    )
    print("|---|" + "---:|" * len(columns))
    for field in _FIELDS:
        cells = (found[w][user][field.name] for w, user in columns)
        row = " | ".join(f"{c['per_run']:.2f} ({c['cpu_us_each']:.0f} µs)" for c in cells)
        print(f"| {field.name} | {row} |")
    idle = found["idle_calls_us"]
    print("\n| on the idle gateway, 20 ms apart | gateway CPU, p50 |\n|---|---:|")
    for name, us in idle.items():
        print(f"| {name} | {us:.0f} µs |")
    run = per_run(found)
    print(
        f"\nan unbudgeted print(1) run's metering: readings {run['reads_us']:.0f} µs"
        f" ({run['reads_per_run']:.1f} of {run['read_us']:.0f}), admission"
        f" {run['admit_us']:.0f} µs, its usage row in the final"
        f" record's store call {run['ledger_sql_us']:.0f} µs of SQL where it happens"
        f" ({run['ledger_idle_us']:.0f} µs on the idle gateway: `_finish` with it less without),"
        f" the close on the loop {run['close_us']:.0f} µs: {run['unbudgeted_us']:.0f} µs"
        f" ({run['unbudgeted_idle_us']:.0f} with the idle gateway's ledger share)"
    )
    print(
        f"what a budget adds to a run shorter than a tick (admission, watcher, from the idle"
        f" calls): {run['budget_extra_us']:.0f} µs; such a budgeted run's metering"
        f" {run['budgeted_short_us']:.0f} µs"
    )
    for name in STEADY:
        tick = per_tick(found, name)
        if tick["steady_us"] is None:
            print(f"\n{name}: no ticks; budgeted - free {tick['per_second_us']:.0f} µs a second")
            continue
        print(
            f"\na tick of {name} (every {TICK} s of a budgeted run): {tick['steady_us']:.0f} µs"
            f" of gateway CPU from the windows ({tick['per_second_us']:.0f} µs per second of"
            f" the run); from the instruments {tick['instruments_us']:.0f} µs (a reading"
            f" {tick['read_us']:.0f}, `CpuMeter.tick` {tick['tick_us']:.0f}; one that writes"
            f" {tick['writing_tick_us']:.0f}, of which its SQL {tick['sql_us']:.0f})"
        )


USERS = ("free", "budgeted")


def short_run_extra(idle: dict[str, float]) -> float:
    """What a budget adds to a run that ends before its first tick (µs): its admission's
    read of the ledger and its tick watcher, each over a free user's."""
    return sum(
        idle[f"{what}, budgeted user{detail}"] - idle[f"{what}, free user{none}"]
        for what, detail, none in (
            ("admission", "", ""),
            ("a run's tick watcher", " (cancelled before a tick)", " (none)"),
        )
    )


STEADY = [name for name, (_, _, middle) in WORKLOADS.items() if middle]


def per_run(found: dict[str, Any]) -> dict[str, float]:
    """The metering of a `print(1)` run (µs of gateway CPU), by its parts: a free user's
    readings (the instruments' calls per run times CPU each), its admission's look at the
    user's budget (none: no SQL), the ledger's share of its final record's store call
    (`_add_usage` inside `_finish`, where it happens; and on the idle gateway, `_finish`'s
    SQL with a usage row less without: what the row adds, where the first holds the call's
    cold start too, which the record's statement pays without the row) and its close on
    the event loop; then with a budget, shorter than a tick: that plus admission and the
    tick watcher over a free user's (`short_run_extra`)."""
    free = found["print(1)"]["free"]
    idle = found["idle_calls_us"]

    def total(part: str) -> float:
        return float(free[part]["per_run"] * free[part]["cpu_us_each"])

    reads, admit = total("reads"), total("admissions")
    ledger, close = total("end_sql"), total("closes")
    ledger_idle = idle[FINISH_USAGE + SQL] - idle[FINISH + SQL]
    unbudgeted = reads + admit + ledger + close
    extra = short_run_extra(idle)
    return {
        "reads_per_run": free["reads"]["per_run"],
        "read_us": free["reads"]["cpu_us_each"],
        "reads_us": reads,
        "admit_us": admit,
        "ledger_sql_us": ledger,
        "ledger_idle_us": ledger_idle,
        "close_us": close,
        "unbudgeted_us": unbudgeted,
        "unbudgeted_idle_us": reads + admit + ledger_idle + close,
        "budget_extra_us": extra,
        "budgeted_short_us": unbudgeted + extra,
    }


def per_tick(found: dict[str, Any], name: str) -> dict[str, float | None]:
    """A tick's gateway CPU in workload `name`: from the steady windows (what a second of
    the run costs a budgeted user over a free one, per tick in it), and the instruments'
    sum of its parts (a reading and `CpuMeter.tick`, as the workload's ticks averaged)."""
    free, budgeted = (found[name][user] for user in USERS)
    per_second = (
        budgeted["steady"]["cpu_us_per_second"]["median"]
        - free["steady"]["cpu_us_per_second"]["median"]
    )
    read, tick = budgeted["reads"]["cpu_us_each"], budgeted["ticks"]["cpu_us_each"]
    ticks_per_second = budgeted["steady"]["ticks_per_second"]
    return {
        "per_second_us": per_second,
        "steady_us": per_second / ticks_per_second if ticks_per_second else None,
        "instruments_us": read + tick,
        "read_us": read,
        "tick_us": tick,
        "writing_tick_us": budgeted["writing_ticks"]["cpu_us_each"],
        "sql_us": budgeted["tick_sql"]["cpu_us_each"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--backends", default="forkserver,docker,local")
    parser.add_argument(
        "--budgets", action="store_true", help="a user with a CPU budget against one without"
    )
    parser.add_argument(
        "--budget-runs", type=int, default=15, help="with --budgets: 1 s runs of each user"
    )
    parser.add_argument(
        "--control", action="store_true", help="with --budgets: neither user has a budget"
    )
    parser.add_argument(
        "--budget-backend", default="auto", help="with --budgets: auto is forkserver, else local"
    )
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.budgets:
        budget = {} if args.control else BUDGET
        budgets = budget_cost(budget_backend(args.budget_backend), args.budget_runs, budget)
        print_budgets(budgets)
        budgets["per_tick"] = {name: per_tick(budgets, name) for name in STEADY}
        budgets["per_run"] = per_run(budgets)
        write(f"usage-cost-budgets-{stamp}.json", budgets)
        return 0
    results = [measure(b, args.runs, args.cells) for b in args.backends.split(",")]
    arithmetic = meter_arithmetic()
    print_backends(results)
    print(f"\nthe meter's arithmetic per run, no reads: {arithmetic:.1f} µs of CPU")
    write(f"usage-cost-{stamp}.json", {"results": results, "arithmetic_us": arithmetic})
    return 0


def write(name: str, found: dict[str, Any]) -> None:
    out = REPO / "bench" / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(found, indent=2))
    print(f"\n{out}")


def budget_backend(asked: str) -> str:
    if asked != "auto":
        return asked
    usable, why = probe_forkserver(DOCKER_IMAGE)
    if not usable:
        print(f"forkserver unusable ({why}): the budgets on local", file=sys.stderr)
    return "forkserver" if usable else "local"


def print_backends(results: list[dict[str, Any]]) -> None:
    print("| backend | reads per run | CPU per run | per read | reads per cell | CPU per cell |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        run, cell = r["per_run"], r["per_cell"]
        print(
            f"| {r['backend']} | {run['reads']:.1f} | {run['cpu_us']:.0f} µs"
            f" | {run['cpu_us_per_read']:.1f} µs | {cell['reads']:.2f} | {cell['cpu_us']:.0f} µs |"
        )
    medians = [r["per_run"]["cpu_us"] for r in results]
    print(f"median over backends: {statistics.median(medians):.0f} µs of CPU per run")


if __name__ == "__main__":
    sys.exit(main())
