"""`DockerSandbox`: one container per kernel (production).

Each container: no network (`network_mode: none`), ZMQ over ipc sockets on a tiny tmpfs,
read-only root, a size-limited tmpfs working folder and /tmp, a uid of its own
(`tenancy.py`: outside the host's account range) and `sandbox_gid`, all capabilities
dropped, no-new-privileges, an init, memory (swap off), CPU and pids limits, and no
container log on the host (`log_config: none`: a kernel writing to its own stdout cannot
fill the host's disk).

The socket folder and the working folder are tmpfs mounts the gateway makes itself in the
sandbox's root-only folder on the host (`mounts.mount_tmpfs`), bind-mounted into the
container: no Docker volume is created or removed per run (each cost engine round trips and
writes to the engine's volume database), and the container is made with one `create` call.
Only that container mounts them; `remove_tree` unmounts them when the sandbox is destroyed,
or after a crash when the gateway starts again.

A run without network gets a container with networking disabled in the engine
(`network_disabled`): runc gives it a fresh network namespace with only `lo`, up, as
`network_mode: none` does, but dockerd sets up no libnetwork sandbox for it and runc runs no
`libnetwork-setkey` hook (a re-exec of the dockerd binary) per container: about a third of
a container's set-up CPU. What the engine would have written for it, `/etc/hosts` (the same
lines as for `none`) and `/etc/hostname` (a random name, also the UTS hostname), comes from
read-only files of the sandbox folder; there is no `/etc/resolv.conf` (nothing to resolve
with, and the host's nameserver is not the tenant's business). `/etc/passwd` and
`/etc/group` are read-only files of the sandbox folder too, for every run: the image's own,
read once when the backend starts, with the entries of the sandbox's uid and gid
(`accounts.py`).

Nothing runs inside the container but the kernel. Files go in and come out on the
gateway's side, through descriptors: staged files are written into the working folder as
the host mounts it, right after the container starts and before the kernel can run any
code; `return_files` are read after the container is frozen (`pause`). A persistent
workspace is opened by descriptor when the sandbox is created (`workspace.py`) and handed
to Docker as a `nosuid,nodev` bind mount of that descriptor in a root-only folder
(`mounts.py`), so a path swapped by another run can never be mounted or chowned.

Where the engine manages cgroups itself (its `cgroupfs` driver), each container is made
inside a cgroup of its sandbox's own (`cgroup_parent`, named after the sandbox's folder):
the engine removes a container's own group as soon as the container stops, and its parent's
counters, which include the container's, are the sandbox's usage until it is destroyed, so
a kernel that died or was killed for memory still has its CPU and peak told. (With
systemd's driver the container's own group is read while it lives.)

Engine calls run on a thread pool of the backend's own (the SDK is synchronous, DESIGN.md
decision 8), each bounded by `docker_call_timeout`; kills and removals have a pool of
their own, so a busy engine can never starve the deadline. A container's exit is learned
once, from the engine's event stream (`docker_events.py`), never by parking a thread in
`Container.wait()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docker.errors
from docker.types import LogConfig, Mount

import docker
from gateway.errors import SandboxError
from gateway.models.record import Usage
from gateway.models.request import StagedFile
from gateway.sandbox import kernelspec
from gateway.sandbox.accounts import BASE_FILES, MAX_BASE_BYTES, RootAccounts
from gateway.sandbox.base import (
    BackendContext,
    Death,
    ExitingSandbox,
    FilesRead,
    KernelEnvironment,
    LimitEvent,
    ReadLimits,
    SandboxBackend,
    SandboxSpec,
    to_the_end,
)
from gateway.sandbox.cgroup import Cgroup
from gateway.sandbox.docker_events import ExitWatcher
from gateway.sandbox.environment import EnvironmentCache, read_from_image
from gateway.sandbox.image_files import read_image_files
from gateway.sandbox.mounts import bind_fd, mount_tmpfs, remove_tree
from gateway.sandbox.readback import read_files
from gateway.sandbox.seccomp import docker_profile
from gateway.sandbox.sockets import secure_sockets
from gateway.sandbox.staging import write_staged_files
from gateway.sandbox.tenancy import Identity, Tenancy, TenancyConfig
from gateway.sandbox.workspace import open_workspace

log = logging.getLogger(__name__)
SECCOMP_PROFILE = docker_profile()  # JSON, the same filter as a forked kernel's

T = TypeVar("T")

WORKDIR = "/workspace"
SOCKET_DIR = "/run/kernel"
CONNECTION_FILE = "/run/gateway/connection.json"
LABEL_INSTANCE = "gateway.instance"
LABEL_RUN = "gateway.run"
KERNEL_LOG = "kernel.log"
# Docker's own /etc/hosts for a container with `network_mode: none`
ETC_HOSTS = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\n"
    "ff02::1\tip6-allnodes\n"
    "ff02::2\tip6-allrouters\n"
)
REMOVAL_WAIT = 30.0  # seconds another removal of the same container may take
KILL_WORKERS = 4
EXIT_WAIT = 10.0  # after a kill: how long to wait for the engine's `die` event


def probe_docker(image: str) -> tuple[bool, str]:
    """Whether an engine answers and has `image`; the reason either way (blocking)."""
    try:
        client = docker.from_env(timeout=5)
    except docker.errors.DockerException as exc:
        return False, f"no Docker engine answers ({exc.__class__.__name__})"
    try:
        client.ping()
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False, f"the Docker engine has no image {image} (run docker/build.sh)"
    except docker.errors.DockerException as exc:
        return False, f"no Docker engine answers ({exc.__class__.__name__})"
    finally:
        client.close()
    return True, f"a Docker engine answers and has the image {image}"


def not_started(exc: docker.errors.APIError) -> SandboxError:
    """The engine's refusal to start (or to describe) a new kernel container."""
    return SandboxError(f"The kernel container could not start: {exc.explanation}")


