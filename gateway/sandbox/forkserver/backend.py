"""`ForkserverSandbox`: a kernel forked from a warm parent into a sandbox as strict as a
container (README, "What each backend isolates"; DESIGN.md decision 23).

The backend mounts the kernel image's layers (Docker's overlay2 folders, read-only: the
same files as a container of that image) once, compiles the seccomp filter once
(`seccomp.py`), and keeps one warm parent per kind of kernel (`parent.py`,
`kernels/zygote.py`): `ipykernel` (our startup code and the preloads imported, the kernel's
application and shell built: `kernels/python/prebuilt.py`),
`bash`, and `exec` for Deno and R, whose kernels are not Python: their child sets up the
same sandbox and then execs the kernel's command line, as the Docker image would run it.

Per sandbox the gateway makes only a cgroup (memory with swap off, pids, CPU): the child
joins it through descriptors the gateway opened, before it unshares anything. Everything
else lives in the child's own namespaces and goes with it: its tmpfs working folder and
socket folder are handed back to the gateway as open descriptors, through which files are
staged and read back (a descriptor keeps the tmpfs readable after the kernel has died) and
the kernel's sockets are reached (`/proc/self/fd/N/s-1`: never a path another process
could swap). No host folder, mount or volume is made per run: the sandbox's `/etc/passwd`
and `/etc/group` (the image's, read once at start, with the entries of the sandbox's uid
and gid: `accounts.py`) come in its request, and its pid 1 writes them on its own `/run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kernels
from gateway.errors import SandboxError
from gateway.models.common import Language
from gateway.models.languages import traits
from gateway.models.record import Usage
from gateway.models.request import StagedFile
from gateway.sandbox import kernelspec
from gateway.sandbox.accounts import RootAccounts
from gateway.sandbox.base import (
    BackendContext,
    Death,
    FilesRead,
    Footprint,
    KernelEnvironment,
    ReadLimits,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
    to_the_end,
)
from gateway.sandbox.cgroup import Cgroup, GroupedSandbox
from gateway.sandbox.docker import ETC_HOSTS
from gateway.sandbox.forkserver.parent import BRANCH_NAMESPACES, Parent
from gateway.sandbox.forkserver.rootfs import (
    image_layers,
    mount_rootfs,
    probe_rootfs,
    stale_kernel_code,
)
from gateway.sandbox.mounts import clone_tree, remove_tree
from gateway.sandbox.readback import read_files
from gateway.sandbox.seccomp import write_filter
from gateway.sandbox.sockets import secure_sockets
from gateway.sandbox.staging import write_staged_files
from gateway.sandbox.tenancy import Identity, Tenancy, TenancyConfig
from gateway.sandbox.workspace import open_workspace

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
CONNECTION_FILE = "/run/gateway/connection.json"
IMAGE_PYTHON = "/opt/venv/bin/python"
KERNEL_LOG = "kernel.log"
EXIT_WAIT = 10.0
CONTINUE_TIMEOUT = 10.0  # for a snapshot to fork a continuation
SNAPSHOT_SOCKET = "snapshot"  # in a Python kernel's socket folder (kernels/snapshot.py)
PARENT_WORD_WAIT = 2.0  # after a kernel ended: how long its exit status may take to come
# the kinds of kernel a warm parent imports; the others are exec'd by a child of `exec`
IMPORTED = ("ipykernel", "bash")


def kernel_argv(language: Language, imported: bool) -> list[str]:
    """A kernel's command line in the image; of an `imported` one, what follows `python -P
    -m MODULE` (its parent has imported the module, and the Python one builds its kernel
    for exactly this: `kernels/python/prebuilt.py`)."""
    argv = kernelspec.kernel_argv(language, IMAGE_PYTHON, CONNECTION_FILE)
    return argv[4:] if imported else argv


@dataclasses.dataclass(frozen=True)
class ForkserverConfig:
    """The settings the forkserver backend reads (each field takes the setting of its name)."""

    docker_image: str
    allow_network: bool
    kernel_start_timeout: float
    preload: tuple[str, ...]
    tenancy: TenancyConfig


class ForkserverBackend(SandboxBackend):
    name = "forkserver"
    config_type = ForkserverConfig
    extra = "forkserver"
    # before Docker's: its attack suite (tests -m attack) passes as Docker's does
    auto_preference = 5
    isolates_users = True
    snapshot_languages = frozenset({"python", "bash"})
    refill_delay = 0.0  # a kernel is a fork of a warm parent: ~30-60 ms of CPU, no core's second

    def __init__(self, config: ForkserverConfig, context: BackendContext) -> None:
        super().__init__(config, context)
        self.config: ForkserverConfig = config
        self.tenancy = Tenancy(config.tenancy, context.multi_user)
        self.prefix = f"gwfs{self.instance_id[:6]}-"
        self.state: Path | None = None
        self.parents: dict[str, Parent] = {}
        self._environment: dict[str, Any] | None = None
        self.accounts = RootAccounts()  # the image's own, read when the backend starts

    @classmethod
    async def probe(cls, config: ForkserverConfig) -> tuple[bool, str]:
        return await asyncio.to_thread(probe_forkserver, config.docker_image)

    @property
    def rootfs(self) -> Path:
        assert self.state is not None
        return self.state / "root"

    @property
    def meters_cpu(self) -> bool:
        return True  # every sandbox is a cgroup of the backend's own

    async def startup(self) -> None:
        if self.config.allow_network and self.tenancy.multi_user:
            raise RuntimeError(
                "--allow-network with several users on the forkserver backend would put their "
                "runs on this host's own network: refusing to start. Use the Docker backend "
                "with --docker-network."
            )
        await self.tenancy.startup(switch_users=True)
        await asyncio.to_thread(self._remove_orphans)
        layers = await asyncio.to_thread(image_layers, self.config.docker_image)
        self.state = Path(tempfile.mkdtemp(prefix=self.prefix))
        try:
            self.rootfs.mkdir(mode=0o755)
            top = self.state / "top"  # what Docker adds to a container's root: /etc/hosts ...
            (top / "etc").mkdir(parents=True)
            (top / "etc/hosts").write_text(ETC_HOSTS, encoding="utf-8")
            (top / "etc/hostname").write_text("", encoding="utf-8")  # each child binds its own
            await asyncio.to_thread(mount_rootfs, [str(top), *layers], self.rootfs)
            self.accounts = await asyncio.to_thread(RootAccounts.read, self.rootfs)
            ours = Path(kernels.__file__).parent
            stale = await asyncio.to_thread(stale_kernel_code, self.rootfs, ours)
            if stale:
                raise RuntimeError(
                    f"The kernel image {self.config.docker_image} holds other kernel code than "
                    f"this gateway ({len(stale)} of kernels/ differ: {', '.join(stale[:3])}): "
                    "build it from this checkout (docker/build.sh prints its tag) and start "
                    "with that tag (--docker-image)."
                )
            await asyncio.to_thread(write_filter, str(self.state / "seccomp.bpf"))
            program = self.state / "zygote.py"
            shutil.copyfile(ours / "zygote.py", program)
            program.chmod(0o444)
            for kind in (*IMPORTED, "exec"):
                self.parents[kind] = Parent(
                    kind,
                    self.rootfs,
                    program,
                    self.state / "seccomp.bpf",
                    self.config.preload,
                    self.state / f"parent-{kind}.log",
                    kernel_argv("python", imported=True),
                )
            await self.parents["ipykernel"].ensure()  # the others on first use
        except BaseException:
            await self.shutdown()
            raise
        log.info("forkserver kernels fork from the image %s", self.config.docker_image)

    def footprint(self) -> Footprint:
        pids = [p.process.pid for p in self.parents.values() if p.process is not None]
        pids += [p.pid for p in self.parents.values() if p.process is not None and p.pid]
        return Footprint(folders=() if self.state is None else (str(self.state),), pids=tuple(pids))

    async def shutdown(self) -> None:
        for parent in self.parents.values():
            await parent.close()
        self.parents.clear()
        if self.state is not None:
            await asyncio.to_thread(remove_tree, self.state)
            self.state = None
        await self.tenancy.shutdown()

    def _remove_orphans(self) -> None:
        """What a crashed gateway of this instance left: cgroups (and their processes),
        its state folder (the image's root file system mounted there)."""
        Cgroup.remove_matching(f"gateway-{self.prefix}")
        for path in Path(tempfile.gettempdir()).glob(self.prefix + "*"):
            with contextlib.suppress(OSError):
                remove_tree(path)

    async def environment(self) -> KernelEnvironment | None:
        if self._environment is None and self.state is not None:
            path = self.rootfs / "opt/gateway/environment.json"
            with contextlib.suppress(OSError, ValueError):
                self._environment = json.loads(await asyncio.to_thread(path.read_text))
        if self._environment is None:
            return None
        return KernelEnvironment(self._environment, "image", self.config.docker_image)

    async def create(self, spec: SandboxSpec) -> ForkserverSandbox:
        if spec.network and not self.config.allow_network:
            raise SandboxError("network is not allowed on this gateway")
        kernel = traits(spec.language).kernel
        if traits(spec.language).listens_on_loopback and spec.network:
            raise SandboxError(
                f"A {spec.language} kernel listens on loopback ports, so the forkserver "
                "backend runs it only in a network namespace of its own: without `network`."
            )
        identity = await self.tenancy.identity(spec.workspace)
        sandbox = ForkserverSandbox(self, spec, identity, kernel if kernel in IMPORTED else "exec")
        return await _prepared(sandbox, with_workspace=True)

    async def branch(self, spec: SandboxSpec, source: Sandbox) -> ForkserverSandbox:
        """A sandbox for a continuation of `source`, a kernel kept as a snapshot
        (`kernels/snapshot.py`): the forkserver makes the sandbox with no kernel
        in it, whose namespaces a fork of the snapshot's kernel joins (DESIGN decision
        24). It runs as the snapshot's uid (a process keeps its uid), which the snapshot
        holds until it and every branch of it are gone."""
        if not isinstance(source, ForkserverSandbox) or source.backend is not self:
            raise SandboxError("The snapshot is not one of this backend's kernels.")
        if spec.network:
            raise SandboxError("A continuation of a snapshot runs without network.")
        if spec.workspace is not None or source.spec.workspace is not None:
            raise SandboxError("A continuation has a working folder of its own, not a workspace.")
        identity = Identity(source.identity.uid, source.identity.gid)  # the source's lease
        sandbox = ForkserverSandbox(self, spec, identity, "exec", source=source)
        return await _prepared(sandbox, with_workspace=False)


async def _prepared(sandbox: ForkserverSandbox, with_workspace: bool) -> ForkserverSandbox:
    """`sandbox` with its workspace opened (if asked) and its cgroup made, or destroyed."""
    try:
        if with_workspace:
            await to_the_end(asyncio.to_thread(sandbox.open_workspace))
        await to_the_end(asyncio.to_thread(sandbox.make_group))
        if sandbox.group is None:
            raise SandboxError("The forkserver backend could not make the kernel's cgroup.")
    except BaseException:
        await to_the_end(sandbox.destroy())
        raise
    return sandbox


def probe_forkserver(image: str) -> tuple[bool, str]:
    """Whether forked kernels can be made here, and why (blocking)."""
    if os.geteuid() != 0:
        return False, "the forkserver backend needs root"
    if shutil.which("bwrap") is None:
        return False, "the forkserver backend needs bubblewrap (apt-get install bubblewrap)"
    group = Cgroup.create(f"gateway-probe-fs-{os.getpid()}", 64 << 20, 8, 1.0)
    if group is None:
        return False, "the forkserver backend needs cgroups (memory, pids, cpu) it can make"
    group.remove()
    return probe_rootfs(image)


class ForkserverSandbox(GroupedSandbox[int | None]):
    def __init__(
        self,
        backend: ForkserverBackend,
        spec: SandboxSpec,
        identity: Identity,
        kind: str,
        source: ForkserverSandbox | None = None,
    ) -> None:
        self.backend = backend
        self.source = source  # the snapshot a branch continues
        self.spec = spec
        self.identity = identity
        self.kind = kind
        self.group: Cgroup | None = None
        self.pid: int | None = None
        self.key = kernelspec.new_key()
        self.workspace_fd: int | None = None  # the workspace, opened when it was created
        self.work_fd: int | None = None
        self.sock_fd: int | None = None
        self.pidfd: int | None = None
        self.namespaces: list[int] = []  # a branch's, until its continuation has them
        self.kept_namespaces: list[int] = []  # a branch's user and PID ones, after that
        self.exited: asyncio.Future[int | None] | None = None
        self._killed = False

    # --- the kernel ---------------------------------------------------------------------

    def _request(self) -> dict[str, Any]:
        limits = self.spec.limits
        argv = kernel_argv(self.spec.language, self.kind in IMPORTED)
        uid, gid = self.identity.uid, self.identity.gid
        accounts = self.backend.accounts.for_sandbox(uid, gid, kernelspec.IMAGE_HOME)
        return {
            "uid": uid,
            "gid": gid,
            "network": self.spec.network,
            "hostname": secrets.token_hex(6),
            "tmp_bytes": limits.tmp_bytes,
            "work_bytes": limits.workdir_bytes,
            "argv": argv,
            "passwd": accounts.passwd,
            "group": accounts.group,
        }

    def _private(self, request: dict[str, Any]) -> int:
        """A memfd holding the whole request for this kernel (`request`, its connection with
        the HMAC key, its environment), handed to the parent as a descriptor it passes on
        unread: read only by the forked child, so that nothing of it is in the parent's
        memory, which every later fork copies (another tenant's uid and hostname were)."""
        env = {**kernelspec.image_env(), **self.spec.env}
        connection = kernelspec.connection_info("/run/kernel/s", self.key)
        private = {**request, "connection": connection, "env": env}
        fd = os.memfd_create("kernel-private", os.MFD_CLOEXEC)
        try:
            os.write(fd, json.dumps(private).encode())
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd

    async def start(self) -> dict[str, Any]:
        assert self.group is not None
        parent = self.backend.parents[self.kind]
        fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in self.group.proc_files]
        request = {**self._request(), "cgroups": len(fds), "cgroupfs": self._cgroupfs()}
        try:
            if self.workspace_fd is not None:
                fds.append(clone_tree(self.workspace_fd))  # two system calls
            elif self.source is not None:  # the branch is made in its namespaces
                fds += [os.dup(fd) for fd in self.source.namespaces_inside()]
            fds.append(self._private(request))  # always the last
            # A start cancelled after the request went out still gets its answer: the kernel
            # it forked is then known, and killed with the sandbox (not left running)
            await to_the_end(self._spawn(parent, fds))
            if self.source is not None:
                await to_the_end(self._continue(self.source))
        except OSError as exc:
            raise SandboxError(
                f"The forked kernel's workspace could not be mounted: {exc}"
            ) from exc
        finally:
            for fd in fds:
                os.close(fd)
        assert self.pidfd is not None and self.exited is not None
        asyncio.get_running_loop().add_reader(self.pidfd, self._on_pidfd)
        sockets = f"/proc/self/fd/{self.sock_fd}"
        try:
            await secure_sockets(
                f"{sockets}/.",  # the folder itself, not the link to it (opened O_NOFOLLOW)
                "s",
                self.identity.uid,
                asyncio.shield(self.exited),
                self.backend.config.kernel_start_timeout,
            )
        except SandboxError as exc:
            raise SandboxError(f"{exc.message} {self._log_tail()}".strip()) from exc
        return kernelspec.connection_info(f"{sockets}/s", self.key)

    async def _spawn(self, parent: Parent, fds: list[int]) -> None:
        """Have the parent fork the kernel (a branch: its sandbox); keep what it answers on
        the sandbox."""
        self.pid, handed, self.exited = await parent.spawn(fds, branch=self.source is not None)
        # the pidfd the parent opened before it answered (it reaps its kernels' pid 1, so
        # that pid was not reused meanwhile): a kill through it never reaches another process
        self.work_fd, self.sock_fd, *self.namespaces, self.pidfd = handed

    async def _continue(self, source: ForkserverSandbox) -> None:
        """Have the snapshot fork its continuation into this branch's namespaces."""
        assert self.group is not None
        fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in self.group.proc_files]
        try:
            fds += self.namespaces
            fds.append(self._private(self._request()))
            order = {"cgroups": len(self.group.proc_files), "namespaces": BRANCH_NAMESPACES}
            await asyncio.to_thread(source.order_continuation, order, fds)
        finally:
            for fd in fds[: len(self.group.proc_files)] + fds[-1:]:
                os.close(fd)
            # its user and PID namespaces stay open: a continuation of this one, kept in its
            # turn, is made inside them (`namespaces_inside`)
            for name, fd in zip(BRANCH_NAMESPACES, self.namespaces, strict=True):
                if name in ("user", "pid"):
                    self.kept_namespaces.append(fd)
                else:
                    os.close(fd)
            self.namespaces = []

    def namespaces_inside(self) -> list[int]:
        """Descriptors of the namespaces a branch of this sandbox's kernel is made inside:
        its PID namespace (pid 1's pidfd), and for a branch its own PID and user ones."""
        if self.kept_namespaces:
            user, pid = self.kept_namespaces
            return [pid, user]
        if self.pidfd is None:
            raise SandboxError("The snapshot's sandbox has ended.")
        return [self.pidfd]

    def order_continuation(self, order: dict[str, Any], fds: list[int]) -> None:
        """Ask this kept kernel (its snapshot socket) to fork a continuation (blocking).
        The snapshot ran user code: nothing it answers is trusted but that it answered."""
        assert self.sock_fd is not None
        path = f"/proc/self/fd/{self.sock_fd}/{SNAPSHOT_SOCKET}"
        found = os.lstat(path)  # its folder is root's since the kernel started: no swap
        if not stat.S_ISSOCK(found.st_mode) or found.st_uid != self.identity.uid:
            raise SandboxError("The snapshot's socket is not the kernel's.")
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as channel:
            channel.settimeout(CONTINUE_TIMEOUT)
            try:
                channel.connect(path)
                socket.send_fds(channel, [json.dumps(order).encode()], fds)
                data, handed, _, _ = socket.recv_fds(channel, 1 << 12, 1)
            except OSError as exc:
                raise SandboxError(f"The snapshot did not fork its continuation: {exc}") from exc
        for fd in handed:
            os.close(fd)
        if not data or b'"pid"' not in data:
            raise SandboxError("The snapshot could not fork its continuation.")

    def open_workspace(self) -> None:
        """The run's workspace, opened as the kernel's uid (in a thread), is the sandbox's."""
        if (workspace := self.spec.workspace) is not None:
            self.workspace_fd = open_workspace(workspace, self.identity.uid, self.identity.gid)

    def make_group(self) -> None:
        """Make the kernel's cgroup, with its limits (blocking; None: none could be made)."""
        limits = self.spec.limits
        name = f"gateway-{self.backend.prefix}{secrets.token_hex(6)}"
        self.group = Cgroup.create(name, limits.memory_bytes, limits.pids, limits.cpus)

    def _on_pidfd(self) -> None:
        """The kernel's pid 1 ended. Its parent tells how (`exited`), unless the parent
        died meanwhile: then, a moment later, the end is known without its status."""
        loop = asyncio.get_running_loop()
        if self.pidfd is not None:
            loop.remove_reader(self.pidfd)
        loop.call_later(PARENT_WORD_WAIT, self._exit_untold)

    def _exit_untold(self) -> None:
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(None)

    def _cgroupfs(self) -> dict[str, Any]:
        """What the kernel's /sys/fs/cgroup shows: its own groups, as in a container."""
        assert self.group is not None
        if self.group.v2:
            return {"v2": True}
        names = sorted({path.parent.name for path in self.group.dirs.values()})
        return {"v2": False, "hierarchies": names}

    def _log_tail(self) -> str:
        return "" if self.sock_fd is None else kernelspec.log_tail(KERNEL_LOG, dir_fd=self.sock_fd)

    async def kill(self) -> None:
        if self.exited is not None and not self.exited.done():
            self._killed = True
            if self.pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        if self.group is not None:
            # also a kernel whose start was cancelled after the fork: it is in the group
            await asyncio.to_thread(self.group.kill_all)
        if self.exited is not None:
            await asyncio.wait([self.exited], timeout=EXIT_WAIT)

    # --- files --------------------------------------------------------------------------

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        if files:
            await asyncio.to_thread(self._stage_blocking, tuple(files))

    def _stage_blocking(self, files: tuple[StagedFile, ...]) -> None:
        assert self.work_fd is not None
        write_staged_files(self.work_fd, files, self.identity.uid, self.identity.gid)

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        assert self.work_fd is not None
        return await asyncio.to_thread(read_files, self.work_fd, WORKDIR, list(patterns), limits)

    # --- what happened ------------------------------------------------------------------

    async def usage(self) -> Usage:
        return Usage() if self.group is None else self.group.usage()

    async def memory_bytes(self) -> int:
        found = None if self.group is None else self.group.current_memory()
        return found or 0

    async def death(self) -> Death | None:
        if self.exited is None or not self.exited.done() or self._killed:
            return None
        status = self.exited.result()
        code = None if status is None else os.waitstatus_to_exitcode(status)
        oom = self.group is not None and self.group.oom_killed()
        return Death(exit_code=code, oom_killed=oom, detail=self._log_tail())

    async def destroy(self) -> None:
        try:
            await self.kill()
        finally:
            if self.pidfd is not None:
                asyncio.get_running_loop().remove_reader(self.pidfd)
            for fd in (*self.namespaces, *self.kept_namespaces):
                os.close(fd)
            self.namespaces, self.kept_namespaces = [], []
            for name in ("pidfd", "work_fd", "sock_fd", "workspace_fd"):
                fd = getattr(self, name)
                if fd is not None:
                    os.close(fd)
                    setattr(self, name, None)
            if self.group is not None:
                # Killed again until it is gone: a fork whose parent died before it answered
                # (spawn failed) may join the group after the kill above found it empty
                if not await asyncio.to_thread(self.group.kill_and_remove):
                    log.warning(
                        "a forked kernel's cgroup %s stays: it cannot be removed", self.group.name
                    )
                self.group = None
            self.identity.release()
