"""What a bigger kernel image costs (issue 23): size, cold start, an idle pooled kernel's
memory with the default preloads, and a chart's latency, per image (minimal against
datascience), on the Docker backend. Never a timed test: numbers for bench/README.md.

For each image: its size (`docker image inspect`), the packages it lists
(`GET /v1/environment`); cold runs (pools off) of `print(1)` in Python, and in R where the
image has it; then a gateway with a Python pool of one (default preloads): the idle pooled
kernel's memory (its container's cgroup: usage less inactive file pages, as `docker stats`
shows it, and the `rss` of memory.stat), a pooled `print(1)`, a pooled matplotlib chart, a
pooled plotly figure and a cold ggplot2 plot where the image has them, and an idle pooled
R kernel's memory. Each pooled run
waits for the pool to refill first, so every one takes a ready kernel. Medians of
`--runs` runs, client-observed wall time. Results (JSON) go to bench/results/.

    .venv/bin/python bench/image_costs.py gateway-kernel:minimal gateway-kernel:datascience
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import GatewayThread, wait_for  # noqa: E402

MiB = 1024 * 1024
CHART = (
    "import matplotlib.pyplot as plt\n"
    "plt.bar(['a', 'b', 'c'], [3, 5, 2])\nplt.title('votes')\nplt.show()"
)
PLOTLY = (
    "import plotly.express as px\npx.line(x=[1, 2, 3, 4], y=[2, 4, 3, 5], title='trend').show()"
)
GGPLOT = (
    "library(ggplot2)\n"
    "ggplot(data.frame(x = c('a', 'b', 'c'), y = c(3, 5, 2)), aes(x, y)) + geom_col()"
)
NO_POOLS = {"pool_python": 0, "pool_bash": 0, "pool_deno": 0, "pool_r": 0}


def timed(client: Any, runs: int, expect_charts: int = 0, **body: Any) -> dict[str, float]:
    walls, kernels = [], []
    for _ in range(runs):
        started = time.monotonic()
        record = client.run(**body)
        walls.append((time.monotonic() - started) * 1000)
        kernels.append(record["usage"]["wall_ms"])
        assert record["status"] == "succeeded", record
        assert len(record["charts"]) >= expect_charts, record["charts"]
    return {
        "wall_ms_p50": round(statistics.median(walls)),
        "wall_ms_min": round(min(walls)),
        "record_wall_ms_p50": round(statistics.median(kernels)),
    }


def container_memory(engine: docker.DockerClient, instance: str) -> dict[str, float]:
    """The idle pooled kernel's memory, from its container's cgroup (v1 or v2)."""
    (container,) = engine.containers.list(filters={"label": f"gateway.instance={instance}"})
    stats = container.stats(stream=False)["memory_stats"]
    detail = stats.get("stats", {})
    inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))
    return {
        "usage_mib": round((stats["usage"] - inactive) / MiB, 1),
        "rss_mib": round(detail.get("total_rss", detail.get("anon", 0)) / MiB, 1),
    }


def pooled_runs(gateway: GatewayThread, runs: int, **body: Any) -> dict[str, float]:
    client = gateway.client()
    walls = []
    for _ in range(runs):
        assert wait_for(lambda: _ready(gateway) == 1, timeout=120)
        started = time.monotonic()
        record = client.run(**body)
        walls.append((time.monotonic() - started) * 1000)
        assert record["status"] == "succeeded", record
    return {"wall_ms_p50": round(statistics.median(walls)), "wall_ms_min": round(min(walls))}


def _ready(gateway: GatewayThread, kind: str = "ipykernel") -> int:
    assert gateway.gateway.services is not None
    return int(gateway.gateway.services.runs.pools.describe()[kind]["ready"])


def measure(image: str, runs: int, engine: docker.DockerClient) -> dict[str, Any]:
    out: dict[str, Any] = {"size_mb": round(engine.images.get(image).attrs["Size"] / 1e6)}
    cold = GatewayThread(backend="docker", docker_image=image, **NO_POOLS).start()
    try:
        client = cold.client()
        env = client.request("GET", "/v1/environment").json()
        languages = env["languages"]
        out["packages"] = {name: len(entry["packages"]) for name, entry in languages.items()}
        out["cold_python_print"] = timed(client, runs, code="print(1)")
        if "r" in languages:
            out["cold_r_print"] = timed(client, runs, code="cat(1)", language="r")
            out["cold_r_ggplot"] = timed(client, runs, 1, code=GGPLOT, language="r")
    finally:
        cold.stop()
    warm = GatewayThread(
        backend="docker", docker_image=image, **{**NO_POOLS, "pool_python": 1}
    ).start()
    try:
        assert wait_for(lambda: _ready(warm) == 1, timeout=120)
        time.sleep(2)  # the preload's figure drawn and settled
        out["idle_pooled_python"] = container_memory(engine, warm.settings.instance_id or "")
        out["pooled_python_print"] = pooled_runs(warm, runs, code="print(1)")
        out["pooled_matplotlib_chart"] = pooled_runs(warm, runs, code=CHART)
        if "plotly" in {p["name"] for p in languages["python"]["packages"]}:
            out["pooled_plotly_figure"] = pooled_runs(warm, runs, code=PLOTLY)
    finally:
        warm.stop()
    if "r" in languages:
        pooled_r = GatewayThread(
            backend="docker", docker_image=image, **{**NO_POOLS, "pool_r": 1}
        ).start()
        try:
            assert wait_for(lambda: _ready(pooled_r, "irkernel") == 1, timeout=120)
            time.sleep(2)
            out["idle_pooled_r"] = container_memory(engine, pooled_r.settings.instance_id or "")
        finally:
            pooled_r.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    engine = docker.from_env()
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds")}
    for image in args.images:
        results[image] = measure(image, args.runs, engine)
        print(image, json.dumps(results[image], indent=1))
    out = REPO / "bench" / "results" / f"image-costs-{results['date'][:10]}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
