"""The leak census every test must pass, independent of how the gateway finds its sandboxes.

Processes: the pytest process is made a *child subreaper* at session start
(`prctl(PR_SET_CHILD_SUBREAPER)`), so that every process a sandbox leaves behind is
reparented to pytest instead of init, however it detached itself (`setsid`, a double fork,
`env -i` to drop the gateway's marker). A leaked process is then a live (non-zombie)
descendant of pytest, found through the ppid links of `/proc/*/stat`, minus the processes
the test harness owns on purpose (`harness_owned`: a gateway in its own process while it
runs, the browser of the page tests). Nothing here ever reaps a process: a dead orphan stays
a zombie of pytest, which the census ignores, so no exit status is taken from the
`subprocess`/`asyncio` code that waits for its own children.

Docker: containers and volumes labelled with the instance id of a gateway this session
started, asked of the engine through the Docker SDK. A census that cannot ask (no engine,
a timeout, an API error) raises `CensusError`: the test fails, it never reads as clean.

Also folders under the temp dir and cgroups named after our instances, and workspace
images left mounted (or held by a loop device) by a gateway that has stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
LABEL_INSTANCE = "gateway.instance"

# Instance ids of the gateways this test process started (the census looks only at theirs,
# so that test runs of other checkouts on the same machine do not count), and those of them
# that may have used Docker.
INSTANCES: set[str] = set()
DOCKER_INSTANCES: set[str] = set()
# Live gateways of this test process: the idle kernels in their pools are alive on purpose.
# Each has `pooled()`, the footprints (gateway.sandbox.base.Footprint) of those kernels;
# what a run left behind is never among them (a pooled kernel leaves its pool when taken).
LIVE_GATEWAYS: set[Any] = set()
# Gateways in processes of their own (support.GatewayProcess), by instance id: while one
# runs, what its backend holds for its lifetime (the forkserver's state folder, named after
# its instance) is not a leak; once it has ended, it is.
PROCESS_INSTANCES: dict[str, Any] = {}
# Workspaces roots of the gateways this test process started: a live gateway keeps its
# users' workspace images mounted there (quota.py); once it stops, none may stay mounted
# and no loop device may hold an image of theirs.
WORKSPACE_ROOTS: set[Path] = set()


def _pooled() -> dict[str, set[Any]]:
    """What live gateways hold on purpose: their idle pooled kernels, and what their backends
    hold while they run (`resident`: the forkserver's warm parents and its state folder).
    A pooled kernel's pid covers its descendants; a resident pid (`resident_pids`) only
    itself: the kernels a warm parent forks are its descendants, and they must be counted."""
    kinds = ("containers", "volumes", "folders", "cgroups", "pids")
    found: dict[str, set[Any]] = {k: set() for k in (*kinds, "resident_pids")}
    for gateway in list(LIVE_GATEWAYS):
        for footprint in gateway.pooled():
            for kind in kinds:
                found[kind].update(getattr(footprint, kind))
        resident = gateway.resident()
        found["folders"].update(resident.folders)
        found["resident_pids"].update(resident.pids)
    tmp = Path(tempfile.gettempdir())
    for ident, process in list(PROCESS_INSTANCES.items()):
        if process.poll() is None:
            found["folders"].update(str(p) for p in tmp.glob(f"gwfs{ident[:6]}-*"))
    return found


class CensusError(RuntimeError):
    """The census could not be taken: a test must fail, not pass as clean."""


# --- processes ----------------------------------------------------------------------------


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise CensusError(
            f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
        )


def is_subreaper() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return False
    return flag.value != 0


@dataclasses.dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    start: int  # start time in clock ticks since boot: a pid plus this names one process
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} (parent {self.ppid}): {self.command}"


def _read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    name_end = stat.rindex(")")
    fields = stat[name_end + 2 :].split()
    text = command.replace(b"\0", b" ").decode(errors="replace").strip()
    if not text:
        text = "[" + stat[stat.index("(") + 1 : name_end] + "]"
    return Proc(pid, int(fields[1]), fields[0], int(fields[19]), text[:160])


def process_table() -> dict[int, Proc]:
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            proc = _read_proc(int(entry.name))
            if proc is not None:
                table[proc.pid] = proc
    return table


def descendants(root: int, table: dict[int, Proc] | None = None) -> list[Proc]:
    """Every process below `root` (zombies included), by ppid links."""
    table = process_table() if table is None else table
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return found


# Processes the harness owns on purpose: (pid, start time) -> what it is. They and their
# descendants are not leaks while they live.
_OWNED: dict[tuple[int, int], str] = {}


def own(pid: int, what: str) -> None:
    """Declare a live process (and what it starts) the harness's own, not a leak."""
    proc = _read_proc(pid)
    if proc is not None:
        _OWNED[(proc.pid, proc.start)] = what


def disown(pid: int) -> None:
    for key in [k for k in _OWNED if k[0] == pid]:
        del _OWNED[key]


@contextlib.contextmanager
def harness_owned(what: str) -> Iterator[None]:
    """Every child this process starts inside the block is the harness's own (say, the
    Playwright driver that starts Chromium), for as long as it lives."""
    before = {p.pid for p in descendants(os.getpid()) if p.ppid == os.getpid()}
    yield
    for proc in descendants(os.getpid()):
        if proc.ppid == os.getpid() and proc.pid not in before and proc.state != "Z":
            _OWNED[(proc.pid, proc.start)] = what


def stray_processes() -> list[str]:
    """Live descendants of pytest that the harness does not own: leaked sandbox processes."""
    return [str(p) for p in _strays()]


def stray_pids() -> list[int]:
    return [p.pid for p in _strays()]


def _strays() -> list[Proc]:
    if not is_subreaper():
        raise CensusError("pytest is not a child subreaper: orphaned processes would escape")
    me = os.getpid()
    table = process_table()
    pooled = _pooled()
    owned: set[int] = set(pooled["resident_pids"])
    for pid in pooled["pids"]:
        owned.add(pid)
        owned.update(p.pid for p in descendants(pid, table))
    for (pid, start), _ in list(_OWNED.items()):
        proc = table.get(pid)
        if proc is None or proc.start != start or proc.state == "Z":
            del _OWNED[(pid, start)]  # it ended: what it leaves behind counts again
            continue
        owned.add(pid)
        owned.update(p.pid for p in descendants(pid, table))
    return [p for p in descendants(me, table) if p.state != "Z" and p.pid not in owned]


# --- folders and cgroups --------------------------------------------------------------------


def _prefixes() -> tuple[str, ...]:
    """Names of what our gateways make (the forkserver backend's: `gwfs...`)."""
    return tuple(f"{kind}{ident[:6]}-" for ident in INSTANCES for kind in ("gw", "gwfs"))


def sandbox_folders() -> list[str]:
    tmp = Path(tempfile.gettempdir())
    pooled = _pooled()["folders"]
    found = (str(p) for prefix in _prefixes() for p in tmp.glob(prefix + "*"))
    return sorted(f for f in found if f not in pooled)


def sandbox_mounts() -> list[str]:
    """Mounts (the Docker sandboxes' socket and working folder tmpfs) in our sandbox folders."""
    tmp = os.fsencode(Path(tempfile.gettempdir()))
    prefixes = tuple(tmp + b"/" + prefix.encode() for prefix in _prefixes())
    if not prefixes:
        return []
    pooled = tuple(os.fsencode(f) + b"/" for f in _pooled()["folders"])
    with open("/proc/self/mountinfo", "rb") as info:
        points = [line.split()[4] for line in info]
    return sorted(
        f"mount {os.fsdecode(p)}"
        for p in points
        if p.startswith(prefixes) and not p.startswith(pooled)
    )


def sandbox_cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    names = [f"gateway-{p}" for p in _prefixes()]
    pooled = _pooled()["cgroups"]
    return sorted(
        str(p)
        for name in names
        for p in [*root.glob(f"*/{name}*"), *root.glob(f"{name}*")]
        if p.name not in pooled
    )


def _mount_points() -> list[bytes]:
    with open("/proc/self/mountinfo", "rb") as info:
        return [line.split()[4] for line in info]


def workspace_mounts() -> list[str]:
    """Workspace images still mounted, or still held by a loop device, under the roots
    of gateways that have stopped."""
    live = {getattr(g, "workspace_root", None) for g in list(LIVE_GATEWAYS)}
    roots = [r for r in WORKSPACE_ROOTS if r not in live]
    if not roots:
        return []
    prefixes = tuple(os.fsencode(r) + b"/" for r in roots)
    found = [f"mount {os.fsdecode(p)}" for p in _mount_points() if p.startswith(prefixes)]
    loops = {}
    for entry in Path("/sys/block").glob("loop*"):
        with contextlib.suppress(OSError):
            held = (entry / "loop" / "backing_file").read_bytes().rstrip(b"\n")
            if held.startswith(prefixes):
                device = (entry / "dev").read_bytes().strip()
                loops[device] = f"loop device {entry.name} ({os.fsdecode(held)})"
    if loops:
        # A sandbox that bubblewrap started while a workspace was mounted holds a copy of
        # that mount (its root is a recursive bind of /) until it ends: any gateway's on
        # this machine, a pooled kernel of a live one say. A loop device is left behind
        # only when no mount namespace holds its file system any more (autoclear failed).
        held = _mounted_devices(set(loops))
        found += [what for device, what in loops.items() if device not in held]
    return sorted(found)


def _mounted_devices(wanted: set[bytes]) -> set[bytes]:
    """Which of the `major:minor` devices some mount namespace on the machine mounts."""
    seen_namespaces: set[str] = set()
    found: set[bytes] = set()
    for pid in [name for name in os.listdir("/proc") if name.isdigit()]:
        with contextlib.suppress(OSError):
            namespace = os.readlink(f"/proc/{pid}/ns/mnt")
            if namespace in seen_namespaces:
                continue
            seen_namespaces.add(namespace)
            with open(f"/proc/{pid}/mountinfo", "rb") as info:
                found.update(line.split()[2] for line in info)
        if wanted <= found:
            break
    return found & wanted


# --- Docker -----------------------------------------------------------------------------------

_docker: dict[str, Any] = {}


def _docker_client() -> Any:
    if "client" not in _docker:
        import docker

        _docker["client"] = docker.from_env(timeout=30)
    return _docker["client"]


def close() -> None:
    """Close the census's Docker client (at the end of the session, or after a failure)."""
    client = _docker.pop("client", None)
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()


def docker_leftovers() -> list[str]:
    """Containers and volumes of our Docker gateways; raises CensusError if it cannot ask."""
    if not DOCKER_INSTANCES:
        return []
    try:
        client = _docker_client()
        selector = {"label": LABEL_INSTANCE}
        # sparse: one list call, no inspect of each (which races with removals)
        containers = client.containers.list(all=True, sparse=True, filters=selector)
        volumes = client.volumes.list(filters=selector)
    except Exception as exc:  # any failure to ask is a failed census, never a clean one
        close()
        raise CensusError(f"the Docker census failed: {exc!r}") from exc
    pooled = _pooled()
    found = [
        f"container {','.join(c.attrs.get('Names') or [c.id])} ({c.attrs.get('State')})"
        for c in containers
        if (c.attrs.get("Labels") or {}).get(LABEL_INSTANCE) in DOCKER_INSTANCES
        and not {n.lstrip("/") for n in c.attrs.get("Names") or []} & pooled["containers"]
    ]
    found += [
        f"volume {v.name}"
        for v in volumes
        if ((v.attrs or {}).get("Labels") or {}).get(LABEL_INSTANCE) in DOCKER_INSTANCES
        and v.name not in pooled["volumes"]
    ]
    return found


def census() -> list[str]:
    """Everything a sandbox left behind; empty when clean. Raises CensusError if it cannot tell."""
    found = [f"process {p}" for p in stray_processes()]
    found += sandbox_folders() + sandbox_mounts() + sandbox_cgroups() + workspace_mounts()
    return found + docker_leftovers()


# How long a gateway may take to settle: longer than a kernel start may take before it fails
# (the tests' kernel_start_timeout, 60 s), so that a pooled kernel still starting is never
# taken for a leak.
SETTLE_TIMEOUT = 90.0


def settle(timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait (bounded) until every live gateway has settled: no run active, nothing being
    destroyed, no pooled kernel starting. What has not settled by then, the census judges."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(g.idle() for g in list(LIVE_GATEWAYS)):
        time.sleep(0.05)


def after_teardown(timeout: float = SETTLE_TIMEOUT) -> list[str]:
    """The census once every live gateway has settled: a run's sandbox is destroyed just
    after its record is answered (off the answer's path), not before."""
    settle(timeout)
    return census()


def sandboxes_exist() -> bool:
    """Whether some sandbox of ours is there now (a folder, a cgroup or a container)."""
    return bool(
        sandbox_folders()
        or sandbox_mounts()
        or sandbox_cgroups()
        or workspace_mounts()
        or docker_leftovers()
    )


def clean_up() -> None:
    """After a failed census: kill the stray processes and remove our folders and containers,
    so that one leak fails one test, not every test after it."""
    import shutil
    import signal

    for pid in stray_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    from gateway.sandbox.mounts import remove_tree

    for folder in sandbox_folders():
        with contextlib.suppress(OSError):
            remove_tree(Path(folder))  # unmounts a sandbox's tmpfs first
        shutil.rmtree(folder, ignore_errors=True)
    for group in sandbox_cgroups():  # its processes killed, then the group removed
        with contextlib.suppress(OSError, ValueError):
            for pid in Path(group, "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.1)
            Path(group).rmdir()
    for leftover in workspace_mounts():
        if leftover.startswith("mount "):  # its loop device goes with it (autoclear)
            subprocess.run(["umount", "-l", leftover[len("mount ") :]], check=False)
    if DOCKER_INSTANCES:
        with contextlib.suppress(Exception):
            client = _docker_client()
            selector = {"label": LABEL_INSTANCE}
            for container in client.containers.list(all=True, sparse=True, filters=selector):
                if (container.attrs.get("Labels") or {}).get(LABEL_INSTANCE) in DOCKER_INSTANCES:
                    container.remove(force=True)
