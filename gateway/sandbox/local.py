"""`LocalSandbox`: a kernel as a local process, for development and machines without Docker.

What each kernel gets, where the machine allows it (README, "What each backend isolates"):

- **its own user**: when the gateway runs as root, the kernel runs as a uid of its own
  (`tenancy.py`: leased per sandbox, or its workspace owner's) and `sandbox_gid`
  (`setpriv`, no new privileges), never as root;
- **a bubblewrap sandbox** (`bwrap`, run unprivileged through user namespaces): new pid,
  net, ipc and uts namespaces, no capabilities, the host read-only, a private /tmp, and
  /run, /var/run, /root, /home, Docker's folders and the gateway's own files (data dir,
  workspaces, token file) hidden. Every folder it mounts is handed over as an open
  descriptor (`--bind-fd`), so no path a tenant controls is resolved; `/etc/passwd` and
  `/etc/group` are the host's with the sandbox user's entries (`accounts.py`), copied by
  bubblewrap into its own tmpfs from memfds (`--ro-bind-data`): no file on the host;
- **a cgroup** (root): memory, pids and CPU limits, usage, OOM detection, kill-all; without
  one, rlimits (`RLIMIT_NPROC`, `RLIMIT_AS`, `RLIMIT_FSIZE`) instead;
- without bubblewrap and cgroup, `kernels.reaper` as its init, so that no process it
  starts can escape the kill however it detaches.

The kernel's exit is watched through a pidfd on the event loop (no thread per kernel), and
its own stdout/stderr (not the user's: those go over ZMQ) land in a pipe of which the
gateway keeps only the last few KiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kernels
from gateway.errors import SandboxError
from gateway.models.languages import traits
from gateway.models.record import Usage
from gateway.models.request import StagedFile
from gateway.sandbox import kernelspec
from gateway.sandbox.accounts import USER_NAME, AccountFiles, RootAccounts
from gateway.sandbox.base import (
    BackendContext,
    Death,
    FilesRead,
    KernelEnvironment,
    ReadLimits,
    SandboxBackend,
    SandboxSpec,
    to_the_end,
)
from gateway.sandbox.cgroup import Cgroup, GroupedSandbox
from gateway.sandbox.environment import EnvironmentCache, collect_local
from gateway.sandbox.readback import read_files
from gateway.sandbox.sockets import secure_sockets
from gateway.sandbox.staging import write_staged_files
from gateway.sandbox.tenancy import Identity, Tenancy, TenancyConfig
from gateway.sandbox.workspace import open_workspace

log = logging.getLogger(__name__)

# sh -c LAUNCHER sh WORKDIR N CGROUP_PROCS_FILE... COMMAND...: cd, join the cgroups, exec.
_LAUNCHER = (
    'cd "$1" || exit 126; shift; n=$1; shift; '
    'while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@"'
)
HIDDEN = (
    "/run",
    "/var/run",
    "/root",
    "/home",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/sys/fs/cgroup",  # every sandbox's group: its usage, its limits
)
HIDDEN_TMPFS_BYTES = 1 << 20  # the empty tmpfs over a hidden folder: room for mount points
SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm")  # a private tmpfs each, like Docker's /tmp
CGROUP_ROOT = Path("/sys/fs/cgroup")
LOG_TAIL_BYTES = 4096  # of the kernel process's own output, kept for "why it died"
FIRST_FD = 3  # descriptors handed to the sandbox start here (0-2: null, log, log)
SANDBOX_HOME = "/tmp"  # a bubblewrap sandbox's HOME: its own tmpfs
REAPER_GRACE = 3.0  # after SIGTERM to the reaper: how long before SIGKILL
BWRAP_ATTEMPTS = 3
NPROC_MARGIN = 128  # without a cgroup: tasks of the uid that may start alongside a kernel


@dataclasses.dataclass(frozen=True)
class LocalConfig:
    """The settings the local backend reads (each field takes the setting of its name)."""

    data_dir: Path  # holds the kernels' matplotlib font cache
    allow_network: bool
    kernel_start_timeout: float
    tenancy: TenancyConfig


@dataclasses.dataclass(frozen=True)
class LocalFeatures:
    bwrap: str | None
    cgroups: bool
    drop_to: tuple[int, int] | None  # the base (uid, gid) kernels drop to; None: no drop

    def describe(self) -> str:
        parts = ["bubblewrap namespaces" if self.bwrap else "no bubblewrap (process group only)"]
        parts.append("cgroup limits" if self.cgroups else "no cgroup (rlimits only)")
        if self.drop_to is not None:
            parts.append("a uid of its own")
        return ", ".join(parts)


def _as_user(drop_to: tuple[int, int] | None) -> list[str]:
    """`setpriv` down to the sandbox user, with no capabilities left in any set."""
    if drop_to is None:
        return []
    uid, gid = drop_to
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--bounding-set=-all",
        "--inh-caps=-all",
    ]


def _bwrap_base(bwrap: str, drop_to: tuple[int, int] | None, network: bool) -> list[str]:
    """bwrap's namespaces and capabilities. As root it sets the sandbox up as root (so it
    can mount folders the sandbox user could not reach) without a user namespace, keeping
    only what `setpriv` needs to drop to the sandbox user inside; otherwise it runs
    unprivileged, through a user namespace."""
    command = [bwrap, "--die-with-parent", "--new-session"]
    if drop_to is None:
        command += ["--unshare-all", "--cap-drop", "ALL"]
        if network:
            command.append("--share-net")
        return command
    command += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        command.append("--unshare-net")
    command += ["--cap-drop", "ALL"]
    for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
        command += ["--cap-add", cap]
    return command


def probe_features(config: LocalConfig) -> LocalFeatures:
    """What this machine lets the local backend use (blocking: run it in a thread)."""
    ids = config.tenancy
    drop_to = (ids.sandbox_uid, ids.sandbox_gid) if os.geteuid() == 0 else None
    bwrap = shutil.which("bwrap")
    if bwrap is not None:
        command = [*_bwrap_base(bwrap, drop_to, False), "--ro-bind", "/", "/", "--"]
        command += [*_as_user(drop_to), "true"]
        for attempt in range(1, BWRAP_ATTEMPTS + 1):
            probe = subprocess.run(command, capture_output=True, timeout=10, check=False)
            if probe.returncode == 0:
                break
            # a mount another program tears down meanwhile fails the recursive bind of /
            # (see LocalSandbox.start): only a failure that persists means no bubblewrap
            if attempt < BWRAP_ATTEMPTS:
                time.sleep(0.2)
        else:
            log.warning("bubblewrap does not work here: %s", probe.stderr.decode()[-300:])
            bwrap = None
    group = Cgroup.create(f"gateway-probe-{os.getpid()}", 64 << 20, 8, 1.0)
    if group is not None:
        group.remove()
    return LocalFeatures(bwrap=bwrap, cgroups=group is not None, drop_to=drop_to)


class LocalBackend(SandboxBackend):
    name = "local"
    config_type = LocalConfig
    extra = "local"
    auto_preference = 100  # the fallback: it runs wherever the gateway runs

    def __init__(self, config: LocalConfig, context: BackendContext) -> None:
        super().__init__(config, context)
        self.config: LocalConfig = config
        self.multi_user = context.multi_user
        self.prefix = f"gw{self.instance_id[:6]}-"
        self.mpl_cache = config.data_dir / "mplcache"
        self.hidden_paths = list(context.private_paths)
        self.features = LocalFeatures(bwrap=None, cgroups=False, drop_to=None)
        self.tenancy = Tenancy(config.tenancy, context.multi_user)
        self._environment = EnvironmentCache()

    async def environment(self) -> KernelEnvironment | None:
        """Listed once, by the Python local kernels run with, on their PATH."""
        found = await self._environment.get(
            "local",
            lambda: collect_local(sys.executable, str(_kernels_parent()), _kernel_path()),
        )
        return None if found is None else KernelEnvironment(found, "local")

    @property
    def meters_cpu(self) -> bool:
        return self.features.cgroups

    async def startup(self) -> None:
        self.features = await asyncio.to_thread(probe_features, self.config)
        if self.multi_user and self.config.allow_network:
            raise RuntimeError(
                "--allow-network with several users on the local backend would put their "
                "runs on this host's own network (its loopback services, the metadata "
                "address): refusing to start. Use the Docker backend with --docker-network."
            )
        if self.multi_user and self.features.bwrap is None:
            raise RuntimeError(
                "The --tokens file names several users, but bubblewrap is missing or does "
                "not work here, so local kernels would share the host's processes, network "
                "and files: refusing to start. Install bubblewrap (apt-get install "
                "bubblewrap; it needs user namespaces) or use --backend docker."
            )
        await self.tenancy.startup(switch_users=self.features.drop_to is not None)
        await asyncio.to_thread(self._remove_orphans)
        await self._build_font_cache()
        log.info("local sandboxes use %s", self.features.describe())
        if not self.features.cgroups:
            log.warning("local sandboxes get no cgroup here: rlimits stand in for its limits")

    async def shutdown(self) -> None:
        await self.tenancy.shutdown()

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
        identity = await self.tenancy.identity(spec.workspace)
        try:
            root = Path(tempfile.mkdtemp(prefix=self.prefix))
        except BaseException:
            identity.release()
            raise
        sandbox = LocalSandbox(self, spec, root, identity)
        try:
            await to_the_end(asyncio.to_thread(sandbox.prepare))
            if self.features.cgroups:
                await to_the_end(asyncio.to_thread(sandbox.make_group))
        except BaseException:
            await to_the_end(sandbox.destroy())
            raise
        return sandbox


class LocalSandbox(GroupedSandbox[tuple[int, Any]]):
    def __init__(
        self, backend: LocalBackend, spec: SandboxSpec, root: Path, identity: Identity
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.identity = identity  # who the kernel runs as (tenancy.py)
        self.config = backend.config
        self.root = root  # 0700, the gateway's: everything below is handed over by descriptor
        self.kdir = root / "k"  # the kernel's sockets
        self.workdir = root / "work"  # where the kernel sees its working folder
        self.work_fd: int | None = None
        self.accounts: AccountFiles | None = None  # its /etc/passwd and /etc/group (bwrap)
        self.user_name = USER_NAME  # USER and LOGNAME
        self.group: Cgroup | None = None
        self.pid: int | None = None
        self.exited: asyncio.Future[tuple[int, Any]] | None = None
        self._pidfd: int | None = None
        self._log_fd: int | None = None
        self._log_tail = b""
        self._killed = False  # ended by kill(): no death to tell
        self._ended = False  # a kill() has run to its end

    def make_group(self) -> None:
        """Make the sandbox's cgroup, with its limits (blocking; None: none could be made)."""
        limits = self.spec.limits
        self.group = Cgroup.create(
            f"gateway-{self.root.name}", limits.memory_bytes, limits.pids, limits.cpus
        )

    def prepare(self) -> None:
        """Make the sandbox's folders, and its account files (blocking)."""
        features = self.backend.features
        uid, gid = self._ids
        if features.bwrap is not None:
            self.accounts = RootAccounts.read(Path("/")).for_sandbox(uid, gid, SANDBOX_HOME)
        else:  # the host's own files: the name they give the uid, if they give one
            self.user_name = _host_name(uid)
        if features.bwrap is None:
            os.chmod(self.root, 0o711)  # noqa: S103 - traverse only: the kernel's folders by path
        self.kdir.mkdir(mode=0o700)
        os.chown(self.kdir, uid, gid)
        (self.root / "tmp").mkdir(mode=0o700)
        os.chown(self.root / "tmp", uid, gid)
        if self.spec.workspace is not None:
            self.work_fd = open_workspace(self.spec.workspace, uid, gid)
        else:
            self.workdir.mkdir(mode=0o755)
            os.chown(self.workdir, uid, gid)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            self.work_fd = os.open(self.workdir, flags)

    @property
    def _ids(self) -> tuple[int, int]:
        return self.identity.uid, self.identity.gid

    @property
    def _drop_to(self) -> tuple[int, int] | None:
        """The (uid, gid) `setpriv` drops to inside the sandbox; None: no drop."""
        return self._ids if self.backend.features.drop_to is not None else None

    # --- files --------------------------------------------------------------------------

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        assert self.work_fd is not None
        await asyncio.to_thread(write_staged_files, self.work_fd, files, *self._ids)

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        # killed first by the executor: nothing changes the folder while it is read
        assert self.work_fd is not None
        return await asyncio.to_thread(
            read_files, self.work_fd, self._visible_workdir(), list(patterns), limits
        )

    def _visible_workdir(self) -> str:
        """The working folder's path as the kernel sees it."""
        if self.backend.features.bwrap is None and self.spec.workspace is not None:
            return str(self.spec.workspace.path)
        return str(self.workdir)

    # --- the kernel process -------------------------------------------------------------

    def _command(self, argv: list[str], fds: list[int]) -> tuple[list[str], str]:
        """The full command line (after the launcher) and the HOME the kernel sees. Folders
        bwrap mounts are appended to `fds` and handed to it by number."""
        features, limits = self.backend.features, self.spec.limits

        def handed(fd: int) -> str:
            fds.append(fd)
            return str(FIRST_FD + len(fds) - 1)

        limited: list[str] = []
        if not features.cgroups:
            # the uid's other sandboxes (pooled kernels, runs starting now) hold tasks too,
            # and more of them may start between this count and the kernel's own threads
            nproc = limits.pids + _tasks_of(self._ids[0]) + NPROC_MARGIN
            limited = [
                "prlimit",
                f"--nproc={nproc}",
                f"--as={max(limits.memory_bytes, 4 << 30)}",
                f"--fsize={limits.workdir_bytes}",
                "--",
            ]
        if features.bwrap is None:
            # no pid namespace, and without a cgroup nothing else holds the processes
            reaper = [] if features.cgroups else [sys.executable, "-P", "-m", "kernels.reaper"]
            return [*_as_user(self._drop_to), *limited, *reaper, *argv], str(self.root / "tmp")
        command = _bwrap_base(features.bwrap, features.drop_to, self.spec.network)
        command += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        covered = []  # folders a tmpfs replaces inside the sandbox
        for temp in SHARED_TEMP:  # private, like Docker's: shared temp space shows others'
            command += ["--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", temp]
            covered.append(temp)
        for hidden in [*HIDDEN, *map(str, self.backend.hidden_paths)]:
            if os.path.islink(hidden) or not os.path.exists(hidden):
                continue
            if os.path.isdir(hidden):
                command += ["--size", str(HIDDEN_TMPFS_BYTES), "--perms", "0755"]
                command += ["--tmpfs", hidden]
                covered.append(hidden)
            else:
                command += ["--ro-bind", "/dev/null", hidden]
        mounts = [(p, False) for p in _needed_paths(self.backend.mpl_cache)]
        mounts += [(str(d), False) for d in self._own_cgroup(command)]
        mounts += [(str(self.kdir), True), (str(self.workdir), True)]
        made: set[str] = set()
        for target, _ in mounts:  # folders on the way, reachable by the sandbox user
            for parent in reversed(Path(target).parents):
                name = str(parent)
                if name not in made and any(name.startswith(c + "/") for c in covered):
                    made.add(name)
                    command += ["--perms", "0755", "--dir", name]
        for target, writable in mounts:
            if target == str(self.workdir):
                assert self.work_fd is not None
                fd = os.dup(self.work_fd)
            else:
                fd = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            command += ["--bind-fd" if writable else "--ro-bind-fd", handed(fd), target]
        assert self.accounts is not None
        for name, text in (("passwd", self.accounts.passwd), ("group", self.accounts.group)):
            command += ["--perms", "0444", "--ro-bind-data", handed(_memfd(text)), f"/etc/{name}"]
        command += ["--chdir", str(self.workdir), "--"]
        return [*command, *_as_user(self._drop_to), *limited, *argv], SANDBOX_HOME

    def _own_cgroup(self, command: list[str]) -> list[Path]:
        """The sandbox's own cgroup folders, to show (read-only) on the empty tmpfs that
        hides every other group: their limits and usage are the kernel's to read, as in
        a container. The names of co-mounted v1 controllers (`cpu` -> `cpu,cpuacct`) are
        links; they are made again."""
        if self.group is None:
            return []
        for name in self.group.dirs:
            link = CGROUP_ROOT / name
            if not self.group.v2 and link.is_symlink():
                command += ["--symlink", os.readlink(link), str(link)]
        return list(dict.fromkeys(self.group.dirs.values()))

    async def start(self) -> dict[str, Any]:
        if traits(self.spec.language).listens_on_loopback and (
            self.backend.features.bwrap is None or self.spec.network
        ):
            # its ports would be on this host's loopback, open to every local process
            raise SandboxError(
                f"A {self.spec.language} kernel listens on loopback ports, so the local "
                "backend runs it only in a network namespace of its own: that needs "
                "bubblewrap and no `network`. Use the Docker backend otherwise."
            )
        info = kernelspec.connection_info(str(self.kdir / "s"), kernelspec.new_key())
        connection_file = self.kdir / "connection.json"
        kernelspec.write_connection_file(connection_file, info)
        argv = kernelspec.kernel_argv(self.spec.language, sys.executable, str(connection_file))
        for attempt in range(1, BWRAP_ATTEMPTS + 1):
            self._launch(argv)
            assert self.exited is not None
            try:
                await secure_sockets(
                    str(self.kdir),
                    "s",
                    self._ids[0],
                    asyncio.shield(self.exited),
                    self.config.kernel_start_timeout,
                )
                return info
            except SandboxError as exc:
                if not self.exited.done():
                    raise
                await asyncio.sleep(0.05)  # the last words still in the log pipe
                detail = self._log_tail.decode("utf-8", "replace").strip()
                # bwrap's recursive read-only bind of / can meet a mount that another
                # program (a container engine) is tearing down: a transient failure
                if detail.startswith("bwrap: ") and attempt < BWRAP_ATTEMPTS:
                    log.warning("the sandbox could not be set up (%s); retrying", detail)
                    self._forget_process()
                    continue
                raise SandboxError(f"{exc.message} {detail[-500:]}".strip()) from exc
        raise AssertionError("unreachable")

    def _launch(self, argv: list[str]) -> None:
        fds: list[int] = []
        try:
            command, home = self._command(argv, fds)
            self.pid = self._spawn(command, home, fds)
        finally:
            for fd in fds:
                os.close(fd)
        self._pidfd = os.pidfd_open(self.pid)
        loop = asyncio.get_running_loop()
        self.exited = loop.create_future()
        loop.add_reader(self._pidfd, self._on_exit)

    def _forget_process(self) -> None:
        """Let go of a kernel process that already exited (before a new attempt)."""
        self._close_watches()
        self._log_tail = b""

    def _close_watches(self) -> None:
        """Stop watching the kernel's exit and its log, and close both descriptors."""
        loop = asyncio.get_running_loop()
        for fd in (self._pidfd, self._log_fd):
            if fd is not None:
                loop.remove_reader(fd)
                os.close(fd)
        self._pidfd = self._log_fd = None

    def _spawn(self, command: list[str], home: str, fds: list[int]) -> int:
        files = [] if self.group is None else [str(p) for p in self.group.proc_files]
        cwd = str(self.root)  # bwrap changes into the working folder itself
        if self.backend.features.bwrap is None:
            assert self.work_fd is not None
            fds.append(os.dup(self.work_fd))
            cwd = f"/proc/self/fd/{FIRST_FD + len(fds) - 1}"
        launcher = ["/bin/sh", "-c", _LAUNCHER, "sh", cwd, str(len(files)), *files, *command]
        env = kernelspec.kernel_env(home, {}, _kernel_path())
        env.update(
            {
                "PYTHONPATH": str(_kernels_parent()),
                "GATEWAY_MPL_CACHE": str(self.backend.mpl_cache),
                "USER": self.user_name,
                "LOGNAME": self.user_name,
            }
        )
        env.update(self.spec.env)
        read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(write_end, True)
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, write_end, 1),
            (os.POSIX_SPAWN_DUP2, write_end, 2),
        ]
        actions += [(os.POSIX_SPAWN_DUP2, fd, FIRST_FD + i) for i, fd in enumerate(fds)]
        try:
            pid = os.posix_spawn(
                launcher[0],
                launcher,
                env,
                file_actions=actions,
                setsid=True,
                setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGPIPE),
            )
        except OSError as exc:
            os.close(read_end)
            raise SandboxError(f"The kernel could not be started: {exc}") from exc
        finally:
            os.close(write_end)
        self._log_fd = read_end
        asyncio.get_running_loop().add_reader(read_end, self._on_log)
        return pid

    def _on_log(self) -> None:
        assert self._log_fd is not None
        try:
            data = os.read(self._log_fd, 65536)
        except BlockingIOError:
            return
        if not data:
            asyncio.get_running_loop().remove_reader(self._log_fd)
            return
        self._log_tail = (self._log_tail + data)[-LOG_TAIL_BYTES:]

    def _on_exit(self) -> None:
        assert self._pidfd is not None and self.pid is not None and self.exited is not None
        asyncio.get_running_loop().remove_reader(self._pidfd)
        try:
            _, status, rusage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            status, rusage = 0, None
        if not self.exited.done():
            self.exited.set_result((status, rusage))

    async def kill(self) -> None:
        if self.pid is None or self.exited is None or self._ended:
            return  # ended already: its process group's id may be another's by now
        if not self.exited.done():
            self._killed = True
        features = self.backend.features
        if features.bwrap is None and self.group is None and not self.exited.done():
            # the reaper kills what the kernel started, then exits
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            await asyncio.wait([self.exited], timeout=REAPER_GRACE)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.group is not None:
            await asyncio.to_thread(self.group.kill_all)
        await asyncio.wait([self.exited], timeout=10)
        self._ended = self.exited.done()

    # --- what happened ------------------------------------------------------------------

    async def usage(self) -> Usage:
        if self.group is not None:
            return self.group.usage()
        usage = Usage()
        if self.exited is not None and self.exited.done():
            _, rusage = self.exited.result()
            if rusage is not None:
                usage.cpu_ms = int((rusage.ru_utime + rusage.ru_stime) * 1000)
                usage.peak_memory_bytes = int(rusage.ru_maxrss) * 1024
        return usage

    async def death(self) -> Death | None:
        if self.exited is None or not self.exited.done() or self._killed:
            return None
        status, _ = self.exited.result()
        code = os.waitstatus_to_exitcode(status)
        oom = self.group is not None and self.group.oom_killed()
        return Death(
            exit_code=code, oom_killed=oom, detail=self._log_tail.decode("utf-8", "replace")
        )

    async def destroy(self) -> None:
        try:
            await self.kill()
        finally:
            self._close_watches()
            if self.pid is not None and self.exited is not None and not self.exited.done():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks
            if self.work_fd is not None:
                os.close(self.work_fd)
                self.work_fd = None
            if self.group is not None:
                await asyncio.to_thread(self.group.remove)
            await asyncio.to_thread(shutil.rmtree, self.root, True)
            self.identity.release()  # the uid's processes are gone: another may have it


