"""What metering costs (issue 34): the machine CPU the usage meter spends per run and per
replayed cell, on each backend.

Metering cannot be turned off (the record's `usage`, each cell's `metadata.gateway`, the
CPU quota all read it), so this times the meter's own work where it happens: every
`Sandbox.usage()` call of a real gateway's runs (the cgroup reads: the meter's whole
contact with the machine) is wrapped, in the gateway's process, and its CPU taken with the
calling thread's clock (`time.thread_time_ns`: the event loop's thread, where the reads run;
they do not suspend, so nothing else runs inside the span), its wall time too. The meter's
own arithmetic (`UsageMeter`, no reads) is timed apart, on a stand-in sandbox. Workloads:
`print(1)` runs (one cell) and replays of a notebook of `--cells` small code cells.

    .venv/bin/python bench/usage_cost.py [--runs 50] [--cells 20] [--backends forkserver,local]

A script, not a test: nothing is asserted. Results (JSON) also go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.execution.meter import UsageMeter  # noqa: E402
from gateway.models.record import Usage  # noqa: E402
from gateway.sandbox.base import Sandbox  # noqa: E402
from tests.support import Client, GatewayThread  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--backends", default="forkserver,docker,local")
    args = parser.parse_args()
    results = [measure(b, args.runs, args.cells) for b in args.backends.split(",")]
    arithmetic = meter_arithmetic()
    print("| backend | reads per run | CPU per run | per read | reads per cell | CPU per cell |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        run, cell = r["per_run"], r["per_cell"]
        print(
            f"| {r['backend']} | {run['reads']:.1f} | {run['cpu_us']:.0f} µs"
            f" | {run['cpu_us_per_read']:.1f} µs | {cell['reads']:.2f} | {cell['cpu_us']:.0f} µs |"
        )
    print(f"\nthe meter's arithmetic per run, no reads: {arithmetic:.1f} µs of CPU")
    medians = [r["per_run"]["cpu_us"] for r in results]
    print(f"median over backends: {statistics.median(medians):.0f} µs of CPU per run")
    out = REPO / "bench" / "results" / f"usage-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"results": results, "arithmetic_us": arithmetic}, indent=2))
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
