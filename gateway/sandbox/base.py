"""The sandbox interface: the only thing the execution layer knows about processes or Docker.

A `SandboxBackend` is a plug-in (found by entry point, `factory.py`) that lives as long as
the gateway; it makes one `Sandbox` per kernel. A sandbox holds exactly one kernel and is
destroyed after that kernel's one run (or one notebook), or unused (a pool's, at shutdown).

Who calls what, in order (all from `gateway.execution`; `*`: a capability a backend may
lack, with a default that says so):

      sandbox = await backend.create(spec)       # session.start_session, for a pool or a run
      info = await sandbox.start()               # the same: kernel up, its sockets bound and
                                                 #   taken from it (see sockets.py)
      ... the kernel client talks to `info` ...
      await sandbox.wait_exit()                  # the session and the pool, any number of
                                                 #   waiters, one watch (also has_exited())
    * await sandbox.set_memory_limit(n)          # the pool, when a run takes a pooled kernel
      await sandbox.stage_files(files)           # the executor, before the run's first cell
    * before = await sandbox.usage()             # the executor: the run's CPU counts from here
      ... the cells run ...                      #   (also its staging failed: what it held)
    * after = await sandbox.usage()              # after each cell: the cell's own CPU
      # the executor, after the last cell: the same steps on every backend
    * await sandbox.freeze() or sandbox.kill()   # with return_files: nothing changes the
      files = await sandbox.read_files(patterns) #   working folder while it is read back
    * usage = await sandbox.usage()              # also after the kernel died: still told
    * hits = await sandbox.limit_events()        # memory / pids limits that struck
      death = await sandbox.death()              # after a cell that ended "died"
      # the record is answered; then, off the answer's path:
      await sandbox.kill()                       # every process of the sandbox ends
      await sandbox.destroy()                    # everything the sandbox made goes

A sandbox that is never used (a pooled kernel that died or was not wanted, a start that
failed) is only destroyed: `destroy()` ends whatever still runs. Files go in and out on the
gateway's side, through descriptors (`staging.py`, `readback.py`): nothing but the kernel
ever runs inside a sandbox. A kernel's exit is watched once per sandbox, without holding a
thread for the kernel's lifetime. `kill()` and `destroy()` are idempotent and must never
raise for a sandbox that is already gone. Nothing a sandbox creates (process, container,
socket file, temp folder, volume, mount) may outlive `destroy()`. `create()` and `start()`
may be cancelled at any moment (a run's DELETE, shutdown): what they were making then (in a
thread, or a forked kernel whose answer is on its way) is the sandbox's before the
cancellation goes on (`to_the_end`), so that the `destroy()` that follows finds it.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from gateway.errors import SandboxError
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
    """What a backend holds on the machine for its lifetime, beside its sandboxes (for
    operators and leak checks): warm processes by pid (each alone, not its descendants),
    folders."""

    folders: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Death:
    """How a kernel ended when it was not ended by us."""

    exit_code: int | None
    oom_killed: bool = False
    detail: str = ""


class Sandbox(abc.ABC):
    """One kernel in its own sandbox. See the module docstring for the calling order.

    The abstract methods are what every backend must do; the others are capabilities a
    backend may have, each with a default that says it has not (the executor and the pool
    then do without)."""

    # --- what every backend must do --------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> dict[str, Any]:
        """Start the kernel; return connection info a jupyter_client `Session` can use (ipc
        transport) once the kernel has bound its sockets and the socket folder is no longer
        its. Called once, by `session.start_session`, right after `create`; a start that
        fails raises `SandboxError` (the session then destroys the sandbox)."""

    @abc.abstractmethod
    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        """Write validated files into the working folder; folders are created. Called by
        the executor once, after `start()` and before the run's first cell."""

    @abc.abstractmethod
    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        """Read `return_files` back, never following a link out of the working folder.
        Called by the executor after the last cell (also after a timeout or the kernel's
        death), only once `freeze()` or `kill()` has stopped every process of the sandbox:
        nothing changes the folder meanwhile."""

    @abc.abstractmethod
    async def wait_exit(self) -> None:
        """Return when the kernel process (or its container) has exited, for whatever
        reason. Awaited by the session (a cell ends "died"), the pool (a pooled kernel that
        dies is replaced), any number of times at once."""

    @abc.abstractmethod
    def has_exited(self) -> bool:
        """Whether the kernel process (or its container) has exited. Asked by the pool
        before it hands a pooled kernel out, and by the session when a start fails."""

    @abc.abstractmethod
    async def death(self) -> Death | None:
        """How the kernel died, or None while it lives or when `kill()` ended it (a kernel
        that had died before the kill is still told). Asked by the executor after a cell
        that ended "died", and by the session after a start that failed."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """End the kernel and every process it started (a frozen sandbox too). What the
        sandbox holds (its working folder, how the kernel died) stays until `destroy()`.
        Called by the executor: before `read_files` when the sandbox cannot `freeze()`, and
        at the end of every run, before `destroy()`."""

    @abc.abstractmethod
    async def destroy(self) -> None:
        """End whatever still runs, as `kill()` does, and remove everything the sandbox
        made. Called exactly once, by the sandbox's owner: the executor after `kill()` at
        the end of a run, the pool for a kernel no run will take, the session when a start
        fails."""

    # --- capabilities a backend may have ---------------------------------------------------

    async def freeze(self) -> bool:
        """Stop every process of the sandbox where it is, cheaply, so that the working
        folder can be read back at once and the kill follow off the answer's path (Docker:
        `pause`). Called by the executor before `read_files`; False (the default: this
        sandbox cannot, or the kernel is gone) makes the executor `kill()` it instead."""
        return False

    async def usage(self) -> Usage:
        """CPU time and peak memory of the sandbox so far (wall time is the executor's),
        until it is destroyed: also once its kernel died or was killed. Asked by the
        executor (`execution.meter`) before the run's first cell, after each cell and after
        the last, on the event loop: it must not block (cgroup counters are read in
        microseconds). Default: nothing known (the record's usage fields stay null)."""
        return Usage()

    async def limit_events(self) -> frozenset[LimitEvent]:
        """Which limits struck so far (an OOM kill of any process, the pids limit reached).
        Asked by the executor after the last cell: they decide the run's kill reason.
        Default: none known."""
        return frozenset()

    async def memory_bytes(self) -> int:
        """The memory the sandbox holds now (a kept snapshot's, counted against its
        owner's limit). Default: 0, nothing known."""
        return 0

    async def set_memory_limit(self, memory_bytes: int) -> bool:
        """Lower the running sandbox's memory limit. Called by the pool when a run that asks
        for less memory takes a pooled kernel; False (the default: this sandbox cannot)
        makes the run start a kernel of its own instead."""
        return False


ExitT = TypeVar("ExitT")


class ExitingSandbox(Sandbox, Generic[ExitT]):
    """A sandbox whose kernel's end is a future, `exited`: set once the kernel (or its
    container) was started, done when it has exited; its result says how."""

    exited: asyncio.Future[ExitT] | None = None

    async def wait_exit(self) -> None:
        if self.exited is not None:
            await asyncio.wait([self.exited])

    def has_exited(self) -> bool:
        return self.exited is not None and self.exited.done()


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """The configuration of a backend that reads no setting."""


@dataclasses.dataclass(frozen=True)
class BackendContext:
    """What a backend is told about the gateway that starts it, beside its own settings."""

    instance_id: str  # names what the backend makes, so a crashed gateway's leftovers are found
    multi_user: bool = False  # the token file names several users
    private_paths: tuple[Path, ...] = ()  # the gateway's own files: no kernel may see them


@dataclasses.dataclass(frozen=True)
class KernelEnvironment:
    """`SandboxBackend.environment`'s answer: `kernels.environment`'s JSON, and where it was
    read (the kernel image, or the environment local kernels run from)."""

    found: dict[str, Any]
    source: Literal["image", "local"]
    image: str | None = None


class SandboxBackend(abc.ABC):
    """A kind of sandbox: a plug-in found by entry point in the `gateway.backends` group
    (`factory.py`), made once when the gateway starts, and living as long as it.

    The factory builds `config_type` from the settings (each field takes the setting of its
    name: a backend reads only what it declares) and calls `cls(config, context)`."""

    name: ClassVar[str]
    config_type: ClassVar[type[Any]] = NoConfig
    # the pip extra whose packages the backend needs (gateway/extras.py), if any
    extra: ClassVar[str | None] = None
    # `--backend auto` tries backends in this order, lowest first; None: never chosen by auto
    auto_preference: ClassVar[int | None] = None
    # whether runs of different users are isolated from each other well enough for a
    # gateway with several users; without it, the operator must consent to that use
    # (`--allow-local-multi-user`), and `--backend auto` never picks it for them
    isolates_users: ClassVar[bool] = False
    # how long after a run takes a pooled kernel the pools start its replacement: a start
    # that costs a core's second (a container and an interpreter) waits until a short run
    # has answered; one that costs a fork does not (gateway/execution/pool.py)
    refill_delay: ClassVar[float] = 0.2

    def __init__(self, config: Any, context: BackendContext) -> None:
        self.config = config
        self.context = context
        self.instance_id = context.instance_id  # names or labels what the backend makes

    @classmethod
    async def probe(cls, config: Any) -> tuple[bool, str]:
        """Whether this backend can run on this machine, and why (a clause for the log
        line "backend NAME (why)"). Called by the factory before it makes the backend, for
        `--backend NAME` and for `auto`. Default: it can."""
        return True, ""

    # the languages whose kernels can be kept as snapshots and continued (`branch`)
    snapshot_languages: ClassVar[frozenset[str]] = frozenset()

    async def branch(self, spec: SandboxSpec, source: Sandbox) -> Sandbox:
        """A sandbox for a continuation of `source`, a kernel kept as a snapshot (only for
        `snapshot_languages`): its `start` has the snapshot fork the kernel into it."""
        raise SandboxError(f"The {self.name} backend cannot continue a snapshot.")

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Create (but do not start) a sandbox. Called by `session.start_session`, which
        owns it from then on and destroys it on every way out."""

    async def environment(self) -> KernelEnvironment | None:
        """What this backend's kernels have: the languages with their kernels and versions,
        and each language's installed packages (`kernels/environment.py`'s JSON). Called by
        `GET /v1/environment`, never on a run's path; the backend may keep the answer until
        what it was read from changes. Default: None, the backend cannot tell."""
        return None

    def footprint(self) -> Footprint:
        """What the backend itself holds on the machine while it runs, beside its sandboxes
        (warm processes, by pid: each alone, not its descendants; folders). Asked by
        operators and the tests' leak census. Default: nothing."""
        return Footprint()

    @property
    def meters_cpu(self) -> bool:
        """Whether every sandbox's `usage()` tells its CPU, from its start until it is
        destroyed (CPU budgets need it: the gateway refuses them otherwise). Asked after
        `startup`. Default: no."""
        return False

    async def startup(self) -> None:  # noqa: B027 - optional hook
        """Called once by the gateway when it starts (e.g. to remove orphans of a crash),
        before the first `create`."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Called once by the gateway when it stops, after every sandbox was destroyed."""


T = TypeVar("T")


async def to_the_end(work: Awaitable[T]) -> T:
    """`work`'s result. Cancelled meanwhile, this still waits for `work` to end before the
    cancellation goes on: a thread goes on regardless, and a forked kernel is on its way
    whatever the gateway does; `work` keeps what it made on the sandbox, for `destroy()`.
    (A destruction that ran while the making went on would miss what came after it.)"""
    running = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        try:
            await wait_out(running)
        finally:
            if not running.cancelled():
                running.exception()  # the cancellation is what the caller hears of, not this
        raise


async def wait_out(*work: asyncio.Future[Any]) -> None:
    """Wait until all of `work` is done, however often this task is cancelled meanwhile (a
    shutdown's cancel on top of a run's); then raise CancelledError if it was."""
    interrupted = False
    while not all(w.done() for w in work):
        try:
            await asyncio.wait(work)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError
