"""What the run store adds to each run (issue 13): the store calls on a run's path —
`admit` (before the answer or the 202), `update` (when it takes a slot), `finish` with the
user's quota (before the final answer) and one `get` (a poll) — timed per run, on SQLite
and on PostgreSQL (a local server started by `.ci/postgres-up.sh` in a temporary folder,
or `--dsn`). A script, not a test: timings are never asserted.

    .venv/bin/python bench/store_cost.py --runs 500
    .venv/bin/python bench/store_cost.py --dsn postgresql://...   # an existing database
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gateway.budget import Quota
from gateway.models.record import RunRecord
from gateway.store.base import RecordStore
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
QUOTA = Quota(count=1000, bytes=1 << 30)


async def one_run(store: RecordStore, index: int) -> float:
    record = RunRecord(id=f"run_{secrets.token_hex(16)}", language="python", user="bench")
    record.code = "print(1)"
    started = time.perf_counter()
    assert await store.admit(record, limit=8) is None
    record.status = "running"
    await store.update(record)
    record.status = "succeeded"
    record.stdout = "1\n"
    await store.finish(record, QUOTA)
    await store.get(record.id)
    return (time.perf_counter() - started) * 1000


async def measure(store: RecordStore, runs: int) -> list[float]:
    await store.open()
    try:
        for i in range(20):  # warm up: connections, caches
            await one_run(store, i)
        return [await one_run(store, i) for i in range(runs)]
    finally:
        await store.close()


def report(name: str, times: list[float]) -> None:
    times.sort()
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    print(
        f"{name:12} p50 {statistics.median(times):6.2f} ms  p90 {p(0.9):6.2f} ms  "
        f"p99 {p(0.99):6.2f} ms  ({len(times)} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--dsn", help="an existing PostgreSQL database (default: start one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        report("sqlite", asyncio.run(measure(SQLiteStore(Path(tmp) / "runs.sqlite3"), args.runs)))
        dsn, state = args.dsn, None
        if dsn is None:
            state = tempfile.mkdtemp(prefix="gateway-pg-bench-")
            env = {**os.environ, "GATEWAY_POSTGRES_DIR": state}
            up = subprocess.run(
                [str(REPO / ".ci/postgres-up.sh")], env=env, capture_output=True, text=True
            )
            if up.returncode != 0:
                raise SystemExit(f"postgres-up.sh failed: {up.stderr[-2000:]}")
            dsn = up.stdout.strip().splitlines()[-1]
        try:
            report("postgresql", asyncio.run(measure(PostgresStore(dsn, "bench"), args.runs)))
        finally:
            if state is not None:
                subprocess.run([str(REPO / ".ci/postgres-down.sh")], env=env, capture_output=True)
                subprocess.run(["rm", "-rf", state])


if __name__ == "__main__":
    main()
