"""The settings the runs layer reads, and no other: the run service's (`RunServiceConfig`:
capacity, queue, per-user limits, what is kept, the pools; with the execution layer's
config, which it hands down) and the operator's policy applied to a parsed body
(`RequestPolicy`: `gateway.runs.requests`, the tool adapters, and the handlers' JSON
limits). Each field is the setting of its name (`gateway.config.config_from`); what
several of them decide together is a method.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gateway.budget import CpuBudget, Quota
from gateway.execution.config import ExecutionConfig
from gateway.jsoncodec import JsonLimits
from gateway.models.languages import Kernel


@dataclasses.dataclass(frozen=True)
class SnapshotsConfig:
    per_user: int = 10  # snapshots a user may hold; more evicts their least recently used
    bytes_per_user: int = 4 << 30  # the sum of their own memory
    ttl: float = 3600.0  # idle seconds before one goes
    bytes_total: int = 8 << 30  # every user's together: past it nothing more is kept


@dataclasses.dataclass(frozen=True)
class RunServiceConfig:
    # this gateway's capacity, and each user's share of it
    max_concurrent_runs: int
    max_queued_runs: int
    max_runs_per_user: int
    max_running_per_user: int
    tokens: Path | None  # a tokens file: several users may share the slots
    default_timeout: float  # a refusal's Retry-After is a quarter of it
    drain_timeout: float
    # what each user may spend, unless the tokens file says otherwise (0: no limit)
    cpu_seconds_per_hour: float
    cpu_seconds_per_day: float
    runs_per_minute: int
    # what is kept of a run
    max_record_bytes: int
    max_records_per_user: int
    max_record_store_bytes_per_user: int
    # kept kernel states (`keep`, `from`)
    snapshots_per_user: int
    snapshot_bytes_per_user: int
    snapshot_ttl: float
    snapshot_bytes_total: int
    # never-used kernels kept ready, by kind
    pool_python: int
    pool_bash: int
    pool_deno: int
    pool_r: int
    execution: ExecutionConfig

    def slots_per_user(self) -> int:
        """The run slots one user may hold at once: `max_running_per_user`, else with a
        tokens file one fewer than all (one is always left for somebody else), else all
        (without a tokens file every run is the one user's: a share would only idle a
        slot)."""
        total = self.max_concurrent_runs
        return self.max_running_per_user or (total - 1 if self.tokens else total)

    def pool_sizes(self) -> dict[Kernel, int]:
        return {
            "ipykernel": self.pool_python,
            "bash": self.pool_bash,
            "deno": self.pool_deno,
            "irkernel": self.pool_r,
        }

    def snapshots(self) -> SnapshotsConfig:
        return SnapshotsConfig(
            per_user=self.snapshots_per_user,
            bytes_per_user=self.snapshot_bytes_per_user,
            ttl=self.snapshot_ttl,
            bytes_total=self.snapshot_bytes_total,
        )

    def cpu_budget(self) -> CpuBudget:
        """What a user may spend when the tokens file does not say."""
        return CpuBudget(
            cpu_seconds_per_hour=self.cpu_seconds_per_hour or None,
            cpu_seconds_per_day=self.cpu_seconds_per_day or None,
            runs_per_minute=self.runs_per_minute or None,
        )

    def records_quota(self) -> Quota:
        """What one user keeps of their finished runs' records."""
        return Quota(count=self.max_records_per_user, bytes=self.max_record_store_bytes_per_user)


@dataclasses.dataclass(frozen=True)
class RequestPolicy:
    # sizes of what a request carries
    max_code_bytes: int
    max_files: int
    max_file_bytes: int
    max_files_bytes: int
    max_return_files: int
    # JSON a body or message may hold
    max_json_depth: int
    max_json_values: int
    max_notebook_values: int
    max_notebook_cells: int
    # timeouts
    default_timeout: float
    max_timeout: float
    # what the operator enabled
    allow_uploads: bool
    allow_network: bool
    workspaces: Path | None
    admin_dirs: tuple[str, ...]

    def json_limits(self, *, notebook: bool) -> JsonLimits:
        """What one JSON body or WebSocket message may hold: a notebook replay's, or any
        other's (a run's, a tool call's)."""
        if notebook:
            return JsonLimits(
                self.max_json_depth, self.max_notebook_values, self.max_notebook_cells
            )
        return JsonLimits(self.max_json_depth, self.max_json_values)
