"""`ExecutionConfig`: the settings the execution layer reads (the executor, the result
builder, the session, the pools), and no other. Each field is the setting of its name
(`gateway.config.config_from`); what several of them decide together is a method.
"""

from __future__ import annotations

import dataclasses

from gateway.execution.collector import Caps
from gateway.sandbox.base import Limits, ReadLimits

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ExecutionConfig:
    # a run's sandbox (the default limits; a run may ask for less memory)
    cpus: float
    memory_bytes: int
    pids: int
    workdir_bytes: int
    tmp_bytes: int
    # its kernel
    kernel_start_timeout: float
    interrupt_grace: float
    # what a run keeps of what its kernel sends
    stream_cap_bytes: int
    display_cap_bytes: int
    error_cap_bytes: int
    result_cap_bytes: int
    output_limit_bytes: int
    max_json_depth: int
    # the files it returns
    max_return_files: int
    max_return_file_bytes: int
    max_return_files_bytes: int
    # the pools
    preload: tuple[str, ...]
    pool_min_free_bytes: int
    max_concurrent_runs: int

    def limits(self, memory_bytes: int | None = None) -> Limits:
        """A run's sandbox limits: the defaults, with less memory if it asks for less."""
        return Limits(
            cpus=self.cpus,
            memory_bytes=min(self.memory_bytes, memory_bytes or self.memory_bytes),
            pids=self.pids,
            workdir_bytes=self.workdir_bytes,
            tmp_bytes=self.tmp_bytes,
        )

    def caps(self, limit_bytes: int | None = None, display_bytes: int | None = None) -> Caps:
        """A cell's caps: the settings', or with what is left of the program's output
        limit (`limit_bytes`) and rich-output budget (`display_bytes`)."""
        return Caps(
            stream_bytes=self.stream_cap_bytes,
            display_bytes=self.display_cap_bytes if display_bytes is None else display_bytes,
            limit_bytes=self.output_limit_bytes if limit_bytes is None else limit_bytes,
            error_bytes=self.error_cap_bytes,
            max_depth=self.max_json_depth,
            display_total=self.display_cap_bytes,
        )

    def read_limits(self) -> ReadLimits:
        """How much of the working folder `return_files` may read back."""
        return ReadLimits(
            max_files=self.max_return_files,
            max_file_bytes=self.max_return_file_bytes,
            max_total_bytes=self.max_return_files_bytes,
        )

    def max_kernel_message(self) -> int:
        """The largest message a kernel may send: one rich output, or the reply that carries
        `result` (at most `result_cap_bytes` of JSON), plus room for its envelope."""
        largest = max(self.display_cap_bytes, self.result_cap_bytes)
        return largest + self.stream_cap_bytes + MiB
