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
import json
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
# Which sandboxes those are, the census finds out from the outside (`pooled`), never by
# asking the gateway (the code under test).
LIVE_GATEWAYS: set[Any] = set()
# Gateways in processes of their own (support.GatewayProcess), by instance id: while one
# runs, what its backend holds for its lifetime (the forkserver's state folder, named after
# its instance) is not a leak; once it has ended, it is.
PROCESS_INSTANCES: dict[str, Any] = {}
# Workspaces roots of the gateways this test process started: a live gateway keeps its
# users' workspace images mounted there (workspace_images.py); once it stops, none may stay
# mounted and no loop device may hold an image of theirs.
WORKSPACE_ROOTS: set[Path] = set()


class CensusError(RuntimeError):
    """The census could not be taken: a test must fail, not pass as clean."""


# --- pooled sandboxes, seen from the outside ---------------------------------------------------
#
# A sandbox of a live gateway is taken for an idle pooled one only if its kernel says, over
# its own sockets, that it has never run a cell (a silent, empty execute request answers
# with the kernel's execution count: that of a fresh kernel) and its working folder is
# empty. A used sandbox left in a pool, or any other, is a leak. What belongs to a pooled
# sandbox is found by its folder's name too: its cgroup (`gateway-<folder>`), its processes
# (in that cgroup, or naming the folder on their command line, and the whole process tree
# they are in), its container (which mounts a file of the folder), the mounts in it.

# The execution count a kernel that has run nothing answers with: IRkernel's names the
# number of the next cell, the others (ipykernel, our bash and Deno kernels) the last one's.
FRESH_COUNT = {"R": 1}
PROBE_TIMEOUT = 30.0  # a pooled kernel on a loaded machine may take seconds to answer


def connection_of(folder: Path) -> dict[str, Any] | None:
    """The kernel's connection info of a sandbox folder, its ipc address made the host's:
    the socket `<ip basename>-<port>` is in the folder (`k/` local, `sock/` Docker)."""
    for file in (folder / "connection.json", folder / "k" / "connection.json", folder / FORKED):
        with contextlib.suppress(OSError, ValueError):
            info: dict[str, Any] = json.loads(file.read_text())
            base = os.path.basename(str(info["ip"]))
            for sub in ("k", "sock", "run/kernel"):
                if (folder / sub / f"{base}-{info['shell_port']}").exists():
                    return {**info, "ip": str(folder / sub / base)}
    return None


def _ask(client: Any, msg_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + PROBE_TIMEOUT
    while True:
        reply: dict[str, Any] = client.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.01))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


# A pooled kernel's shell, kept open from one census to the next (one per kernel, by its
# socket and key), with the language it told at the first (a kernel's never changes): each
# later census asks one question. Opening a client and asking twice, for each of a dozen
# pooled kernels after every test, took ~0.2 s of each test.
_PROBES: dict[tuple[str, str], tuple[Any, str]] = {}


def _probe(info: dict[str, Any]) -> tuple[Any, str]:
    from jupyter_client import BlockingKernelClient

    ident = (str(info["ip"]), str(info["key"]))
    if ident not in _PROBES:
        client = BlockingKernelClient()
        client.load_connection_info(info)
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        try:
            reply = _ask(client, client.kernel_info())
            _PROBES[ident] = (client, reply["content"]["language_info"]["name"])
        except BaseException:
            client.stop_channels()
            raise
    return _PROBES[ident]


def _forget(ident: tuple[str, str]) -> None:
    entry = _PROBES.pop(ident, None)
    if entry is not None:
        entry[0].stop_channels()


def _files_in(folder: Path) -> bool:
    """Whether the sandbox's working folder holds anything."""
    for work in (folder / "work", folder / "workspace"):  # local and Docker; forkserver
        if work.is_dir() and any(work.iterdir()):
            return True
    return False