def remove_container(container: Any) -> None:
    """Remove a container, killing it first. Two removals may race (a run's teardown and the
    gateway's shutdown): the engine answers the second with 409 "already in progress", and
    then this waits until the container is gone, so that its folders can go too."""
    try:
        container.remove(force=True)
        return
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
    deadline = time.monotonic() + REMOVAL_WAIT
    while time.monotonic() < deadline:
        try:
            container.reload()
        except docker.errors.NotFound:
            return
        time.sleep(0.1)
    container.remove(force=True)  # still there: the engine's own answer is the error


@dataclasses.dataclass(frozen=True)
class DockerConfig:
    """The settings the Docker backend reads (each field takes the setting of its name)."""

    docker_image: str
    docker_network: str | None
    docker_call_timeout: float
    allow_network: bool
    kernel_start_timeout: float
    max_concurrent_runs: int  # sizes the pool of threads for engine calls
    tenancy: TenancyConfig


class DockerBackend(SandboxBackend):
    name = "docker"
    config_type = DockerConfig
    extra = "docker"
    auto_preference = 10
    isolates_users = True

    def __init__(self, config: DockerConfig, context: BackendContext) -> None:
        super().__init__(config, context)
        self.config: DockerConfig = config
        self.tenancy = Tenancy(config.tenancy, context.multi_user)
        self.prefix = f"gw{self.instance_id[:6]}-"
        workers = config.max_concurrent_runs * 2 + 4
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="docker")
        self._kill_executor = concurrent.futures.ThreadPoolExecutor(
            KILL_WORKERS, thread_name_prefix="docker-kill"
        )
        self._client: docker.DockerClient | None = None
        self._watcher: ExitWatcher | None = None
        self._environment = EnvironmentCache()
        self.accounts = RootAccounts()  # the image's own, read when the backend starts
        # each container in a cgroup of the sandbox's own (`cgroup_parent`), whose counters
        # outlive the container: where the engine manages cgroups itself (not systemd's)
        self.cgroup_parents = False

    @classmethod
    async def probe(cls, config: DockerConfig) -> tuple[bool, str]:
        """Whether an engine answers and has the kernel image (asked in a thread)."""
        return await asyncio.to_thread(probe_docker, config.docker_image)

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            raise RuntimeError("the Docker backend was not started")
        return self._client

    @property
    def watcher(self) -> ExitWatcher:
        if self._watcher is None:
            raise RuntimeError("the Docker backend was not started")
        return self._watcher

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A blocking SDK call on the backend's pool, bounded by `docker_call_timeout`."""
        return await self._bounded(self._executor, fn, *args, **kwargs)

    async def call_kill(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The same on the pool kept for kills and removals (never starved by other work)."""
        return await self._bounded(self._kill_executor, fn, *args, **kwargs)

    async def _bounded(
        self, pool: concurrent.futures.Executor, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(pool, functools.partial(fn, *args, **kwargs))
        timeout = self.config.docker_call_timeout
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise SandboxError(f"The Docker engine did not answer within {timeout:g} s.") from None

    async def environment(self) -> KernelEnvironment | None:
        """The kernel image's environment.json, read again only when the image changes (an
        engine that fails to answer is asked again next time)."""
        image = self.config.docker_image
        try:
            image_id = (await self.call(self.client.api.inspect_image, image)).get("Id", "")
            found = await self._environment.get(
                str(image_id),
                lambda: self.call(
                    read_from_image, self.client.api, image, {LABEL_INSTANCE: self.instance_id}
                ),
            )
        except (SandboxError, docker.errors.DockerException) as exc:
            log.warning("could not read the kernel image's environment: %s", exc)
            return None
        return None if found is None else KernelEnvironment(found, "image", image)

    @property
    def meters_cpu(self) -> bool:
        # a container's own cgroup goes with it (a kernel that died): its usage is read from
        # the parent the gateway makes, which only the cgroupfs driver takes
        return self.cgroup_parents

    async def startup(self) -> None:
        timeout = max(1, int(self.config.docker_call_timeout))
        pool = self.config.max_concurrent_runs * 2 + KILL_WORKERS + 4
        self._client = await self.call(docker.from_env, timeout=timeout, max_pool_size=pool)
        if self.config.allow_network:
            await self.call(self._check_network)
        await self.tenancy.startup(switch_users=True)
        info = await self.call(self.client.info)
        self.cgroup_parents = info.get("CgroupDriver") == "cgroupfs"
        removed = await self.call(self._remove_ours)
        if removed:
            log.warning(
                "removed %d containers/volumes a previous run of this gateway left", removed
            )
        try:
            self.accounts = await self.call(self._read_accounts)
        except (SandboxError, docker.errors.DockerException) as exc:  # the minimal ones
            log.warning("could not read the kernel image's account files: %s", exc)
        self._watcher = ExitWatcher(
            docker.from_env(timeout=timeout), f"{LABEL_INSTANCE}={self.instance_id}"
        )
        await self._watcher.start()

    async def shutdown(self) -> None:
        if self._watcher is not None:
            await self._watcher.close()
            self._watcher = None
        # An engine call still in a thread (a pooled kernel's container being created when
        # its start was cancelled) may add a container or volume after the sweep below:
        # let those calls end first. Every engine call has a timeout, so this is bounded.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        if self._client is not None:
            with contextlib.suppress(SandboxError, docker.errors.DockerException):
                await self.call_kill(self._remove_ours)
            self._client.close()
            self._client = None
        self._kill_executor.shutdown(wait=False, cancel_futures=True)
        await self.tenancy.shutdown()

    def _read_accounts(self) -> RootAccounts:
        """The kernel image's /etc/passwd, /etc/group and /etc/shells (blocking)."""
        paths = [f"/{name}" for name in BASE_FILES]
        labels = {LABEL_INSTANCE: self.instance_id}
        api = self.client.api
        found = read_image_files(api, self.config.docker_image, paths, labels, MAX_BASE_BYTES)
        return RootAccounts.parse(*(found.get(path) for path in paths))

    def _check_network(self) -> None:
        """`network: true` joins the operator's own network, never the host's or the
        default bridge (which reaches the host, and through it the metadata address)."""
        name = self.config.docker_network
        if not name:
            raise RuntimeError(
                "--allow-network on the Docker backend needs --docker-network NAME: a network "
                "you created for runs, with egress rules that keep them off this host and "
                "the cloud metadata address (README, 'Network for runs')."
            )
        try:
            network = self.client.networks.get(name)
        except docker.errors.NotFound:
            raise RuntimeError(
                f"--docker-network {name}: there is no such Docker network"
            ) from None
        driver = network.attrs.get("Driver")
        if name in ("host", "bridge", "none") or driver in ("host", "null"):
            raise RuntimeError(
                f"--docker-network {name} ({driver}) would give runs the host's network or the "
                "default bridge; create a network of their own"
            )

    def _remove_ours(self) -> int:
        """Remove every container, volume (older versions made some) and folder of this instance
        (none is live when called)."""
        label = f"{LABEL_INSTANCE}={self.instance_id}"
        count = 0
        for container in self.client.containers.list(all=True, filters={"label": label}):
            remove_container(container)
            count += 1
        for volume in self.client.volumes.list(filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove(force=True)
                count += 1
        for path in Path(tempfile.gettempdir()).glob(self.prefix + "*"):
            with contextlib.suppress(OSError):
                remove_tree(path)
        Cgroup.remove_matching(f"gateway-{self.prefix}")  # the sandboxes' own (emptied)
        return count

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        identity = await self.tenancy.identity(spec.workspace)
        try:
            sandbox = DockerSandbox(self, spec, identity)
        except BaseException:
            identity.release()
            raise
        try:
            await to_the_end(asyncio.to_thread(sandbox.open_workspace))
            await to_the_end(self.call(sandbox.create_blocking))
            sandbox.exited = self.watcher.watch(sandbox.container.id)
        except BaseException:
            await to_the_end(sandbox.destroy())
            raise
        return sandbox


class DockerSandbox(ExitingSandbox[int | None]):
    def __init__(self, backend: DockerBackend, spec: SandboxSpec, identity: Identity) -> None:
        self.backend = backend
        self.spec = spec
        self.identity = identity  # who the kernel runs as (tenancy.py)
        self.config = backend.config
        self.labels = {LABEL_INSTANCE: backend.instance_id, LABEL_RUN: spec.run_id}
        self.host_dir = Path(tempfile.mkdtemp(prefix=backend.prefix))  # root-only (0700)
        self.name = f"gw-{backend.instance_id[:8]}-{spec.run_id[-12:]}"
        self.container: Any = None
        self.socket_dir = self.host_dir / "sock"
        self.work_dir: Path | None = None  # the working folder's tmpfs, without a workspace
        self.key = kernelspec.new_key()
        self.workspace_fd: int | None = None
        self.workspace_mount: Path | None = None
        self.exited: asyncio.Future[int | None] | None = None
        self._cgroup: Cgroup | None = None  # the container's own
        # the sandbox's group, the container's parent (`cgroup_parent`): the container's
        # usage, still there after the engine removed the container's own group (a kernel
        # that died, was killed for memory, or ended itself), until the sandbox is destroyed
        group = f"gateway-{self.host_dir.name}"
        self.usage_group = Cgroup.named(group) if backend.cgroup_parents else None
        self._state: dict[str, Any] = {}
        self._staged: tuple[StagedFile, ...] = ()
        self._frozen = False
        self._started = False

    # --- creation (blocking, on the backend's pool) -------------------------------------

    def _tmpfs(self, target: Path, options: str, *, noexec: bool = False) -> None:
        target.mkdir(mode=0o700)
        try:
            mount_tmpfs(target, options, noexec=noexec)
        except OSError as exc:  # not root, or no tmpfs: the run fails, the gateway does not
            raise SandboxError(
                f"The kernel's sandbox could not mount its {target.name} folder: {exc.strerror} "
                "(the Docker backend needs root)."
            ) from exc

    def open_workspace(self) -> None:
        """The run's workspace, opened as the kernel's uid (in a thread), is the sandbox's."""
        if (workspace := self.spec.workspace) is not None:
            self.workspace_fd = open_workspace(workspace, self.identity.uid, self.identity.gid)

    def create_blocking(self) -> None:
        limits, config = self.spec.limits, self.config
        ids = f"uid={self.identity.uid},gid={self.identity.gid}"
        # the kernel's until it has bound its sockets, then root's (sockets.py)
        self._tmpfs(self.socket_dir, f"size=1m,nr_inodes=64,{ids},mode=0700", noexec=True)
        mounts = [Mount(SOCKET_DIR, str(self.socket_dir), type="bind")]
        if self.workspace_fd is not None:
            self.workspace_mount = self.host_dir / "workspace"
            self.workspace_mount.mkdir(mode=0o700)
            bind_fd(self.workspace_fd, self.workspace_mount)
            mounts.append(Mount(WORKDIR, str(self.workspace_mount), type="bind"))
        else:
            self.work_dir = self.host_dir / "work"
            self._tmpfs(self.work_dir, f"size={limits.workdir_bytes},{ids},mode=0755")
            mounts.append(Mount(WORKDIR, str(self.work_dir), type="bind"))
        info = kernelspec.connection_info(f"{SOCKET_DIR}/s", self.key)
        kernelspec.write_connection_file(self.host_dir / "connection.json", info)
        mounts.append(
            Mount(
                CONNECTION_FILE, str(self.host_dir / "connection.json"), type="bind", read_only=True
            )
        )
        accounts = self.backend.accounts.for_sandbox(
            self.identity.uid, self.identity.gid, kernelspec.IMAGE_HOME
        )
        mounts += [
            self._etc_file("passwd", accounts.passwd),
            self._etc_file("group", accounts.group),
        ]
        hostname = None
        if not self.spec.network:
            hostname = secrets.token_hex(6)
            mounts += [
                self._etc_file("hosts", ETC_HOSTS),
                self._etc_file("hostname", hostname + "\n"),
            ]
        env = {**kernelspec.image_env(), **self.spec.env}
        # The kernel's own stdout/stderr (not the user's: those go over ZMQ) land in a file
        # on the 1 MiB socket tmpfs: bounded, and readable when the kernel dies.
        argv = kernelspec.kernel_argv(self.spec.language, "python", CONNECTION_FILE)
        logged = ["/bin/sh", "-c", f'exec "$@" >>{SOCKET_DIR}/{KERNEL_LOG} 2>&1', "sh", *argv]
        api = self.backend.client.api
        host_config = api.create_host_config(
            network_mode=(config.docker_network or "none") if self.spec.network else "none",
            read_only=True,
            tmpfs={"/tmp": f"size={limits.tmp_bytes},mode=1777,nosuid,nodev"},
            mounts=mounts,
            init=True,
            cap_drop=["ALL"],
            # our filter, not the engine's default (its `socket` rule lets AF_VSOCK by)
            security_opt=["no-new-privileges", f"seccomp={SECCOMP_PROFILE}"],
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            ipc_mode="private",
            log_config=LogConfig(type=LogConfig.types.NONE),
            cgroup_parent=None if self.usage_group is None else f"/{self.usage_group.name}",
        )
        # The low-level call: `containers.create` would inspect the new container at once,
        # an engine round trip per run for attributes nothing here reads (start inspects).
        created = api.create_container(
            config.docker_image,
            command=logged,
            name=self.name,
            hostname=hostname,
            user=f"{self.identity.uid}:{self.identity.gid}",
            working_dir=WORKDIR,
            environment=env,
            labels=self.labels,
            network_disabled=not self.spec.network,
            host_config=host_config,
            detach=True,  # nothing attaches to its stdio (the kernel logs to a file)
        )
        self.container = self.backend.client.containers.prepare_model({"Id": created["Id"]})

    def _etc_file(self, name: str, text: str) -> Mount:
        path = self.host_dir / f"etc-{name}"
        path.write_text(text, encoding="utf-8")
        path.chmod(0o444)
        return Mount(f"/etc/{name}", str(path), type="bind", read_only=True)

    # --- files --------------------------------------------------------------------------

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        # Written now, through the host's side of the working folder: before `start()`, or
        # (a pooled kernel) before the run's code is sent.
        self._staged = tuple(files)
        if self._staged:
            await asyncio.to_thread(self._stage_blocking)

    def _work_fd(self) -> int:
        """The working folder, open: the workspace, or the working folder's tmpfs."""
        if self.workspace_fd is not None:
            return os.dup(self.workspace_fd)
        assert self.work_dir is not None
        return os.open(self.work_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def _stage_blocking(self) -> None:
        fd = self._work_fd()
        try:
            write_staged_files(fd, self._staged, self.identity.uid, self.identity.gid)
        finally:
            os.close(fd)

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        # the working folder is the gateway's own mount: it outlives the container's processes
        return await asyncio.to_thread(self._read_blocking, list(patterns), limits)

    def _read_blocking(self, patterns: list[str], limits: ReadLimits) -> FilesRead:
        fd = self._work_fd()
        try:
            return read_files(fd, WORKDIR, patterns, limits)
        finally:
            os.close(fd)

    async def freeze(self) -> bool:
        """Pause every process of the container (the freezer cgroup); False if it is no
        longer running. The kill that follows thaws it first."""
        if self._frozen:
            return True
        if self.container is None or self.has_exited():
            return False
        try:
            await self.backend.call_kill(self.container.pause)
        except docker.errors.APIError:
            return False
        self._frozen = True
        return True

    # --- the kernel ---------------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        try:
            await to_the_end(self.backend.call(self.container.start))
            self._started = True
        except docker.errors.APIError as exc:
            raise not_started(exc) from exc
        assert self.exited is not None
        socket_dir = str(self.socket_dir)
        # The container's cgroup (its init's pid, from an inspect) is looked up while the
        # kernel starts: both wait on other processes, neither on the other.
        cgroup = asyncio.ensure_future(self._find_cgroup())
        try:
            await secure_sockets(
                socket_dir,
                "s",
                self.identity.uid,
                asyncio.shield(self.exited),
                self.config.kernel_start_timeout,
            )
        except BaseException as exc:
            cgroup.cancel()
            await asyncio.gather(cgroup, return_exceptions=True)
            if isinstance(exc, SandboxError):
                raise SandboxError(f"{exc.message} {self._log_tail()}".strip()) from exc
            raise
        await cgroup  # an engine that fails the inspect fails the start, as before
        return kernelspec.connection_info(f"{socket_dir}/s", self.key)

    async def _find_cgroup(self) -> None:
        try:
            attrs = await self.backend.call(self._inspect)
        except docker.errors.APIError as exc:
            raise not_started(exc) from exc
        pid = attrs["State"].get("Pid") or 0
        self._cgroup = Cgroup.of_process(pid) if pid else None

    def _log_tail(self) -> str:
        """The end of the kernel's own output (never through a link the kernel made)."""
        return kernelspec.log_tail(self.socket_dir / KERNEL_LOG) if self._started else ""

    def _inspect(self) -> dict[str, Any]:
        self.container.reload()
        attrs: dict[str, Any] = self.container.attrs
        self._state = attrs.get("State", {})
        return attrs

    async def set_memory_limit(self, memory_bytes: int) -> bool:
        try:
            await self.backend.call(
                self.container.update, mem_limit=memory_bytes, memswap_limit=memory_bytes
            )
        except (docker.errors.APIError, SandboxError) as exc:
            log.warning("could not lower a container's memory limit: %s", exc)
            return False
        return True

    async def kill(self) -> None:
        if self.container is None or self.exited is None:
            return
        if not self.exited.done():
            with contextlib.suppress(docker.errors.DockerException, SandboxError):
                await self.backend.call_kill(self._kill_blocking)
            await asyncio.wait([self.exited], timeout=EXIT_WAIT)

    def _kill_blocking(self) -> None:
        if self._frozen:  # a paused container ignores SIGKILL until thawed
            with contextlib.suppress(docker.errors.APIError):
                self.container.unpause()
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.container.kill()

    # --- what happened ------------------------------------------------------------------

    async def usage(self) -> Usage:
        group = self.usage_group or self._cgroup
        if group is None or not self._started:
            return Usage()
        return group.usage()

    async def death(self) -> Death | None:
        with contextlib.suppress(docker.errors.DockerException, SandboxError):
            await self.backend.call(self._inspect)
        if self._state.get("Running", True):
            return None
        return Death(
            exit_code=self._state.get("ExitCode"),
            oom_killed=bool(self._state.get("OOMKilled")),
            detail=self._state.get("Error", "") or self._log_tail(),
        )

    async def limit_events(self) -> frozenset[LimitEvent]:
        events: set[LimitEvent] = set()
        if self._cgroup is not None:
            if self._cgroup.oom_killed():
                events.add("memory")
            if self._cgroup.pids_limit_hit():
                events.add("pids")
        if self._state.get("OOMKilled"):  # as last inspected (death() inspects a dead one)
            events.add("memory")
        return frozenset(events)

    async def destroy(self) -> None:
        try:
            if self.container is not None:
                await self.backend.call_kill(remove_container, self.container)
            if self.usage_group is not None:  # empty once the container is gone
                await asyncio.to_thread(Cgroup.remove_named, self.usage_group.name)
        finally:
            for group in (self.usage_group, self._cgroup):  # their counters' files
                if group is not None:
                    group.close()
            if self.container is not None and self.backend._watcher is not None:
                self.backend._watcher.forget(self.container.id)
            if self.workspace_fd is not None:
                os.close(self.workspace_fd)
                self.workspace_fd = None
            try:
                await asyncio.to_thread(remove_tree, self.host_dir)
            finally:
                self.identity.release()  # the container is gone: another may have its uid
