"""`DockerSandbox`: one container per kernel (production).

Each container: no network (`network_mode: none`), ZMQ over ipc sockets on a tiny tmpfs
volume (the only thing the gateway touches on the host, besides a read-only connection
file), read-only root, size-limited tmpfs working folder and /tmp, uid 1000, all
capabilities dropped, no-new-privileges, an init, and memory (swap off), CPU and pids
limits. Files go in with `put_archive` before the kernel starts and come out by running
`kernels.returnfiles` inside the sandbox, so the gateway never reads a path the kernel
controls. Every Docker SDK call runs on a thread pool of the backend's own: the SDK is
synchronous and the event loop must never block (DESIGN.md decision 8).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import docker.errors
from docker.types import Mount

import docker
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
from gateway.sandbox.staging import refuse_links, staged_tar
from gateway.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

KERNEL_UID = 1000
WORKDIR = "/workspace"
SOCKET_DIR = "/run/kernel"
CONNECTION_FILE = "/run/gateway/connection.json"
IMAGE_PATH = "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"
LABEL_INSTANCE = "gateway.instance"
LABEL_RUN = "gateway.run"


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


class DockerBackend(SandboxBackend):
    name = "docker"

    def __init__(self, settings: Settings, instance_id: str) -> None:
        self.settings = settings
        self.instance_id = instance_id
        self.prefix = f"gw{instance_id[:6]}-"
        workers = settings.max_concurrent_runs * 3 + 8
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="docker")
        self._client: docker.DockerClient | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            raise RuntimeError("the Docker backend was not started")
        return self._client

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking Docker SDK call on the backend's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    @property
    def workdir(self) -> str:
        return WORKDIR

    async def startup(self) -> None:
        self._client = await self.call(
            docker.from_env, timeout=120, max_pool_size=self.settings.max_concurrent_runs * 3 + 8
        )
        removed = await self.call(self._remove_ours)
        if removed:
            log.warning(
                "removed %d containers/volumes a previous run of this gateway left", removed
            )

    async def shutdown(self) -> None:
        if self._client is not None:
            await self.call(self._remove_ours)
            self._client.close()
            self._client = None
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _remove_ours(self) -> int:
        """Remove every container and volume of this instance (none is live when called)."""
        label = f"{LABEL_INSTANCE}={self.instance_id}"
        count = 0
        for container in self.client.containers.list(all=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
                count += 1
        for volume in self.client.volumes.list(filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove(force=True)
                count += 1
        for path in Path(tempfile.gettempdir()).glob(self.prefix + "*"):
            shutil.rmtree(path, ignore_errors=True)
        return count

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        sandbox = DockerSandbox(self, spec)
        try:
            await self.call(sandbox.create_blocking)
        except BaseException:
            await sandbox.destroy()
            raise
        return sandbox


class DockerSandbox(Sandbox):
    def __init__(self, backend: DockerBackend, spec: SandboxSpec) -> None:
        self.backend = backend
        self.spec = spec
        self.labels = {LABEL_INSTANCE: backend.instance_id, LABEL_RUN: spec.run_id}
        self.host_dir = Path(tempfile.mkdtemp(prefix=backend.prefix))
        self.name = f"gw-{backend.instance_id[:8]}-{spec.run_id[-12:]}"
        self.container: Any = None
        self.volumes: list[Any] = []
        self.key = new_key()
        self._cgroup: Cgroup | None = None
        self._state: dict[str, Any] = {}
        self._staged: bytes | None = None

    # --- creation (blocking, on the backend's pool) -------------------------------------

    def _volume(self, suffix: str, options: str) -> Any:
        volume = self.backend.client.volumes.create(
            name=f"{self.name}-{suffix}",
            driver="local",
            driver_opts={"type": "tmpfs", "device": "tmpfs", "o": options},
            labels=self.labels,
        )
        self.volumes.append(volume)
        return volume

    def create_blocking(self) -> None:
        limits = self.spec.limits
        sockets = self._volume(
            "sock", f"size=1m,nr_inodes=64,uid={KERNEL_UID},gid={KERNEL_UID},mode=0700"
        )
        mounts = [Mount(SOCKET_DIR, sockets.name, type="volume")]
        if self.spec.workspace is not None:
            # the kernel's user must be able to write into the persistent workspace
            os.chown(self.spec.workspace, KERNEL_UID, KERNEL_UID, follow_symlinks=False)
            mounts.append(Mount(WORKDIR, str(self.spec.workspace), type="bind"))
        else:
            work = self._volume(
                "work", f"size={limits.workdir_bytes},uid={KERNEL_UID},gid={KERNEL_UID},mode=0755"
            )
            mounts.append(Mount(WORKDIR, work.name, type="volume"))
        info = connection_info(f"{SOCKET_DIR}/s", self.key)
        write_connection_file(self.host_dir / "connection.json", info)
        mounts.append(
            Mount(
                CONNECTION_FILE, str(self.host_dir / "connection.json"), type="bind", read_only=True
            )
        )
        env = kernel_env("/tmp", {}, IMAGE_PATH)
        env.update({"PYTHONPATH": "/opt/gateway", "GATEWAY_MPL_CACHE": "/opt/gateway/mplcache"})
        env.update(self.spec.env)
        self.container = self.backend.client.containers.create(
            self.backend.settings.docker_image,
            command=kernel_argv(self.spec.language, "python", CONNECTION_FILE),
            name=self.name,
            user=f"{KERNEL_UID}:{KERNEL_UID}",
            working_dir=WORKDIR,
            environment=env,
            labels=self.labels,
            network_mode="bridge" if self.spec.network else "none",
            read_only=True,
            tmpfs={"/tmp": f"size={limits.tmp_bytes},mode=1777"},
            mounts=mounts,
            init=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            ipc_mode="private",
            detach=True,
        )

    # --- files --------------------------------------------------------------------------

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        # A tmpfs volume only keeps its content while a container has it mounted, so the
        # files go in right after the container starts, before `start()` returns and so
        # before the kernel can run any code.
        if files:
            if self.spec.workspace is not None:  # a persistent folder earlier runs controlled
                await asyncio.to_thread(refuse_links, self.spec.workspace, files)
            self._staged = staged_tar(files, KERNEL_UID, KERNEL_UID)

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        request = json.dumps(
            {
                "root": WORKDIR,
                "patterns": list(patterns),
                "max_files": limits.max_files,
                "max_file_bytes": limits.max_file_bytes,
                "max_total_bytes": limits.max_total_bytes,
            }
        )
        command = ["python", "-m", "kernels.returnfiles", request]
        output = await self.backend.call(self._read_blocking, command)
        try:
            answer = json.loads(output)
        except json.JSONDecodeError:
            return FilesRead(files=[], notes=["The return files could not be read back."])
        return FilesRead(files=answer["files"], notes=answer["notes"])

    def _read_blocking(self, command: list[str]) -> bytes:
        """Read inside the sandbox: by exec while it runs, else in a helper container."""
        self.container.reload()
        if self.container.status == "running":
            result = self.container.exec_run(
                command,
                user=f"{KERNEL_UID}:{KERNEL_UID}",
                workdir=WORKDIR,
                demux=True,
                environment={"PYTHONPATH": "/opt/gateway", "PATH": IMAGE_PATH},
            )
            stdout, _ = result.output
            return stdout or b""
        mounts = [
            Mount(
                WORKDIR,
                m["Name"] if m["Type"] == "volume" else m["Source"],
                type=m["Type"],
                read_only=True,
            )
            for m in self.container.attrs["Mounts"]
            if m["Destination"] == WORKDIR
        ]
        helper = self.backend.client.containers.create(
            self.backend.settings.docker_image,
            command=command,
            user=f"{KERNEL_UID}:{KERNEL_UID}",
            working_dir=WORKDIR,
            environment={"PYTHONPATH": "/opt/gateway", "PATH": IMAGE_PATH},
            labels=self.labels,
            network_mode="none",
            read_only=True,
            mounts=mounts,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=256 * 1024 * 1024,
            pids_limit=16,
        )
        try:
            helper.start()
            helper.wait(timeout=60)
            return bytes(helper.logs(stdout=True, stderr=False))
        finally:
            helper.remove(force=True)

    # --- the kernel ---------------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        try:
            await self.backend.call(self.container.start)
            if self._staged is not None:
                await self.backend.call(self.container.put_archive, WORKDIR, self._staged)
            attrs = await self.backend.call(self._inspect)
        except docker.errors.APIError as exc:
            raise SandboxError(f"The kernel container could not start: {exc.explanation}") from exc
        pid = attrs["State"].get("Pid") or 0
        self._cgroup = Cgroup.of_process(pid) if pid else None
        mountpoint = self.volumes[0].attrs.get("Mountpoint") or await self.backend.call(
            lambda: self.backend.client.volumes.get(self.volumes[0].name).attrs["Mountpoint"]
        )
        return connection_info(f"{mountpoint}/s", self.key)

    def _inspect(self) -> dict[str, Any]:
        self.container.reload()
        attrs: dict[str, Any] = self.container.attrs
        self._state = attrs.get("State", {})
        return attrs

    async def wait_exit(self) -> None:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            await self.backend.call(self.container.wait)

    async def kill(self) -> None:
        if self.container is None:
            return
        await self.backend.call(self._kill_blocking)

    def _kill_blocking(self) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.container.kill()
        with contextlib.suppress(docker.errors.DockerException, OSError):
            self.container.wait(timeout=30)

    # --- what happened ------------------------------------------------------------------

    async def usage(self) -> Usage:
        usage = Usage()
        if self._cgroup is not None:
            cpu_ns = self._cgroup.cpu_ns()
            usage.cpu_ms = None if cpu_ns is None else cpu_ns // 1_000_000
            usage.peak_memory_bytes = self._cgroup.peak_memory()
        return usage

    async def death(self) -> Death | None:
        with contextlib.suppress(docker.errors.DockerException):
            await self.backend.call(self._inspect)
        if self._state.get("Running", True):
            return None
        return Death(
            exit_code=self._state.get("ExitCode"),
            oom_killed=bool(self._state.get("OOMKilled")),
            detail=self._state.get("Error", ""),
        )

    async def limit_events(self) -> frozenset[LimitEvent]:
        events: set[LimitEvent] = set()
        if self._cgroup is not None:
            if self._cgroup.oom_killed():
                events.add("memory")
            if self._cgroup.pids_limit_hit():
                events.add("pids")
        with contextlib.suppress(docker.errors.DockerException):
            await self.backend.call(self._inspect)
        if self._state.get("OOMKilled"):
            events.add("memory")
        return frozenset(events)

    async def destroy(self) -> None:
        await self.backend.call(self._destroy_blocking)

    def _destroy_blocking(self) -> None:
        try:
            if self.container is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    self.container.remove(force=True)
            for volume in self.volumes:
                with contextlib.suppress(docker.errors.NotFound):
                    volume.remove(force=True)
        finally:
            shutil.rmtree(self.host_dir, ignore_errors=True)
