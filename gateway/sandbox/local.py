"""`LocalSandbox`: a kernel as a local process, for development and machines without Docker.

Each kernel gets its own session and process group, its own temp folder and working folder,
and, where the machine allows: a bubblewrap sandbox (`bwrap`: private /tmp, read-only host,
new pid/net/ipc/uts namespaces, all capabilities dropped) and a cgroup (memory, pids, CPU
limits, usage, OOM detection, kill-all). Isolation is weaker than Docker's; the README says
what it does and does not give.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kernels
from gateway.errors import SandboxError
from gateway.runs.models import StagedFile, Usage
from gateway.sandbox.base import (
    Death,
    FilesRead,
    LimitEvent,
    ReadLimits,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
)
from gateway.sandbox.cgroup import Cgroup
from gateway.sandbox.kernelspec import (
    connection_info,
    kernel_argv,
    kernel_env,
    new_key,
    write_connection_file,
)
from gateway.sandbox.staging import write_staged_files
from kernels.returnfiles import read_files as read_return_files

log = logging.getLogger(__name__)

# sh -c LAUNCHER sh WORKDIR N CGROUP_PROCS_FILE... COMMAND...: cd, join the cgroups, exec.
_LAUNCHER = (
    'cd "$1" || exit 126; shift; n=$1; shift; '
    'while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@"'
)


@dataclasses.dataclass(frozen=True)
class LocalFeatures:
    bwrap: str | None
    cgroups: bool

    def describe(self) -> str:
        parts = ["bubblewrap namespaces" if self.bwrap else "no bubblewrap (process group only)"]
        parts.append("cgroup limits" if self.cgroups else "no cgroup (rlimits only)")
        return ", ".join(parts)


def probe_features() -> LocalFeatures:
    """What this machine lets the local backend use (a blocking call: run it in a thread)."""
    bwrap = shutil.which("bwrap")
    if bwrap is not None:
        probe = subprocess.run(
            [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        if probe.returncode != 0:
            bwrap = None
    group = Cgroup.create(f"gateway-probe-{os.getpid()}", 64 << 20, 8, 1.0)
    if group is not None:
        group.remove()
    return LocalFeatures(bwrap=bwrap, cgroups=group is not None)


class LocalBackend(SandboxBackend):
    name = "local"

    def __init__(self, instance_id: str, data_dir: Path, hidden_paths: Sequence[Path]) -> None:
        self.instance_id = instance_id
        self.prefix = f"gw{instance_id[:6]}-"
        self.mpl_cache = data_dir / "mplcache"
        self.hidden_paths = [p for p in hidden_paths if p is not None]
        self.features = LocalFeatures(bwrap=None, cgroups=False)

    async def startup(self) -> None:
        self.features = await asyncio.to_thread(probe_features)
        await asyncio.to_thread(self._remove_orphans)
        await self._build_font_cache()
        log.info("local sandboxes use %s", self.features.describe())

    def _remove_orphans(self) -> None:
        """What a crashed gateway of this instance left: cgroups (and their processes), folders."""
        Cgroup.remove_matching(f"gateway-{self.prefix}")
        for path in Path(tempfile.gettempdir()).glob(self.prefix + "*"):
            shutil.rmtree(path, ignore_errors=True)

    async def _build_font_cache(self) -> None:
        if any(self.mpl_cache.glob("fontlist-*.json")):
            return
        self.mpl_cache.mkdir(parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import matplotlib.font_manager",
            env={**os.environ, "MPLCONFIGDIR": str(self.mpl_cache)},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await process.wait()

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        root = Path(tempfile.mkdtemp(prefix=self.prefix))
        try:
            (root / "k").mkdir(mode=0o700)
            (root / "tmp").mkdir(mode=0o700)
            workdir = spec.workspace or root / "work"
            workdir.mkdir(mode=0o755, exist_ok=True)
            group = None
            if self.features.cgroups:
                limits = spec.limits
                group = await asyncio.to_thread(
                    Cgroup.create,
                    f"gateway-{root.name}",
                    limits.memory_bytes,
                    limits.pids,
                    limits.cpus,
                )
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return LocalSandbox(self, spec, root, workdir, group)


class LocalSandbox(Sandbox):
    def __init__(
        self,
        backend: LocalBackend,
        spec: SandboxSpec,
        root: Path,
        workdir: Path,
        group: Cgroup | None,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.root = root
        self.workdir = workdir
        self.group = group
        self.pid: int | None = None
        self._exit: asyncio.Future[tuple[int, Any]] | None = None
        self._killed = False

    # --- files --------------------------------------------------------------------------

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        await asyncio.to_thread(write_staged_files, self.workdir, files)

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        await self.kill()  # nothing may change the folder while we read it
        answer = await asyncio.to_thread(
            read_return_files,
            str(self.workdir),
            list(patterns),
            limits.max_files,
            limits.max_file_bytes,
            limits.max_total_bytes,
        )
        return FilesRead(files=answer["files"], notes=answer["notes"])

    # --- the kernel process -------------------------------------------------------------

    def _command(self, argv: list[str]) -> tuple[list[str], str]:
        """The full command line and the HOME the kernel sees."""
        features = self.backend.features
        if features.bwrap is None:
            return argv, str(self.root / "tmp")
        kdir, work = str(self.root / "k"), str(self.workdir)
        command = [features.bwrap, "--die-with-parent", "--new-session", "--unshare-all"]
        if self.spec.network:
            command.append("--share-net")
        command += ["--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        command += ["--size", str(self.spec.limits.tmp_bytes), "--tmpfs", "/tmp"]
        for hidden in self.backend.hidden_paths:
            if hidden.is_dir():
                command += ["--tmpfs", str(hidden)]
            elif hidden.exists():
                command += ["--ro-bind", "/dev/null", str(hidden)]
        for needed in self._needed_paths():  # what the kernel must see under /tmp or hidden
            command += ["--ro-bind", needed, needed]
        command += ["--bind", kdir, kdir, "--bind", work, work, "--chdir", work, "--", *argv]
        return command, "/tmp"

    def _needed_paths(self) -> list[str]:
        paths = {sys.prefix, sys.base_prefix, str(_kernels_parent()), str(self.backend.mpl_cache)}
        return sorted(p for p in paths if os.path.isdir(p))

    async def start(self) -> dict[str, Any]:
        kdir = self.root / "k"
        info = connection_info(str(kdir / "s"), new_key())
        connection_file = kdir / "connection.json"
        write_connection_file(connection_file, info)
        argv = kernel_argv(self.spec.language, sys.executable, str(connection_file))
        command, home = self._command(argv)
        files = [] if self.group is None else [str(p) for p in self.group.proc_files]
        command = [
            "/bin/sh",
            "-c",
            _LAUNCHER,
            "sh",
            str(self.workdir),
            str(len(files)),
            *files,
            *command,
        ]
        path = os.pathsep.join(
            [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
        )
        env = kernel_env(home, {}, path)
        env.update(
            {
                "PYTHONPATH": str(_kernels_parent()),
                "GATEWAY_MPL_CACHE": str(self.backend.mpl_cache),
                "GATEWAY_SANDBOX": self.root.name,
            }
        )
        env.update(self.spec.env)
        log_fd = os.open(self.root / "kernel.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.pid = os.posix_spawn(  # noqa: ASYNC221 - vfork+exec, returns at once
                command[0],
                command,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                ],
                setsid=True,
            )
        except OSError as exc:
            raise SandboxError(f"The kernel could not be started: {exc}") from exc
        finally:
            os.close(log_fd)
        self._exit = self._watch(self.pid)
        return info

    def _watch(self, pid: int) -> asyncio.Future[tuple[int, Any]]:
        """A future for (wait status, rusage) of the kernel; reaped by a thread of its own."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, Any]] = loop.create_future()

        def wait() -> None:
            _, status, rusage = os.wait4(pid, 0)
            loop.call_soon_threadsafe(future.set_result, (status, rusage))

        threading.Thread(target=wait, name=f"wait-{pid}", daemon=True).start()
        return future

    async def wait_exit(self) -> None:
        if self._exit is not None:
            await asyncio.shield(self._exit)

    async def kill(self) -> None:
        if self.pid is None or self._exit is None:
            return
        if not self._exit.done():
            self._killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.group is not None:
            await asyncio.to_thread(self.group.kill_all)
        elif self.backend.features.bwrap is None:
            await asyncio.to_thread(_kill_marked, self.root.name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exit), timeout=10)

    # --- what happened ------------------------------------------------------------------

    async def usage(self) -> Usage:
        usage = Usage()
        if self.group is not None:
            cpu_ns = self.group.cpu_ns()
            usage.cpu_ms = None if cpu_ns is None else cpu_ns // 1_000_000
            usage.peak_memory_bytes = self.group.peak_memory()
        elif self._exit is not None and self._exit.done():
            _, rusage = self._exit.result()
            usage.cpu_ms = int((rusage.ru_utime + rusage.ru_stime) * 1000)
            usage.peak_memory_bytes = int(rusage.ru_maxrss) * 1024
        return usage

    async def death(self) -> Death | None:
        if self._exit is None or not self._exit.done() or self._killed:
            return None
        status, _ = self._exit.result()
        code = os.waitstatus_to_exitcode(status)
        oom = self.group is not None and self.group.oom_killed()
        return Death(exit_code=code, oom_killed=oom, detail=self._log_tail())

    async def limit_events(self) -> frozenset[LimitEvent]:
        if self.group is None:
            return frozenset()
        events: set[LimitEvent] = set()
        if self.group.oom_killed():
            events.add("memory")
        if self.group.pids_limit_hit():
            events.add("pids")
        return frozenset(events)

    def _log_tail(self) -> str:
        try:
            with (self.root / "kernel.log").open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 2000))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    async def destroy(self) -> None:
        try:
            await self.kill()
        finally:
            if self.group is not None:
                await asyncio.to_thread(self.group.remove)
            await asyncio.to_thread(shutil.rmtree, self.root, True)


def _kernels_parent() -> Path:
    """The folder that holds our `kernels` package (put on the kernel's PYTHONPATH)."""
    return Path(kernels.__file__).resolve().parent.parent


def _kill_marked(marker: str) -> None:
    """Without namespaces or cgroups: kill every process whose environment carries our marker."""
    needle = f"GATEWAY_SANDBOX={marker}".encode()
    for _ in range(50):
        found = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.02)
