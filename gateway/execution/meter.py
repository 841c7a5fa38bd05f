"""`UsageMeter`: what a program spent, from its sandboxes' readings, for the run and per cell.

A run's `usage.cpu_ms` counts from when its code was first sent to a kernel (`begin`),
not the kernel's start nor a pooled kernel's preloads. A program may run in several kernels
(`keep: "cells"`: each cell after the first in a continuation of the state the cell before
left): each counts from when the program began in it (`begin`) until it leaves it (`leave`),
and the peak memory is the highest any of them reached. A cell's CPU is its kernel's between
the reading before it and the reading after it (`cell`), so the cells' CPU adds up to at
most the run's: the gateway's own code (the run's `vars` and `env`, reading `result` back)
is the run's, not a cell's.

A reading is the sandbox's `usage()`: two of its cgroup's counters, read on the event loop
(kernel memory, never the disk: 23-120 µs a reading on this machine, no more than handing
it to a thread would cost; bench/README.md, "What metering costs"). A reading is reused for
the next cell while no code went to that kernel since (`stale` says when some did), so a
replay costs one reading per cell.
Where a sandbox cannot tell its CPU (a local sandbox without a cgroup), every CPU figure is
None: a count that missed a kernel would be a wrong number, not a smaller one.
"""

from __future__ import annotations

import dataclasses

from gateway.models.record import Usage
from gateway.sandbox.base import Sandbox


@dataclasses.dataclass(eq=False)
class UsageMeter:
    """One program's meter; see the module docstring."""

    # the kernel the program runs in now, and its CPU when the program began in it
    _sandbox: Sandbox | None = None
    _base: int | None = None
    # what the kernels the program left spent: CPU (None: one could not tell), highest peak
    _spent_cpu: int | None = 0
    _spent_peak: int | None = None
    # the last reading of `_sandbox`'s CPU, while no code went to it since
    _current: int | None = None
    _fresh: bool = False

    async def read(self, sandbox: Sandbox) -> Usage:
        """A reading of `sandbox` now; the current one from then on, if it is the program's."""
        usage = await sandbox.usage()
        if sandbox is self._sandbox:
            self._current, self._fresh = usage.cpu_ms, True
        return usage

    async def begin(self, sandbox: Sandbox) -> None:
        """The program's code begins in `sandbox`'s kernel: its CPU counts from now."""
        self._sandbox = sandbox
        self._base = (await self.read(sandbox)).cpu_ms

    def stale(self) -> None:
        """Code went to the kernel (the gateway's own): the last reading is past."""
        self._fresh = False

    async def cpu_now(self) -> int | None:
        """The current kernel's CPU now, or as last read if no code went to it since."""
        if self._sandbox is None:
            return None
        if not self._fresh:
            await self.read(self._sandbox)
        return self._current

    def leave(self, usage: Usage) -> None:
        """The program leaves the current kernel, which had spent `usage` (its last
        reading, taken since the program's last code went to it)."""
        self._spent_cpu = _plus(self._spent_cpu, _since(self._base, usage.cpu_ms))
        self._spent_peak = _highest(self._spent_peak, usage.peak_memory_bytes)
        self._sandbox, self._base, self._fresh = None, None, False

    def total(self, usage: Usage | None) -> Usage:
        """The program's usage (without wall time), the current kernel's last reading
        `usage` (None: the program is in no kernel of its own any more)."""
        if usage is None:
            return Usage(cpu_ms=self._spent_cpu, peak_memory_bytes=self._spent_peak)
        return Usage(
            cpu_ms=_plus(self._spent_cpu, _since(self._base, usage.cpu_ms)),
            peak_memory_bytes=_highest(self._spent_peak, usage.peak_memory_bytes),
        )

    async def spent(self) -> int | None:
        """The CPU the program has spent so far (None: it began in no kernel yet, or a
        kernel could not tell)."""
        if self._sandbox is None:
            return None
        # not kept as the current reading: code may be running in the kernel now
        now = (await self._sandbox.usage()).cpu_ms
        return _plus(self._spent_cpu, _since(self._base, now))


async def cpu_of(sandbox: Sandbox) -> int | None:
    """The CPU `sandbox` has used, if it can still tell (None too once it cannot be read)."""
    try:
        return (await sandbox.usage()).cpu_ms
    except Exception:
        return None


def unused(usage: Usage) -> Usage:
    """A program whose code never went to its kernel (its files could not be staged): no
    CPU where the sandbox tells CPU, and the sandbox's peak."""
    cpu = None if usage.cpu_ms is None else 0
    return Usage(cpu_ms=cpu, peak_memory_bytes=usage.peak_memory_bytes)


def cell_cpu(before: int | None, after: int | None) -> int | None:
    """A cell's CPU from the readings before and after it."""
    return _since(before, after)


def _since(before: int | None, after: int | None) -> int | None:
    if before is None or after is None:
        return None
    return max(0, after - before)


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _highest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
