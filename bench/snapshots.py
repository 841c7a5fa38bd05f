"""Snapshots benchmark (issue 32): continuing from a kept kernel state, against starting
from nothing, side by side in one run on one forkserver gateway.

Measures (median and percentiles of N runs each):
  - `print(x)` from a kept snapshot (one after another: each takes the continuation made
    ahead for it, `gateway.runs.snapshots`), and the same run from nothing (a pooled
    kernel, as every steady run gets one);
  - machine CPU per continued run (/proc/stat over the batch, all cores);
  - `keep` added to a run: the same run with and without it;
  - each in steady use (one run every 0.25 s, as a user or an agent sends them) and, for
    `print(x)`, back to back (the continuation made ahead is then not ready yet);
  - continuing from a state holding a 1 GiB NumPy array, against re-running the load;
  - 20 branches of that state at once: the memory each one's cgroup charged (what it
    copied), summed, against the snapshot's own.
Results also go to bench/results/.

    .venv/bin/python bench/snapshots.py [--runs 30] [--big-mib 1024] [--branches 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.cold_runs import percentiles  # noqa: E402
from tests.support import Client, GatewayThread  # noqa: E402

# a state that takes a while to make: a 1 GiB array of random numbers (a stand-in for a
# large file loaded and parsed)
BIG = "import numpy as np\nbig = np.random.default_rng(0).random(({mib} << 20) // 8)"


def machine_cpu_ms() -> float:
    """CPU time of the whole machine so far (every core, /proc/stat), in ms."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    return busy * 1000 / os.sysconf("SC_CLK_TCK")


STEADY_GAP = 0.25  # s between runs in steady use (as bench/vs_kernel_gateway.py's)


def timed(client: Client, runs: int, gap: float = 0.0, **body: Any) -> list[float]:
    samples = []
    for _ in range(runs):
        time.sleep(gap)
        started = time.perf_counter()
        record = client.run(**body)
        samples.append(time.perf_counter() - started)
        assert record["status"] == "succeeded", record
    return samples


def keep(client: Client, code: str, timeout: float = 120) -> str:
    record = client.run(code=code, keep=True, timeout=timeout)
    assert record["status"] == "succeeded" and record["snapshot"], record
    return str(record["snapshot"]["id"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--branches", type=int, default=20)
    args = parser.parse_args()
    big_memory = (args.big_mib + 768) << 20
    results: dict[str, Any] = {"runs": args.runs}
    server = GatewayThread(
        backend="forkserver",
        pool_python=2,
        memory_bytes=big_memory,
        snapshot_bytes_per_user=(args.big_mib + 1024) << 20,
        max_concurrent_runs=args.branches,
        max_runs_per_user=args.branches + 2,
        max_running_per_user=args.branches,
        max_timeout=600,
    ).start()
    try:
        client = server.client()
        timed(client, 3, code="print(1)")  # warm: the parents, the pool
        small = keep(client, "x = 41")
        timed(client, 3, code="print(x)", **{"from": small})
        results["print_from_snapshot_steady"] = percentiles(
            timed(client, args.runs, STEADY_GAP, code="print(x)", **{"from": small})
        )
        results["print_from_nothing_steady"] = percentiles(
            timed(client, args.runs, STEADY_GAP, code="x = 41\nprint(x)")
        )
        results["print_from_snapshot_back_to_back"] = percentiles(
            timed(client, args.runs, code="print(x)", **{"from": small})
        )
        before = machine_cpu_ms()
        timed(client, args.runs, code="print(x)", **{"from": small})
        results["cpu_ms_per_continued_run"] = (machine_cpu_ms() - before) / args.runs
        results["print_from_nothing_back_to_back"] = percentiles(
            timed(client, args.runs, code="x = 41\nprint(x)")
        )
        without = timed(client, args.runs, STEADY_GAP, code="x = 41", **{"from": small})
        with_keep = []
        for _ in range(args.runs):
            time.sleep(STEADY_GAP)
            started = time.perf_counter()
            record = client.run(code="x = 41", keep=True, **{"from": small})
            with_keep.append(time.perf_counter() - started)
            assert record["snapshot"], record
            client.request("DELETE", f"/v1/snapshots/{record['snapshot']['id']}")
        results["continued_run"] = percentiles(without)
        results["continued_run_with_keep"] = percentiles(with_keep)

        load = BIG.format(mib=args.big_mib)
        results["load_from_nothing"] = percentiles(timed(client, 3, code=load, timeout=300))
        big = keep(client, load, timeout=300)
        listed = client.request("GET", "/v1/snapshots").json()["snapshots"]
        results["big_snapshot_bytes"] = next(s["bytes"] for s in listed if s["id"] == big)
        results["continue_from_big_steady"] = percentiles(
            timed(client, args.runs, STEADY_GAP, code="print(big[:512].sum())", **{"from": big})
        )
        # branches at once, each touching a little of the array and holding on a moment
        branch = "big[:1024] += 1\nimport time\ntime.sleep(3)\nprint(big[:4])"
        with concurrent.futures.ThreadPoolExecutor(args.branches) as pool:
            records = list(
                pool.map(
                    lambda _: client.run(code=branch, timeout=120, **{"from": big}),
                    range(args.branches),
                )
            )
        assert all(r["status"] == "succeeded" for r in records), [r["status"] for r in records]
        peaks = [int(r["usage"]["peak_memory_bytes"] or 0) for r in records]
        results["branches"] = {
            "n": args.branches,
            "charged_bytes_sum": sum(peaks),
            "charged_bytes_max": max(peaks),
        }
    finally:
        server.stop()
    print(json.dumps(results, indent=2))
    out = REPO / "bench" / "results" / f"snapshots-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
