"""GET /metrics: Prometheus text with runs by status and language, run and kernel-start
duration histograms, pool size and queue length."""

from __future__ import annotations

import re

from tests.support import GatewayThread, wait_for


def sample(text: str, name: str) -> float:
    """The value of a sample, `metric` or `metric{a="x",b="y"}` (labels in any order)."""
    metric, _, labels = name.partition("{")
    wanted = dict(re.findall(r'(\w+)="([^"]*)"', labels))
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? ([0-9.e+-]+|\+Inf|NaN)", line)
        labels_of = dict(re.findall(r'(\w+)="([^"]*)"', (match and match.group(2)) or ""))
        if match and match.group(1) == metric and labels_of == wanted:
            return float(match.group(3))
    raise AssertionError(f"{name} not in:\n{text}")


def test_metrics_count_runs_and_time_kernel_starts() -> None:
    server = GatewayThread(backend="local", pool_python=0, pool_bash=0, pool_deno=0).start()
    try:
        client = server.client()
        client.run(code="print(1)")
        client.run(code="1/0")
        client.run(language="bash", code="exit 0")
        response = client.request("GET", "/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.body.decode()
        assert sample(text, 'gateway_runs_total{status="succeeded",language="python"}') == 1
        assert sample(text, 'gateway_runs_total{status="failed",language="python"}') == 1
        assert sample(text, 'gateway_runs_total{status="succeeded",language="bash"}') == 1
        assert sample(text, "gateway_run_duration_seconds_count") == 3
        assert sample(text, 'gateway_run_duration_seconds_bucket{le="+Inf"}') == 3
        assert sample(text, "gateway_kernel_start_duration_seconds_count") == 3
        assert 0 < sample(text, "gateway_kernel_start_duration_seconds_sum") < 60
        assert sample(text, "gateway_queue_length") == 0
        assert sample(text, "gateway_kernels_pooled") == 0
        assert "# TYPE gateway_run_duration_seconds histogram" in text
    finally:
        server.stop()


def test_a_pooled_kernel_start_is_timed_once() -> None:
    """Timed when it fills its pool, not again when a run takes it."""
    server = GatewayThread(backend="local", pool_python=1, pool_bash=0, pool_deno=0).start()
    try:
        client = server.client()

        def pool() -> dict[str, int]:
            pools: dict[str, dict[str, int]] = client.request("GET", "/v1/health").json()["pools"]
            return pools["ipykernel"]

        assert wait_for(lambda: pool()["ready"] == 1, timeout=60), pool()
        assert client.run(code="print(1)")["stdout"] == "1\n"
        assert client.run(language="bash", code="echo 1")["stdout"] == "1\n"  # no pool: cold
        assert wait_for(lambda: pool()["ready"] == 1, timeout=60), pool()
        assert pool()["hits"] == 1
        text = client.request("GET", "/metrics").body.decode()
        # the first fill, the refill after the hit, and the bash run's own kernel
        assert sample(text, "gateway_kernel_start_duration_seconds_count") == 3
    finally:
        server.stop()