def _memfd(text: str) -> int:
    """A memfd holding `text`, read from its start (bubblewrap copies it: `--ro-bind-data`)."""
    fd = os.memfd_create("sandbox-file", os.MFD_CLOEXEC)
    try:
        os.write(fd, text.encode())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _host_name(uid: int) -> str:
    """The name the host's accounts give `uid` (blocking: NSS may ask a directory), else
    the sandbox user's: a kernel without a mount namespace of its own sees the host's."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return USER_NAME


def _needed_paths(mpl_cache: Path) -> list[str]:
    """What the kernel must see although it lies under a hidden folder or /tmp."""
    paths = {sys.prefix, sys.base_prefix, str(_kernels_parent()), str(mpl_cache)}
    return sorted(p for p in paths if os.path.isdir(p))


def _kernel_path() -> str:
    """A local kernel's PATH: the gateway's Python (and the `deno` beside it) first."""
    return os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])


def _kernels_parent() -> Path:
    """The folder that holds our `kernels` package (put on the kernel's PYTHONPATH)."""
    return Path(kernels.__file__).resolve().parent.parent


def _tasks_of(uid: int) -> int:
    """How many tasks (threads, each process's too) `uid` runs now: RLIMIT_NPROC counts
    every one of them, and a kernel starts a dozen threads."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count
