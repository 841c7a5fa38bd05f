"""A per-sandbox control group for the local backend, when the machine lets us make one.

Gives the local sandbox what Docker gets from its cgroup: memory, pids and CPU limits, peak
memory and CPU time, whether the OOM killer or the pids limit struck, and a reliable way to
kill every process (a `setsid` daemon included). Supports cgroup v2 and the v1 hierarchies
(`memory`, `pids`, `cpu`, `cpuacct`). Without write access, `create` returns None and the
local sandbox falls back to rlimits (see README, "What each backend isolates").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.models.record import Usage
from gateway.sandbox.base import ExitingSandbox, ExitT

if TYPE_CHECKING:
    from gateway.sandbox.base import LimitEvent

ROOT = Path("/sys/fs/cgroup")


def _write(path: Path, value: str) -> None:
    path.write_text(value, encoding="ascii")


def _read(path: Path) -> str:
    """A control file's text ("" when it cannot be read: the group is gone). Read with
    plain system calls: the counters a run's usage takes are read on the event loop, each
    in microseconds (kernel memory, never the disk)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", "replace")


def _close_all(held: dict[Path, int], lock: threading.Lock) -> None:
    with lock:
        for fd in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        held.clear()


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


class Cgroup:
    """One sandbox's cgroup(s). Use `Cgroup.create(...)`; always `remove()`."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs
        self.v2 = v2
        # the usage counters' files, held open from their first reading on, so that a
        # reading is one pread (an open of a control file costs a path walk: 3-4 times the
        # read; bench/README.md, "What metering costs"); closed by `close` (`remove` too:
        # a removed group's open files keep it alive in the kernel), or with the object
        self._held: dict[Path, int] = {}
        self._held_lock = threading.Lock()  # `remove` may run in a thread
        weakref.finalize(self, _close_all, self._held, self._held_lock)

    @property
    def name(self) -> str:
        return next(iter(self.dirs.values())).name if self.dirs else ""

    @classmethod
    def create(cls, name: str, memory: int, pids: int, cpus: float) -> Cgroup | None:
        try:
            if (ROOT / "cgroup.controllers").exists():
                return cls._create_v2(name, memory, pids, cpus)
            return cls._create_v1(name, memory, pids, cpus)
        except OSError:
            return None

    @classmethod
    def _create_v1(cls, name: str, memory: int, pids: int, cpus: float) -> Cgroup | None:
        wanted = ("memory", "pids", "cpu", "cpuacct")
        if not all((ROOT / c / "cgroup.procs").exists() for c in wanted):
            return None
        dirs: dict[str, Path] = {}
        group = cls(dirs, v2=False)
        made: dict[Path, Path] = {}  # hierarchy -> our folder in it
        try:
            for controller in wanted:
                # co-mounted controllers (cpu,cpuacct) are one hierarchy behind two names
                hierarchy = (ROOT / controller).resolve()
                if hierarchy not in made:
                    made[hierarchy] = hierarchy / name
                    made[hierarchy].mkdir()
                dirs[controller] = made[hierarchy]
            _write(dirs["memory"] / "memory.limit_in_bytes", str(memory))
            with contextlib.suppress(OSError):  # no swap accounting on some kernels
                _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory))
            _write(dirs["pids"] / "pids.max", str(pids))
            _write(dirs["cpu"] / "cpu.cfs_period_us", "100000")
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(int(cpus * 100000)))
        except OSError:
            group.remove()
            return None
        return group

    @classmethod
    def _create_v2(cls, name: str, memory: int, pids: int, cpus: float) -> Cgroup | None:
        path = ROOT / name
        needed = {"memory", "pids", "cpu"}
        if not needed <= set(_read(ROOT / "cgroup.subtree_control").split()):
            return None
        path.mkdir()
        group = cls({"unified": path}, v2=True)
        try:
            _write(path / "memory.max", str(memory))
            _write(path / "memory.swap.max", "0")
            _write(path / "pids.max", str(pids))
            _write(path / "cpu.max", f"{int(cpus * 100000)} 100000")
        except OSError:
            group.remove()
            return None
        return group

    @classmethod
    def remove_matching(cls, prefix: str) -> int:
        """Kill and remove every cgroup whose name starts with prefix (orphans of a crash)."""
        found = [p for p in [*ROOT.glob(f"*/{prefix}*"), *ROOT.glob(f"{prefix}*")] if p.is_dir()]
        by_name: dict[str, dict[str, Path]] = {}
        for path in found:
            key = "unified" if path.parent == ROOT else path.parent.name
            by_name.setdefault(path.name, {})[key] = path
        for dirs in by_name.values():
            group = cls(dirs, v2="unified" in dirs)
            group.kill_all()
            group.remove()
        return len(by_name)

    @classmethod
    def of_process(cls, pid: int) -> Cgroup | None:
        """The cgroup(s) a running process is in (to read a container's usage)."""
        dirs: dict[str, Path] = {}
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text(encoding="ascii").splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if controllers == "" and (ROOT / "cgroup.controllers").exists():
                return cls({"unified": ROOT / path.lstrip("/")}, v2=True)
            for controller in controllers.split(","):
                if controller in ("memory", "pids", "cpuacct"):
                    dirs[controller] = ROOT / controller / path.lstrip("/")
        return cls(dirs, v2=False) if {"memory", "pids", "cpuacct"} <= set(dirs) else None

    @classmethod
    def named(cls, name: str) -> Cgroup:
        """The group `name` at the top of each hierarchy that meters a sandbox (memory,
        pids, cpuacct; cgroup v2's one), whoever makes it (Docker's `cgroup_parent`): its
        counters include those of the groups below it, and keep them once those are gone."""
        if (ROOT / "cgroup.controllers").exists():
            return cls({"unified": ROOT / name}, v2=True)
        return cls({c: ROOT / c / name for c in ("memory", "pids", "cpuacct")}, v2=False)

    @classmethod
    def remove_named(cls, name: str) -> None:
        """Remove the empty group `name` from every hierarchy it is in (a container runtime
        makes a `cgroup_parent` in all of them: freezer, devices, ...)."""
        found = [p for p in [*ROOT.glob(f"*/{name}"), ROOT / name] if p.is_dir()]
        cls({str(i): p for i, p in enumerate(found)}, v2=False).remove()

    @property
    def proc_files(self) -> list[Path]:
        """Files a process writes its pid into to join this group (one per hierarchy)."""
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values())]

    def set_memory(self, memory: int) -> bool:
        """Lower the memory limit of a running group; False if the kernel refused."""
        try:
            if self.v2:
                _write(self.dirs["unified"] / "memory.max", str(memory))
            else:
                _write(self.dirs["memory"] / "memory.limit_in_bytes", str(memory))
                with contextlib.suppress(OSError):
                    _write(self.dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory))
        except OSError:
            return False
        return True

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.proc_files:
            found.update(int(p) for p in _read(procs).split())
        return found

    def _held_text(self, path: Path) -> str:
        """A usage counter's file, read through its descriptor held open ("" when it
        cannot be read: the group is gone)."""
        with self._held_lock:
            fd = self._held.get(path)
            try:
                if fd is None:
                    fd = self._held[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                return os.pread(fd, 4096, 0).decode("ascii", "replace")
            except OSError:
                return ""

    def close(self) -> None:
        """Close the counters' files held open (a later reading opens them again)."""
        _close_all(self._held, self._held_lock)

    def cpu_ns(self) -> int | None:
        if self.v2:
            text = self._held_text(self.dirs["unified"] / "cpu.stat")
            return _counter(text, "usage_usec") * 1000 if text else None
        text = self._held_text(self.dirs["cpuacct"] / "cpuacct.usage").strip()
        return int(text) if text.isdigit() else None

    def peak_memory(self) -> int | None:
        return self._memory("memory.peak", "memory.max_usage_in_bytes", self._held_text)

    def current_memory(self) -> int | None:
        return self._memory("memory.current", "memory.usage_in_bytes")

    def _memory(
        self, v2_file: str, v1_file: str, read: Callable[[Path], str] = _read
    ) -> int | None:
        """Bytes from one of the memory controller's files (v2's or v1's name of it), read
        by `read` (a usage counter's: through its held descriptor)."""
        path = self.dirs["unified"] / v2_file if self.v2 else self.dirs["memory"] / v1_file
        text = read(path).strip()
        return int(text) if text.isdigit() else None

    def oom_killed(self) -> bool:
        if self.v2:
            return _counter(_read(self.dirs["unified"] / "memory.events"), "oom_kill") > 0
        return _counter(_read(self.dirs["memory"] / "memory.oom_control"), "oom_kill") > 0

    def pids_limit_hit(self) -> bool:
        path = self.dirs["unified" if self.v2 else "pids"] / "pids.events"
        return _counter(_read(path), "max") > 0

    def usage(self) -> Usage:
        """The group's CPU time and peak memory so far, as a run reports them."""
        cpu_ns = self.cpu_ns()
        return Usage(
            cpu_ms=None if cpu_ns is None else cpu_ns // 1_000_000,
            peak_memory_bytes=self.peak_memory(),
        )

    def limit_events(self) -> frozenset[LimitEvent]:
        """Which of its limits the group has hit: memory (an OOM kill), pids."""
        events: set[LimitEvent] = set()
        if self.oom_killed():
            events.add("memory")
        if self.pids_limit_hit():
            events.add("pids")
        return frozenset(events)

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in the group until it is empty (forks included)."""
        if self.v2:
            with contextlib.suppress(OSError):
                _write(self.dirs["unified"] / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.close()
        for path in dict.fromkeys(self.dirs.values()):
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)

    def kill_and_remove(self, timeout: float = 30.0) -> bool:
        """Kill every process in the group and remove it, killing again for as long as it
        cannot be removed (False if it is still there after `timeout` s). A process may
        join the group after a kill found it empty (a forked kernel's first child joins
        through descriptors opened before, even when the parent that forked it died and
        nobody waits for it any more); a group that holds a process cannot be removed,
        and once it is removed, nobody can join it."""
        deadline = time.monotonic() + timeout
        self.close()
        while True:
            self.kill_all(timeout=max(0.0, deadline - time.monotonic()))
            if self._removed():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def _removed(self) -> bool:
        """Remove each folder of the group once; whether all of them are gone."""
        gone = True
        for path in dict.fromkeys(self.dirs.values()):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        return gone


class GroupedSandbox(ExitingSandbox[ExitT]):
    """A sandbox whose processes are in a control group of ours, `group` (None: none could be
    made, or it is gone): which limits struck, and its memory limit lowered, are the group's."""

    group: Cgroup | None = None

    async def limit_events(self) -> frozenset[LimitEvent]:
        return frozenset() if self.group is None else self.group.limit_events()

    async def set_memory_limit(self, memory_bytes: int) -> bool:
        if self.group is None:  # an rlimit cannot be lowered from outside
            return False
        return await asyncio.to_thread(self.group.set_memory, memory_bytes)