def pooled() -> set[Path]:
    """The sandbox folders of live gateways that hold an idle pooled kernel: its kernel has
    never run a cell (it answers a silent execute with a fresh kernel's count) and its
    working folder is empty; and the roots (`/proc/<pid>/root`) of their idle forked
    kernels, on the same terms. Every kernel is asked before any answer is read: they
    answer at once, not one after another."""
    candidates: list[Path] = []
    for gateway in list(LIVE_GATEWAYS):
        instance = gateway.settings.instance_id or ""
        candidates += folders_of(instance) + forked_roots(instance)
    asked: list[tuple[Path, tuple[str, str], Any, str, str]] = []
    for path in candidates:
        info = connection_of(path)
        if info is None or _files_in(path):
            continue
        ident = (str(info["ip"]), str(info["key"]))
        try:
            client, language = _probe(info)
            msg_id = client.execute("", silent=True, store_history=False)
        except Exception:  # no answer in time (queue.Empty), a malformed one: not pooled
            _forget(ident)
            continue
        asked.append((path, ident, client, language, msg_id))
    found: set[Path] = set()
    for path, ident, client, language, msg_id in asked:
        try:
            count = _ask(client, msg_id)["content"].get("execution_count")
        except Exception:
            _forget(ident)
            continue
        if count == FRESH_COUNT.get(language, 0):
            found.add(path)
    for gone in set(_PROBES) - {ident for _, ident, *_ in asked}:
        _forget(gone)  # its kernel is gone, or not pooled
    return found


# --- the forkserver's kernels and warm parents, seen from the outside -------------------------
#
# A forked kernel has no folder on the host: its sandbox is reached through the pid 1 of its
# namespaces, whose `/proc/<pid>/root` is the sandbox's root (the connection file, the
# sockets and the working folder where Docker has them). It counts as pooled on the terms
# above. What a live gateway's backend holds for its lifetime (its warm parents, each by
# itself: the kernels they fork are judged on their own; its state folder) is asked of the
# gateway (`resident`), for live gateways only: once a gateway stops, all of it is a leak.

FORKED = "run/gateway/connection.json"  # in a forked kernel's root


def _namespace_init(pid: int) -> bool:
    """Whether the process is pid 1 of a PID namespace below ours."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) > 1 and ids[-1] == "1"
    return False


def forked_roots(instance: str) -> list[Path]:
    """The roots (`/proc/<pid>/root`) of one gateway's forked kernels, pooled or not: each
    pid 1 of a PID namespace in one of its sandboxes' cgroups (`gateway-gwfs<instance[:6]>-*`)."""
    mark = f"/gateway-gwfs{instance[:6]}-"
    found: list[Path] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cgroup = Path(f"/proc/{entry.name}/cgroup").read_text()
                if mark in cgroup and _namespace_init(int(entry.name)):
                    found.append(Path(f"/proc/{entry.name}/root"))
    return found


def _forked_pid(root: Path) -> int | None:
    """The pid of a forked kernel's pid 1 from its root (`/proc/<pid>/root`), else None."""
    parts = root.parts
    return int(parts[2]) if parts[:2] == ("/", "proc") and len(parts) == 4 else None


def _forked_groups(idle: set[Path]) -> set[str]:
    """The cgroups (by name) that the idle forked kernels are in."""
    names: set[str] = set()
    for root in idle:
        pid = _forked_pid(root)
        if pid is not None:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                    names.add(line.rsplit("/", 1)[-1])
    return names


def resident() -> tuple[set[int], set[str]]:
    """What live gateways' backends hold for their lifetime: warm parents (pids, each by
    itself) and folders (also a gateway process's own while it runs)."""
    pids: set[int] = set()
    folders: set[str] = set()
    for gateway in list(LIVE_GATEWAYS):
        held = gateway.resident()
        pids.update(held.pids)
        folders.update(held.folders)
    tmp = Path(tempfile.gettempdir())
    for ident, process in list(PROCESS_INSTANCES.items()):
        if process.poll() is None:
            folders.update(str(p) for p in tmp.glob(f"gwfs{ident[:6]}-*"))
    return pids, folders


