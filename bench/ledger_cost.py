"""What counting a run in the usage ledger costs (issue 34): every run adds its CPU, itself
and its peak memory to its user's minute (`RecordStore.spend`, at the run's end), and a run
of a user with a CPU budget also once per tick (answered with the user's windows). Timed on
the SQLite store (one gateway), the machine's CPU for the whole process (the event loop and
the store's thread), over `--calls` calls, and the admission check of a budgeted user
(`Quotas.admit`: a day of minute rows read and summed) over as many.

    .venv/bin/python bench/ledger_cost.py [--calls 2000]

A script, not a test: nothing is asserted. Results (JSON) also go to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.budget import CpuBudget  # noqa: E402
from gateway.runs.quotas import DAY, HOUR, Quotas, minute_of  # noqa: E402
from gateway.store.sqlite import SQLiteStore  # noqa: E402


async def measure(calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteStore(Path(folder) / "runs.db")
        await store.open()
        try:
            minute = minute_of(time.time())
            # a day of a busy user's use: a row each minute
            for back in range(DAY):
                await store.spend("busy", minute - back, 100, ())
            found: dict[str, float] = {}
            started = time.process_time()
            for i in range(calls):  # a run's end: its rest, itself, its peak
                await store.spend(f"u{i % 50}", minute, 120, (), runs=1, peak_memory_bytes=10**8)
            found["end_of_run_us"] = (time.process_time() - started) / calls * 1e6
            started = time.process_time()
            for _ in range(calls):  # a tick of a budgeted user: answered with both windows
                await store.spend("busy", minute, 25, (HOUR, DAY))
            found["tick_us"] = (time.process_time() - started) / calls * 1e6
            quotas = Quotas(store, CpuBudget(cpu_seconds_per_hour=10**6, cpu_seconds_per_day=10**7))
            started = time.process_time()
            for _ in range(calls):  # admitted: a day of rows read and summed
                await quotas.admit("busy")
            found["admission_us"] = (time.process_time() - started) / calls * 1e6
            return found
        finally:
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    found = asyncio.run(measure(args.calls))
    print(json.dumps(found, indent=1))
    out = REPO / "bench" / "results" / f"ledger_cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
