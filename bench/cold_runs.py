"""Cold-run benchmark: every run starts a fresh kernel in a fresh sandbox.

Measures, side by side in one process (median and percentiles of N runs each):
  - POST /v1/runs `print(1)` and a matplotlib chart, on the local and Docker backends;
  - POST /v1/runs `console.log(1)` in JavaScript (Deno's kernel behind kernels/deno/relay.py),
    and `print(1)` in R on the backends that run the kernel image (Docker, forkserver);
  - sandbox creation to kernel ready (`start_session`), per backend, for Python, Deno and R;
  - the peer: jupyter_client's stock KernelManager (start, wait_for_ready, execute
    `print(1)`, shutdown) for the same local ipykernel, the path DESIGN.md decision 2 avoids.
Ratios are against the local backend's `print(1)`. Results also go to bench/results/.

    .venv/bin/python bench/cold_runs.py [--runs 20] [--backends local,docker,forkserver]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.execution.session import start_session  # noqa: E402
from gateway.models.common import Language  # noqa: E402
from gateway.sandbox.base import SandboxSpec  # noqa: E402
from tests.support import GatewayThread  # noqa: E402

CHART = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('bench')"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered) * 1000,
        "p90_ms": pick(0.9) * 1000,
        "p99_ms": pick(0.99) * 1000,
        "min_ms": ordered[0] * 1000,
    }


def time_runs(
    server: GatewayThread, code: str, runs: int, language: Language = "python"
) -> list[float]:
    client = server.client()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        record = client.run(code=code, language=language)
        samples.append(time.perf_counter() - started)
        assert record["status"] == "succeeded", record
    return samples


def time_ready(server: GatewayThread, runs: int, language: Language = "python") -> list[float]:
    services, wire = server.gateway.services, server.gateway.wire
    assert services is not None and wire is not None

    config = services.runs.pools.config  # the execution layer's own (ExecutionConfig)

    async def once(i: int) -> float:
        spec = SandboxSpec(f"run_bench{i:04d}", language, config.limits())
        started = time.perf_counter()
        session = await start_session(services.backend, spec, config, wire)
        try:
            return time.perf_counter() - started
        finally:
            await session.close()

    return [server.call(once(i)) for i in range(runs)]


def time_stock_kernel_manager(runs: int) -> list[float]:
    from jupyter_client.manager import start_new_kernel

    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        manager, client = start_new_kernel(kernel_name="python3")
        try:
            client.execute_interactive("print(1)", timeout=30, output_hook=lambda msg: None)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=False)
        samples.append(time.perf_counter() - started)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backends", default="local,docker")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for backend in args.backends.split(","):
        server = GatewayThread(backend=backend).start()
        try:
            if server.backend_name != backend:
                print(f"skipping {backend}: the gateway chose {server.backend_name}")
                continue
            server.client().run(code="print(0)")  # warm the image / font cache once
            results[f"{backend} print(1)"] = percentiles(time_runs(server, "print(1)", args.runs))
            results[f"{backend} chart"] = percentiles(time_runs(server, CHART, args.runs))
            results[f"{backend} start-to-ready"] = percentiles(time_ready(server, args.runs))
            server.client().run(code="console.log(0)", language="javascript")
            results[f"{backend} javascript console.log(1)"] = percentiles(
                time_runs(server, "console.log(1)", args.runs, "javascript")
            )
            results[f"{backend} deno start-to-ready"] = percentiles(
                time_ready(server, args.runs, "javascript")
            )
            if backend != "local":  # R is in the kernel image, not on this machine
                server.client().run(code="print(0)", language="r")
                results[f"{backend} r print(1)"] = percentiles(
                    time_runs(server, "print(1)", args.runs, "r")
                )
                results[f"{backend} r start-to-ready"] = percentiles(
                    time_ready(server, args.runs, "r")
                )
        finally:
            server.stop()
    results["peer: jupyter_client KernelManager print(1)"] = percentiles(
        time_stock_kernel_manager(args.runs)
    )
    base = results.get("local print(1)", {}).get("p50_ms")
    print(f"{'measurement':44} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'ratio':>7}")
    for name, row in results.items():
        ratio = f"{row['p50_ms'] / base:.2f}x" if base else "-"
        print(
            f"{name:44} {row['p50_ms']:8.0f} {row['p90_ms']:8.0f} {row['p99_ms']:8.0f} {ratio:>7}"
        )
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    (out / f"cold_runs-{stamp}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