def _pooled_processes(table: dict[int, Proc], folders: set[Path]) -> set[int]:
    """The processes of pooled sandboxes: each in the cgroup of one, or naming one's folder on
    its command line, and with it the whole tree below pytest it is in."""
    found: set[int] = set()
    for root in folders:
        pid = _forked_pid(root)
        if pid is not None and pid in table:
            found.add(pid)
            found.update(p.pid for p in descendants(pid, table))
    folders = {f for f in folders if _forked_pid(f) is None}
    if not folders:
        return found
    me = os.getpid()
    groups = tuple(f"/gateway-{f.name}\n" for f in folders)
    paths = tuple(f"{f}/".encode() for f in folders)
    for proc in table.values():
        with contextlib.suppress(OSError):
            cgroup = Path(f"/proc/{proc.pid}/cgroup").read_text()
            command = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            if any(g in cgroup for g in groups) or any(p in command for p in paths):
                top = proc
                while top.ppid != me and top.ppid in table:
                    top = table[top.ppid]
                if top.ppid == me:
                    found.add(top.pid)
                    found.update(p.pid for p in descendants(top.pid, table))
    return found


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


def stray_processes(idle: set[Path] | None = None) -> list[str]:
    """Live descendants of pytest that the harness does not own and no pooled sandbox holds:
    leaked sandbox processes."""
    return [str(p) for p in _strays(idle)]


def stray_pids(idle: set[Path] | None = None) -> list[int]:
    return [p.pid for p in _strays(idle)]


def _strays(idle: set[Path] | None) -> list[Proc]:
    if not is_subreaper():
        raise CensusError("pytest is not a child subreaper: orphaned processes would escape")
    me = os.getpid()
    table = process_table()
    owned = _pooled_processes(table, pooled() if idle is None else idle)
    owned |= resident()[0]  # each warm parent by itself, not what it forked
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


def folders_of(instance: str) -> list[Path]:
    """The sandbox folders of one gateway, found by their name (`gw<instance[:6]>-*` in the
    temp dir, on both backends), pooled or not."""
    return sorted(Path(tempfile.gettempdir()).glob(f"gw{instance[:6]}-*"))


def sandbox_folders(idle: set[Path] | None = None) -> list[str]:
    tmp = Path(tempfile.gettempdir())
    idle = pooled() if idle is None else idle
    held = resident()[1]
    found = (p for prefix in _prefixes() for p in tmp.glob(prefix + "*"))
    return sorted(str(f) for f in found if f not in idle and str(f) not in held)


def sandbox_mounts(idle: set[Path] | None = None) -> list[str]:
    """Mounts (the Docker sandboxes' socket and working folder tmpfs) in our sandbox folders."""
    tmp = os.fsencode(Path(tempfile.gettempdir()))
    prefixes = tuple(tmp + b"/" + prefix.encode() for prefix in _prefixes())
    if not prefixes:
        return []
    held = [*(pooled() if idle is None else idle), *resident()[1]]
    inside = tuple(os.fsencode(f) + b"/" for f in held)
    return sorted(
        f"mount {os.fsdecode(p)}"
        for p in _mount_points()
        if p.startswith(prefixes) and not p.startswith(inside)
    )


def sandbox_cgroups(idle: set[Path] | None = None) -> list[str]:
    root = Path("/sys/fs/cgroup")
    names = [f"gateway-{p}" for p in _prefixes()]
    idle = pooled() if idle is None else idle
    groups = {f"gateway-{f.name}" for f in idle} | _forked_groups(idle)
    return sorted(
        str(p)
        for name in names
        for p in [*root.glob(f"*/{name}*"), *root.glob(f"{name}*")]
        if p.name not in groups
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
    """Close the census's Docker client and kernel clients (at the end of the session, or
    after a failure)."""
    for ident in list(_PROBES):
        _forget(ident)
    client = _docker.pop("client", None)
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()


def _docker_found(idle: set[Path] | None) -> tuple[list[Any], list[Any]]:
    """The containers (but those of pooled sandboxes) and volumes of our Docker gateways;
    raises CensusError if it cannot ask."""
    if not DOCKER_INSTANCES:
        return [], []
    try:
        client = _docker_client()
        selector = {"label": LABEL_INSTANCE}
        # sparse: one list call, no inspect of each (which races with removals)
        containers = client.containers.list(all=True, sparse=True, filters=selector)
        volumes = client.volumes.list(filters=selector)
    except Exception as exc:  # any failure to ask is a failed census, never a clean one
        close()
        raise CensusError(f"the Docker census failed: {exc!r}") from exc
    inside = tuple(f"{f}/" for f in (pooled() if idle is None else idle))
    found = [
        c
        for c in containers
        if (c.attrs.get("Labels") or {}).get(LABEL_INSTANCE) in DOCKER_INSTANCES
        and not any(
            str(m.get("Source", "")).startswith(inside) for m in c.attrs.get("Mounts") or []
        )
    ]
    ours = [
        v
        for v in volumes
        if ((v.attrs or {}).get("Labels") or {}).get(LABEL_INSTANCE) in DOCKER_INSTANCES
    ]
    return found, ours


def docker_leftovers(idle: set[Path] | None = None) -> list[str]:
    """Containers and volumes of our Docker gateways; raises CensusError if it cannot ask."""
    containers, volumes = _docker_found(idle)
    found = [
        f"container {','.join(c.attrs.get('Names') or [c.id])} ({c.attrs.get('State')})"
        for c in containers
    ]
    return found + [f"volume {v.name}" for v in volumes]


def census() -> list[str]:
    """Everything a sandbox left behind; empty when clean. Raises CensusError if it cannot tell."""
    idle = pooled()
    found = [f"process {p}" for p in stray_processes(idle)]
    found += sandbox_folders(idle) + sandbox_mounts(idle) + sandbox_cgroups(idle)
    return found + workspace_mounts() + docker_leftovers(idle)


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
    idle = pooled()
    return bool(
        sandbox_folders(idle)
        or sandbox_mounts(idle)
        or sandbox_cgroups(idle)
        or workspace_mounts()
        or docker_leftovers(idle)
    )


def clean_up() -> None:
    """After a failed census: end and remove what it found (stray processes, sandbox
    folders and their mounts, cgroups, workspace mounts, containers and volumes), so that
    one leak fails one test, not every test after it."""
    import shutil
    import signal

    idle = pooled()
    for pid in stray_pids(idle):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    from gateway.sandbox.mounts import remove_tree

    for folder in sandbox_folders(idle):
        with contextlib.suppress(OSError):
            remove_tree(Path(folder))  # unmounts a sandbox's tmpfs first
        shutil.rmtree(folder, ignore_errors=True)
    for leftover in sandbox_mounts(idle) + workspace_mounts():
        if leftover.startswith("mount "):  # a loop device goes with its mount (autoclear)
            subprocess.run(["umount", "-l", leftover[len("mount ") :]], check=False)
    for group in sandbox_cgroups(idle):
        remove_cgroup(Path(group))
    with contextlib.suppress(Exception):
        containers, volumes = _docker_found(idle)
        for container in containers:
            container.remove(force=True)
        for volume in volumes:
            volume.remove(force=True)


def remove_cgroup(path: Path, timeout: float = 10.0) -> None:
    """Kill every process in a cgroup folder (and its sub-groups), then remove the folders,
    deepest first: a cgroup goes only once it holds no process (cgroup v1 and v2 alike)."""
    import signal

    folders = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    folders.append(path)
    with contextlib.suppress(OSError):
        (path / "cgroup.kill").write_text("1")  # v2: the kernel kills them all at once
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = set()
        for folder in folders:
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
