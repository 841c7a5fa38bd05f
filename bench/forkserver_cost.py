"""Where a forked kernel's CPU goes: the gateway's own process, the forked kernels (their
pid 1 and kernel process, counted when the warm parent reaps them: the parent's children
CPU in /proc/PID/stat), the warm parent itself (each fork's page tables are copied on its
CPU) and the whole machine (/proc/stat: other tenants of the machine too), per `print(1)`
run (one client, `--gap` s between runs), with
the pools off (every run forks a kernel on its path) and on (the fork happens off it).

    .venv/bin/python bench/forkserver_cost.py [--runs 40] [--gap 0.25]

A script, not a test: timings are never asserted. Needs what the forkserver backend needs
(root, cgroups, bubblewrap, the kernel image).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import Client, GatewayThread  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(v) for i, v in enumerate(fields) if i not in (3, 4)) / TICK


def own_cpu() -> float:
    """This process: the gateway (in a thread here) and the client."""
    times = os.times()
    return times.user + times.system


def children_cpu(pid: int) -> float:
    """CPU of the children `pid` has reaped (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / TICK


def process_cpu(pid: int) -> float:
    """CPU of `pid` itself (utime + stime): the warm parent's forks are charged to it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def parent_pid(gateway: GatewayThread) -> int:
    services = gateway.gateway.services
    assert services is not None
    pid = services.backend.parents["ipykernel"].pid  # type: ignore[attr-defined]
    assert isinstance(pid, int)
    return pid


def measure(pooled: bool, runs: int, gap: float) -> dict[str, Any]:
    sizes = {} if pooled else {"pool_python": 0, "pool_bash": 0, "pool_deno": 0}
    gateway = GatewayThread(backend="forkserver", **sizes).start()
    try:
        client = Client(gateway.port)
        for _ in range(3):  # warm
            client.run(code="print(1)")
        time.sleep(2)
        parent = parent_pid(gateway)
        start = (own_cpu(), children_cpu(parent), process_cpu(parent), machine_cpu())
        latencies = []
        for _ in range(runs):
            began = time.perf_counter()
            record = client.run(code="print(1)")
            latencies.append(time.perf_counter() - began)
            assert record["status"] == "succeeded", record
            time.sleep(gap)
        time.sleep(2)  # the last kernels destroyed and reaped
        end = (own_cpu(), children_cpu(parent), process_cpu(parent), machine_cpu())
    finally:
        gateway.stop()
    latencies.sort()
    per_run = [(b - a) / runs * 1000 for a, b in zip(start, end, strict=True)]
    return {
        "pooled": pooled,
        "gateway_ms": per_run[0],
        "kernels_ms": per_run[1],
        "parent_ms": per_run[2],
        "machine_ms": per_run[3],
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.25)
    args = parser.parse_args()
    print(
        "| pools | gateway process | forked kernels | warm parent (its forks) | sum | "
        "whole machine | `print(1)` p50 | p99 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for pooled in (False, True):
        m = measure(pooled, args.runs, args.gap)
        ours = m["gateway_ms"] + m["kernels_ms"] + m["parent_ms"]
        print(
            f"| {'on' if pooled else 'off'} | {m['gateway_ms']:.0f} ms | {m['kernels_ms']:.0f} ms"
            f" | {m['parent_ms']:.0f} ms | {ours:.0f} ms | {m['machine_ms']:.0f} ms"
            f" | {m['p50_ms']:.0f} ms | {m['p99_ms']:.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
