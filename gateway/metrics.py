"""The gateway's Prometheus metrics, through `prometheus_client`, in a registry of its own
(one per gateway: tests run several in one process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format every scraper reads


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter(
            "gateway_runs",
            "Finished runs by status and language.",
            ["status", "language"],
            registry=self.registry,
        )
        self.run_seconds = Histogram(
            "gateway_run_duration_seconds",
            "Wall time of runs, sandbox included.",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.kernel_start_seconds = Histogram(
            "gateway_kernel_start_duration_seconds",
            "Sandbox creation to kernel ready.",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )

        self.user_cpu_seconds = Counter(
            "gateway_user_cpu_seconds",
            "CPU-seconds spent by each user's runs (as their records' usage.cpu_ms).",
            ["user"],
            registry=self.registry,
        )
        self.user_runs = Counter(
            "gateway_user_runs", "Runs of each user that ran.", ["user"], registry=self.registry
        )
        self.pool_hits = Counter(
            "gateway_pool_hits",
            "Runs that took a ready kernel from a pool.",
            ["kind"],
            registry=self.registry,
        )
        self.pool_misses = Counter(
            "gateway_pool_misses",
            "Runs that found their pool empty (or had none) and started a kernel.",
            ["kind"],
            registry=self.registry,
        )

    def user_spent(self, user: str, cpu_ms: int, runs: int) -> None:
        """A run of `user` ended having spent `cpu_ms` (the users are the tokens file's, or
        the single user: a bounded set of labels)."""
        self.user_cpu_seconds.labels(user=user).inc(cpu_ms / 1000)
        self.user_runs.labels(user=user).inc(runs)

    def run_finished(self, status: str, language: str, seconds: float) -> None:
        self.runs.labels(status=status, language=language).inc()
        self.run_seconds.observe(seconds)

    def gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        """A gauge read when the metrics are scraped."""
        Gauge(name, help, registry=self.registry).set_function(read)

    def render(self) -> bytes:
        return generate_latest(self.registry)
