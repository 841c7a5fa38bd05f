"""Prometheus text exposition of the gateway's counters and histograms (no client library)."""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}')
        suffix = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{suffix} {self.total}", f"{name}_count{suffix} {self.n}"]
        return out


class Metrics:
    def __init__(self) -> None:
        self.runs: collections.Counter[tuple[str, str]] = collections.Counter()
        self.run_seconds = Histogram()
        self.kernel_start_seconds = Histogram()
        self.gauges: dict[str, Callable[[], float]] = {}

    def run_finished(self, status: str, language: str, seconds: float) -> None:
        self.runs[(status, language)] += 1
        self.run_seconds.observe(seconds)

    def render(self) -> str:
        lines = [
            "# HELP gateway_runs_total Finished runs by status and language.",
            "# TYPE gateway_runs_total counter",
        ]
        for (status, language), count in sorted(self.runs.items()):
            lines.append(f'gateway_runs_total{{status="{status}",language="{language}"}} {count}')
        lines += [
            "# HELP gateway_run_duration_seconds Wall time of runs, sandbox included.",
            "# TYPE gateway_run_duration_seconds histogram",
            *self.run_seconds.lines("gateway_run_duration_seconds"),
            "# HELP gateway_kernel_start_duration_seconds Sandbox creation to kernel ready.",
            "# TYPE gateway_kernel_start_duration_seconds histogram",
            *self.kernel_start_seconds.lines("gateway_kernel_start_duration_seconds"),
        ]
        for name, read in sorted(self.gauges.items()):
            lines += [f"# TYPE {name} gauge", f"{name} {read()}"]
        return "\n".join(lines) + "\n"
