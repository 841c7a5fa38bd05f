"""The sandbox interface: the only thing the execution layer knows about processes or Docker.

A `SandboxBackend` lives as long as the gateway; it makes one `Sandbox` per run. A sandbox
holds exactly one kernel and is destroyed after that kernel's one run (or one notebook).

Who calls what, in order (all from `gateway.execution`):

    async with backend.sandbox(spec) as sandbox:   # create; destroy() always runs on exit
        await sandbox.stage_files(files)           # before start: the kernel sees them at once
        info = await sandbox.start()               # kernel up, its sockets bound and taken
        ... the kernel client talks to `info` ...  #   from it (see sockets.py)
        await sandbox.wait_exit()                  # any number of waiters, one watch
        files = await sandbox.read_files(patterns) # after the run (also after a timeout);
                                                   #   freezes or ends the sandbox first
        usage = await sandbox.usage()              # before kill(): the cgroup goes with it
        hits = await sandbox.limit_events()        # memory / pids limits that struck
        death = await sandbox.death()              # how the kernel died, if it did
        await sandbox.kill()                       # every process of the sandbox ends

Files go in and out on the gateway's side, through descriptors (`staging.py`,
`readback.py`): nothing but the kernel ever runs inside a sandbox. A kernel's exit is
watched once per sandbox, without holding a thread for the kernel's lifetime.
`kill()` and `destroy()` are idempotent and must never raise for a sandbox that is already
gone. Nothing a sandbox creates (process, container, socket file, temp folder, volume,
mount) may outlive `destroy()`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from gateway.models.common import Language
from gateway.models.record import Usage
from gateway.models.request import StagedFile, WorkspaceRef

LimitEvent = Literal["memory", "pids"]


@dataclasses.dataclass(frozen=True)
class Limits:
    cpus: float
    memory_bytes: int
    pids: int
    workdir_bytes: int
    tmp_bytes: int


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    max_files: int
    max_file_bytes: int
    max_total_bytes: int


@dataclasses.dataclass(frozen=True)
class FilesRead:
    """`return_files` entries in the API's shape, and notes about what was left out."""

    files: list[dict[str, Any]]
    notes: list[str]


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox needs to know to start one kernel."""

    run_id: str
    language: Language
    limits: Limits
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    network: bool = False
    workspace: WorkspaceRef | None = None  # a persistent folder used as the working folder


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What a sandbox holds on the machine, by name (for operators and leak checks)."""

    containers: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Death:
    """How a kernel ended when it was not ended by us."""

    exit_code: int | None
    oom_killed: bool = False
    detail: str = ""


class Sandbox(abc.ABC):
    """One kernel in its own sandbox. See the module docstring for the calling order."""

    @abc.abstractmethod
    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        """Write validated files into the working folder; folders are created."""

    @abc.abstractmethod
    async def start(self) -> dict[str, Any]:
        """Start the kernel; return connection info a jupyter_client can load (ipc transport)
        once the kernel has bound its sockets and the socket folder is no longer its."""

    @abc.abstractmethod
    async def wait_exit(self) -> None:
        """Return when the kernel process (or its container) has exited, for whatever reason."""

    @abc.abstractmethod
    def has_exited(self) -> bool:
        """Whether the kernel process (or its container) has exited."""

    @abc.abstractmethod
    async def set_memory_limit(self, memory_bytes: int) -> bool:
        """Lower the running sandbox's memory limit (a pooled kernel taken by a run that
        asks for less); False when this sandbox cannot."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """End the kernel and every process it started. Files stay for `read_files`."""

    @abc.abstractmethod
    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        """Read `return_files` back, never following a link out of the working folder.
        The sandbox is frozen or killed first: nothing changes the folder meanwhile."""

    @abc.abstractmethod
    async def usage(self) -> Usage:
        """CPU time and peak memory of the sandbox so far (wall time is the runner's)."""

    @abc.abstractmethod
    async def death(self) -> Death | None:
        """How the kernel died, or None while it lives or when `kill()` ended it."""

    @abc.abstractmethod
    async def limit_events(self) -> frozenset[LimitEvent]:
        """Which limits struck so far (OOM kill of any process, pids limit reached)."""

    @abc.abstractmethod
    def footprint(self) -> Footprint:
        """What this sandbox holds on the machine now."""

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Remove everything the sandbox made. Called exactly once, by the context manager."""


class SandboxBackend(abc.ABC):
    """Makes sandboxes; lives as long as the gateway."""

    name: str

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Create (but do not start) a sandbox. The caller must `destroy()` it."""

    async def startup(self) -> None:  # noqa: B027 - optional hook
        """Called once when the gateway starts (e.g. to remove orphans of a crash)."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Called once when the gateway stops, after every sandbox was destroyed."""

    @contextlib.asynccontextmanager
    async def sandbox(self, spec: SandboxSpec) -> AsyncIterator[Sandbox]:
        sandbox = await self.create(spec)
        try:
            yield sandbox
        finally:
            await sandbox.destroy()
