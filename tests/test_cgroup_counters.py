"""A sandbox's usage counters are read through descriptors held open (gateway/sandbox/
cgroup.py: a reading is one pread, not an open, a read and a close), which must never
outlive the group: a removed group's open files keep it alive in the kernel, and a gateway
that ran a million runs must not hold a million descriptors. A real cgroup of this machine
(the gateway's own, as root)."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from gateway.sandbox.cgroup import Cgroup

pytestmark = pytest.mark.fast


def descriptors() -> set[str]:
    """This process's open descriptors (after collecting what nothing refers to any more)."""
    gc.collect()
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def group() -> Iterator[Cgroup]:
    counted = made("counters")
    try:
        yield counted
    finally:
        counted.kill_and_remove()


def test_readings_follow_the_counters_through_held_descriptors(group: Cgroup) -> None:
    before = descriptors()
    assert group.usage().cpu_ms == 0
    held = descriptors() - before
    assert len(held) == 2  # the CPU counter's file and the peak memory's
    # a process in the group spends CPU: the next readings, through the same descriptors, see it
    spinner = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        for procs in group.proc_files:
            with open(procs, "w") as f:
                f.write(str(spinner.pid))
        time.sleep(0.5)
        usage = group.usage()
        assert usage.cpu_ms is not None and usage.cpu_ms >= 100, usage
        assert usage.peak_memory_bytes is not None  # (v1 charges only what it allocates after)
        assert descriptors() - before == held  # nothing opened again
    finally:
        spinner.kill()
        spinner.wait()


def made(kind: str) -> Cgroup:
    group = Cgroup.create(f"gateway-test-{kind}-{os.getpid()}", 64 << 20, 16, 1.0)
    if group is None:
        pytest.skip("no cgroup can be made here (the tests need root and cgroup v1 or v2)")
    return group


def test_a_removed_or_forgotten_group_holds_no_descriptor() -> None:
    before = descriptors()
    removed, killed, forgotten = made("removed"), made("killed"), made("forgotten")
    folders = [path for g in (removed, killed, forgotten) for path in g.dirs.values()]
    try:
        removed.usage()
        removed.remove()
        assert removed.usage().cpu_ms is None  # gone: no figure, and nothing held for it
        killed.usage()
        assert killed.kill_and_remove()  # the sandboxes' way
        forgotten.usage()
        assert descriptors() != before  # the forgotten group's two
        del forgotten
        assert descriptors() == before  # closed with the object
    finally:
        for path in dict.fromkeys(folders):
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()
