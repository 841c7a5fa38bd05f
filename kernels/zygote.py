"""The forkserver's warm parent: imports a kernel once, then forks one sandboxed kernel per
request. Runs inside the kernel image's root file system (the gateway starts it there with
bubblewrap, as root, with every capability), never runs user code and holds no secret.

    python -P /run/forkserver/zygote.py FD KIND SECCOMP_FILE WARM_JSON

KIND is `ipykernel` (the Python kernel, imported with our startup code and the preloads,
and built: `kernels.python.prebuilt`), `bash` (our bash kernel, imported) or `exec`
(nothing imported: each child execs its kernel's command line, for Deno and R). WARM_JSON:
{"preloads": [module, ...], "argv": the kernel's command line} (for `ipykernel`; its
environment is this process's own, the kernel's base environment). Descriptor FD is a
SOCK_SEQPACKET socket to the gateway, the only way in: each message is one JSON object,
descriptors ride along.

    parent -> gateway  {"ready": pid} + the parent's own pidfd         once it is warm
    gateway -> parent  {"op": "spawn", "id"}
                       + one descriptor per cgroup hierarchy (its `cgroup.procs`, open),
                       with a workspace a detached bind mount of it (`open_tree`), and
                       last a memfd of the request itself: {"uid", "gid", "network",
                       "hostname", "tmp_bytes", "work_bytes", "argv", "cgroups", "cgroupfs",
                       "passwd", "group" (the sandbox's account files), "connection"
                       (with the HMAC key), "env"}. The parent passes it on
                       unread and only the forked child reads it: a fork copies the
                       parent's memory, freed parts too, so a request the parent had read
                       would be in every later kernel's memory (another tenant's uid,
                       hostname, key)
    parent -> gateway  {"id", "pid"} + [working folder, socket folder] (opened inside)
                       + the kernel's pid 1 as a pidfd
                       or {"id", "error"}
    parent -> gateway  {"exit": pid, "status": wait status}    when a kernel ends

Each kernel is made in this order, all before it reads its first message (`spawn`,
`_init`, `_drop`, `_kernel`): fork into a new PID namespace (the child is its pid 1: its
descendants die with it; the parent's own later children are in its namespace again); read
the request; join the sandbox's cgroups; unshare mount, UTS, IPC, cgroup (and, without
`network`, net) namespaces; make every mount private; detach the
parent's /proc, /run, /tmp and /dev/pts, then a fresh /proc, /run, /tmp, /dev/shm, /dev/pts,
working folder and socket folder (tmpfs, the operator's sizes);
the hostname; the connection file; /etc/hostname, /etc/passwd and /etc/group, read-only
binds of files on its own /run; then drop to the sandbox uid/gid with no supplementary
groups, no capability in any set (bounding, ambient, inheritable, permitted, effective),
`no_new_privs`, and the seccomp filter the gateway compiled; fork the kernel process itself
(pid 2; pid 1 stays behind as a reaper of orphans, like Docker's init), which closes every
inherited descriptor, re-seeds every random generator and starts the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import random
import select
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
SYS_MOVE_MOUNT = 429  # x86_64
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_RUNNING = 0x40
LINUX_CAPABILITY_VERSION_3 = 0x20080522
MAX_MESSAGE = 1 << 16
SOCKET_DIR = "/run/kernel"
WORKDIR = "/workspace"
GATEWAY_DIR = "/run/gateway"  # root's: the connection file, the hostname, the accounts
ACCOUNT_FILES = ("passwd", "group")  # /etc's, each the request's (the sandbox user's name)
CONNECTION_FILE = f"{GATEWAY_DIR}/connection.json"
KERNEL_LOG = f"{SOCKET_DIR}/kernel.log"

_libc = ctypes.CDLL(None, use_errno=True)
_OWN_PID_NAMESPACE = -1  # this parent's PID namespace, opened by `main`


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    result = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(result, f"mount {target}")


def _prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(arg3), 0, 0), f"prctl {option}")


# --- warming up ----------------------------------------------------------------------------


# What an ipykernel imports while it starts (`IPKernelApp.initialize`: the shell, its history,
# debugger and magics, tornado's queues) that importing the kernel did not: imported in every
# forked kernel anew, 21 modules and about a quarter of its start's CPU (measured 2026-12-02
# with cProfile on `initialize` after `warm`); imported once here, they cost no child anything.
KERNEL_MODULES = (
    "matplotlib_inline.backend_inline",
    "jupyter_client.session",
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.wildcard",
    "ipykernel.debugger",  # debugpy is None here, as in the kernel (launch.py)
    "sqlite3",
    "pdb",
    "faulthandler",
    "tornado.gen",
    "tornado.locks",
    "tornado.queues",
    "tornado.platform.asyncio",
)


def warm(kind: str, preloads: list[str], argv: list[str]) -> None:
    """Import the kernel, our startup code and the preloads, once, as the kernel would;
    build the Python kernel's application and shell for `argv`."""
    if kind == "ipykernel":
        sys.modules.setdefault("debugpy", None)  # type: ignore[arg-type]  # as launch.py
        import importlib

        from ipykernel import ipkernel, kernelapp, zmqshell  # noqa: F401

        import kernels.python.launch
        import kernels.python.startup as startup

        for name in KERNEL_MODULES:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        with contextlib.suppress(OSError):
            startup._seed_font_cache()
        if preloads:
            startup.preload(json.dumps(preloads))
        from kernels.python import prebuilt

        prebuilt.build(argv, WORKDIR)
    elif kind == "bash":
        import kernels.bash.kernel  # noqa: F401
    gc.collect()
    gc.freeze()  # what the parent holds is never collected in a child: no page copied for it


# --- the parent's loop ---------------------------------------------------------------------


def serve(control_fd: int, kind: str, bpf: bytes) -> None:
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # an orphan of a kernel being made is reaped here
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # bubblewrap, and so the gateway, gone: end
    control = socket.socket(fileno=control_fd)
    control.set_inheritable(False)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    kernels: set[int] = set()
    me = os.pidfd_open(os.getpid())  # for the gateway to kill this parent, and see it gone
    _send(control, {"ready": os.getpid()}, [me])
    os.close(me)
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                while True:
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        break
                _reap(control, kernels)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 16)
            except OSError:
                data, fds = b"", []
            if not data:
                return  # the gateway is gone
            try:
                request = json.loads(data)
                if request.get("op") in ("spawn", "branch") and fds:
                    branch = request["op"] == "branch"
                    reply, handed = spawn(request.get("id"), fds, kind, bpf, branch)
                    if "pid" in reply:
                        kernels.add(reply["pid"])
                    _send(control, reply, handed)
                    for fd in handed:
                        os.close(fd)
                else:
                    _send(control, {"id": request.get("id"), "error": "unknown op"})
            finally:
                for fd in fds:
                    os.close(fd)
            _reap(control, kernels)


def _send(control: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    socket.send_fds(control, [json.dumps(message).encode()], fds or [])


def _reap(control: socket.socket, kernels: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in kernels:
            kernels.discard(pid)
            _send(control, {"exit": pid, "status": status})


def spawn(
    ident: object, descriptors: list[int], kind: str, bpf: bytes, branch: bool = False
) -> tuple[dict[str, Any], list[int]]:
    """Fork one sandboxed kernel (its request is in the last of `descriptors`, read by the
    child only): its pid 1, forked straight into a new PID namespace; its pid (this
    namespace's) and its two folders. A `branch` is a sandbox without a kernel, for a
    continuation of a snapshot to join (`_branch`): its first process, then its two
    folders and its namespaces (`BRANCH_NAMESPACES`)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    me = os.getpid()
    expected = 2 + (len(BRANCH_NAMESPACES) if branch else 0)
    try:
        try:
            init = os.fork() if branch else _fork_into_new_pid_namespace()
        except OSError as exc:  # no namespace or no process to be had: this kernel fails
            return {"id": ident, "error": f"the sandbox could not be forked: {exc}"}, []
        if init == 0:
            code = 70
            try:
                # Dies with this parent until it is in the sandbox's cgroups (where the
                # gateway kills it if this parent dies before its answer): a parent that
                # dies mid-fork leaves no pid 1 carrying on outside them
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if _parent() != me:  # it died before the death signal was asked for
                    os._exit(code)
                _close_all_but({theirs.fileno(), *descriptors})
                if branch:
                    code = _branch(descriptors, theirs)
                else:
                    code = _init(descriptors, kind, bpf, theirs)
            except BaseException:
                report = traceback.format_exc(limit=4)
                if not _tell(theirs, {"error": report}):  # told "ready" and closed: its log
                    os.write(2, report.encode())
            finally:
                os._exit(code)
        theirs.close()
        ours.settimeout(30)
        told: dict[str, Any] = {}
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(ours, MAX_MESSAGE, expected)
            told = json.loads(data) if data else {"error": "the sandbox died while it was set up"}
        except (OSError, ValueError) as exc:
            told = {"error": f"no word from the sandbox: {exc}"}
        if "error" in told or len(fds) != expected:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)  # reaped by `_reap`, like any child
            return {"id": ident, "error": told.get("error", "no folders")}, []
        # its pidfd, opened before the answer: this process reaps the kernel's pid 1, so the
        # pid still names it, and the gateway never signals a number that may be reused
        return {"id": ident, "pid": init}, [*fds, os.pidfd_open(init)]
    finally:
        ours.close()


def _fork_into_new_pid_namespace() -> int:
    """`os.fork()`, the child pid 1 of a new PID namespace (its descendants die with it);
    this process's own later children are in its own namespace again."""
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    try:
        pid = os.fork()
    except BaseException:
        _own_pid_namespace_again()
        raise
    if pid != 0:
        _own_pid_namespace_again()
    return pid


def _own_pid_namespace_again() -> None:
    # Cannot fail (its own namespace, with every capability); if it did, a later child
    # would be in the namespace of the kernel before: end here rather than go on
    if _libc.setns(_OWN_PID_NAMESPACE, CLONE_NEWPID) != 0:
        os.abort()


def _parent() -> int:
    """This process's parent, as the parent's namespace numbers it: `os.getppid()` is 0 in
    pid 1 of a new PID namespace, but the parent's /proc (still mounted) knows."""
    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[1])  # after the state: ppid


def _tell(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> bool:
    try:
        socket.send_fds(sock, [json.dumps(message).encode()], fds or [])
    except OSError:
        return False
    return True


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor above stderr but `keep` (the parent's socket to the gateway,
    its wake-up pipe, anything an import opened)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


# --- the sandbox ---------------------------------------------------------------------------


def _init(fds: list[int], kind: str, bpf: bytes, sock: socket.socket) -> int:
    """Pid 1 of the sandbox: reads its request, joins the cgroups, unshares the other
    namespaces, sets the sandbox up, drops every privilege, forks the kernel, then reaps
    orphans until the kernel ends, and ends with the kernel's status. `fds`: the cgroups'
    `cgroup.procs`, [the workspace,] the request."""
    request, extra = _join(fds)
    workspace = extra[0] if extra else None
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWCGROUP
    if not request.get("network"):
        flags |= CLONE_NEWNET
    _check(_libc.unshare(flags), "unshare")
    uid, gid = int(request["uid"]), int(request["gid"])
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    for path in REPLACED:  # the parent's go, not only covered: see REPLACED
        _check(_libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("proc", "/proc", "proc", hidden)
    _mask_kernel_files()
    _cgroup_files(request.get("cgroupfs") or {})
    _folders(request, workspace)
    if not request.get("network"):
        _loopback_up()
    name = str(request["hostname"])
    _check(_libc.sethostname(name.encode(), len(name)), "sethostname")
    log = _files(request)
    folders = _open_folders()
    _tell(sock, {"ready": True}, folders)
    for fd in folders:
        os.close(fd)
    sock.close()
    _drop(uid, gid, bpf)
    kernel = os.fork()
    if kernel == 0:
        code = 70
        try:
            _kernel(request, kind)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(log)
    while True:
        pid, status = os.wait()
        if pid == kernel:
            if os.WIFSIGNALED(status):
                return 128 + os.WTERMSIG(status)
            return os.waitstatus_to_exitcode(status)


def _join(fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    """Read the request (the last of `fds`, read in the child only, never the parent) and
    join the sandbox's cgroups (the first of `fds`); the descriptors between (a
    workspace; a branch's source namespaces)."""
    *rest, private = fds
    with os.fdopen(private, "rb") as kernels_own:
        request: dict[str, Any] = json.loads(kernels_own.read())
    count = int(request["cgroups"])
    for fd in rest[:count]:
        os.write(fd, b"0")
        os.close(fd)
    # in the sandbox's cgroups: from here the gateway kills it if no answer comes, and it
    # outlives a parent that dies later, as a kernel does
    _prctl(PR_SET_PDEATHSIG, 0)
    return request, rest[count:]


def _folders(request: dict[str, Any], workspace: int | None) -> None:
    """A fresh /run with the socket folder, /tmp, /dev/shm, /dev/pts and working folder."""
    uid, gid = int(request["uid"]), int(request["gid"])
    tmp, work = int(request["tmp_bytes"]), int(request["work_bytes"])
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("tmpfs", "/run", "tmpfs", hidden, "size=1m,nr_inodes=64,mode=0755")
    os.mkdir(SOCKET_DIR, 0o700)
    _mount(
        "tmpfs", SOCKET_DIR, "tmpfs", hidden, f"size=1m,nr_inodes=64,mode=0700,uid={uid},gid={gid}"
    )
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp},mode=1777")
    _mount("tmpfs", "/dev/shm", "tmpfs", hidden, f"size={tmp},mode=1777")
    _mount(
        "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"
    )
    if workspace is not None:  # a detached bind of the workspace (nosuid, nodev) the gateway made
        result = _libc.syscall(
            SYS_MOVE_MOUNT, workspace, b"", AT_FDCWD, WORKDIR.encode(), MOVE_MOUNT_F_EMPTY_PATH
        )
        _check(result, "move_mount /workspace")
        os.close(workspace)
    else:
        ids = f"uid={uid},gid={gid}"
        _mount("tmpfs", WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={work},mode=0755,{ids}")


def _files(request: dict[str, Any]) -> int:
    """The hostname's file, the account files, the connection file, and the kernel's log as
    stdout and stderr (its descriptor is returned)."""
    uid, gid = int(request["uid"]), int(request["gid"])
    name = str(request["hostname"])
    os.mkdir(GATEWAY_DIR, 0o755)
    _write_readonly(CONNECTION_FILE, json.dumps(request["connection"]))
    _write_readonly(f"{GATEWAY_DIR}/hostname", name + "\n")
    if os.path.exists("/etc/hostname"):  # the backend's top layer has it, as Docker writes it
        _bind_readonly(f"{GATEWAY_DIR}/hostname", "/etc/hostname")
    for account in ACCOUNT_FILES:  # the image's, with the sandbox's uid and gid named
        _write_readonly(f"{GATEWAY_DIR}/{account}", str(request[account]))
        _bind_readonly(f"{GATEWAY_DIR}/{account}", f"/etc/{account}")
    log = os.open(KERNEL_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.fchown(log, uid, gid)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)  # nothing of the parent's output: its log is on the host
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    return log


def _open_folders() -> list[int]:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    return [os.open(WORKDIR, flags), os.open(SOCKET_DIR, flags)]


# A branch's namespaces, in the order its continuation joins them (`setns`): the user
# namespace first (joining it is what allows the others), the PID namespace last (it is
# its children's). Sent to the gateway in this order after the two folders.
BRANCH_NAMESPACES = ("user", "mnt", "uts", "ipc", "net", "cgroup", "pid")
NS_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def _branch(fds: list[int], sock: socket.socket) -> int:
    """A sandbox for a continuation of a snapshot (DESIGN decision 24). Its kernel is not
    forked here: a fork of the snapshot's kernel joins it (`kernels/snapshot.py`).
    That process has no capability and runs under the seccomp filter, so it can join
    namespaces only where its uid alone gives it the right: in a user namespace it owns.
    So, as root, this process joins the cgroups and makes the sandbox's mounts as
    `_init` does (a fresh /proc under no mask: `proc` is mounted again inside); then it
    becomes the sandbox uid with no capability left in the host's user namespace, makes
    a user namespace (owned by that uid, which alone is mapped) and the mount, UTS, IPC,
    network, cgroup and PID namespaces inside it, forks the sandbox's pid 1 (`_reaper`:
    /proc and Docker's masks, then the reaper of orphans, ending with pid 2, the
    continuation's kernel) and hands the gateway its folders and namespaces. It ends
    with pid 1. Unlike a kernel's own sandbox: no /sys (sysfs cannot be mounted in a
    user namespace here) and no cgroup files; files of uids other than the sandbox's
    show as `nobody`."""
    # Never dumpable, nor any child of it (the flag is the memory's, and forks copy it):
    # they run outside the seccomp filter, some of them in the snapshot's PID namespace,
    # some as root in a user namespace where the snapshot holds every capability (its uid
    # owns it), and a process with CAP_SYS_PTRACE there could open a dumpable one's memory
    _prctl(PR_SET_DUMPABLE, 0)
    # the snapshot's PID namespace (its pid 1's pidfd, or a branch's namespace); a branch's
    # also its user namespace, which the new one is made inside
    request, sources = _join(fds)
    if len(sources) not in (1, 2):
        raise RuntimeError("a branch needs its snapshot's PID (and user) namespace")
    source, *source_user = sources
    _check(_libc.unshare(CLONE_NEWNS), "unshare")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    for path in REPLACED:
        _check(_libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("proc", "/proc", "proc", hidden)  # what lets pid 1 mount its own
    _folders(request, None)
    log = _files(request)
    folders = _open_folders()
    # The continuation joins its PID namespace from the snapshot's, and may join only a
    # namespace below its own: the branch's is made inside the snapshot's, by a child
    # forked into it
    _check(_libc.setns(source, CLONE_NEWPID), "setns(snapshot's PID namespace)")
    os.close(source)
    unshared_r, unshared_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    inside = os.fork()
    if inside == 0:
        code = 70
        try:
            os.close(unshared_r)
            os.close(mapped_w)
            code = _branch_namespaces(request, folders, sock, source_user, unshared_w, mapped_r)
        except BaseException:
            report = traceback.format_exc(limit=4)
            if not _tell(sock, {"error": report}):
                os.write(2, report.encode())
        finally:
            os._exit(code)
    os.close(unshared_w)
    os.close(mapped_r)
    for fd in folders:
        os.close(fd)
    sock.close()
    os.close(log)
    # Its user namespace's maps, written from here: the child, the sandbox uid by now, is
    # never dumpable (its /proc files stay root's), so that no process of that uid (the
    # snapshot, which lives in that PID namespace) could open its memory while it still
    # runs outside the seccomp filter
    if os.read(unshared_r, 1) == b"1":
        _map_user_namespace(inside, int(request["uid"]), int(request["gid"]), source_user)
        os.write(mapped_w, b"1")
    os.close(unshared_r)
    os.close(mapped_w)
    for fd in source_user:
        os.close(fd)
    _, status = os.waitpid(inside, 0)
    return os.waitstatus_to_exitcode(status)


def _map_user_namespace(pid: int, uid: int, gid: int, parent: list[int]) -> None:
    """Map `uid` and `gid` (alone) in the user namespace `pid` has just made. Only a process
    in its parent user namespace may: this one (root) for a branch of a run's own kernel; a
    child of it that joins `parent` for a branch of a continuation."""
    if not parent:
        _write_maps(pid, uid, gid)
        return
    writer = os.fork()
    if writer == 0:
        code = 70
        try:
            _check(_libc.setns(parent[0], CLONE_NEWUSER), "setns(the parent user namespace)")
            _write_maps(pid, uid, gid)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(writer, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("the branch's user namespace could not be mapped")


def _write_maps(pid: int, uid: int, gid: int) -> None:
    _write(f"/proc/{pid}/setgroups", "deny")
    _write(f"/proc/{pid}/uid_map", f"{uid} {uid} 1")
    _write(f"/proc/{pid}/gid_map", f"{gid} {gid} 1")


def _branch_namespaces(
    request: dict[str, Any],
    folders: list[int],
    sock: socket.socket,
    inside: list[int],
    unshared: int,
    mapped: int,
) -> int:
    """The branch's user namespace and the others inside it, its pid 1, the answer. A
    branch of a snapshot that is itself a continuation is made inside that one's user
    namespace (`inside`): a PID namespace's own user namespace must be inside its
    parent's, and the continuation, which lives there, owns only namespaces made below."""
    uid, gid = int(request["uid"]), int(request["gid"])
    # the sandbox uid, every capability of the host's user namespace gone for good
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    for user_namespace in inside:  # root's capabilities hold in it: it is below
        _check(_libc.setns(user_namespace, CLONE_NEWUSER), "setns(snapshot's user namespace)")
        os.close(user_namespace)  # this process's copy (its parent keeps its own)
    os.setresuid(uid, uid, uid)
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    os.write(unshared, b"1")  # its maps are written by its parent, root
    os.close(unshared)
    if os.read(mapped, 1) != b"1":
        raise RuntimeError("the branch's user namespace was not mapped")
    os.close(mapped)
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWCGROUP
    _check(_libc.unshare(flags | CLONE_NEWPID), "unshare")
    _loopback_up()
    name = str(request["hostname"])
    _check(_libc.sethostname(name.encode(), len(name)), "sethostname")
    # each of its namespaces but the PID one, which exists once pid 1 does (below)
    namespaces = [os.open(f"/proc/self/ns/{ns}", NS_FLAGS) for ns in BRANCH_NAMESPACES[:-1]]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    init = os.fork()
    if init == 0:
        code = 70
        try:
            os.close(ready_r)
            os.close(go_w)
            for fd in (*folders, *namespaces):
                os.close(fd)
            sock.close()
            if os.read(go_r, 1) == b"1":
                code = _reaper(ready_w)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    # its PID namespace, which exists now that pid 1 does, seen in this /proc (pid 1
    # mounts its own over it next)
    namespaces.append(os.open("/proc/self/ns/pid_for_children", NS_FLAGS))
    os.write(go_w, b"1")
    os.close(go_w)
    if os.read(ready_r, 1) != b"1":
        raise RuntimeError("the branch's pid 1 could not set it up")
    os.close(ready_r)
    _tell(sock, {"ready": True}, folders + namespaces)
    for fd in (*folders, *namespaces):
        os.close(fd)
    sock.close()
    _drop_all_capabilities()
    _, status = os.waitpid(init, 0)
    return os.waitstatus_to_exitcode(status)


# A branch's kernel that ended, as its pid 1 sees it: not its child (its parent, the
# snapshot's fork, was in the snapshot's PID namespace, whose pid 1 it went to), so its
# status is not known here
BRANCH_KERNEL_GONE = 255


def _reaper(ready: int) -> int:
    """Pid 1 of a branch: its /proc and masks, then reap orphans until pid 2 (the
    continuation's kernel, the first process to join) ends; end with its status, or
    `BRANCH_KERNEL_GONE` (its pidfd says when it ends: it is not this process's child)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _docker_masks()
    _drop_all_capabilities()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    os.write(ready, b"1")
    os.close(ready)
    kernel: int | None = None  # pid 2's pidfd, once it has joined
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == 2:
                if os.WIFSIGNALED(status):
                    return 128 + os.WTERMSIG(status)
                return os.waitstatus_to_exitcode(status)
        if kernel is None:
            try:
                kernel = os.pidfd_open(2)
            except ProcessLookupError:
                if _last_pid() >= 2:  # it joined and ended before it was watched
                    return BRANCH_KERNEL_GONE
        if kernel is None:
            signal.sigtimedwait({signal.SIGCHLD}, 0.05)  # until the continuation joins
        elif select.select([kernel], [], [], 0.2)[0]:  # an orphan's end is reaped meanwhile
            return BRANCH_KERNEL_GONE


def _last_pid() -> int:
    """The last pid given out in this process's PID namespace."""
    with open("/proc/sys/kernel/ns_last_pid", encoding="ascii") as last:
        return int(last.read())


def _drop_all_capabilities() -> None:
    """No capability in any set (of the user namespace it is in), `no_new_privs`."""
    _drop_bounding_and_ambient()
    _clear_capabilities()


def _drop_bounding_and_ambient() -> None:
    """Empty the bounding and ambient sets (while CAP_SETPCAP is still held)."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as last:
        last_cap = int(last.read())
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def _clear_capabilities() -> None:
    """Empty the effective, permitted and inheritable sets; `no_new_privs`."""
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as out:
        out.write(text)


# The parent's mounts each sandbox mounts its own over, detached first: covered, they would
# still be in the kernel's /proc/self/mountinfo (the parent's /proc is of the gateway's PID
# namespace, its /run holds the parent's program and filter, its /tmp and /dev/pts its own)
REPLACED = ("/proc", "/run", "/tmp", "/dev/pts")


# What Docker's runtime masks (an empty file or folder over it) and makes read-only in a
# container's /proc and /sys; without capabilities most are closed anyway: this is parity
MASKED = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


def _mask_kernel_files() -> None:
    """A read-only /sys as in a container, then Docker's masks and read-only paths."""
    _mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _docker_masks()


def _docker_masks() -> None:
    """Docker's masked and read-only paths of /proc and /sys (those there are)."""
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for path in MASKED:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | hidden, "size=0,mode=0555")
        elif os.path.exists(path):
            _mount("/dev/null", path, None, MS_BIND)
    for path in READ_ONLY:
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount("none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | hidden)


def _cgroup_files(spec: dict[str, Any]) -> None:
    """/sys/fs/cgroup as in a container: the sandbox's own groups (the cgroup namespace's
    root), read-only; `spec`: {"v2": bool, "hierarchies": ["memory", "cpu,cpuacct", ...]}."""
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    root = "/sys/fs/cgroup"
    if not spec or not os.path.isdir(root):
        return
    if spec.get("v2"):
        _mount("cgroup2", root, "cgroup2", MS_RDONLY | hidden)
        return
    _mount("tmpfs", root, "tmpfs", hidden, "size=64k,mode=0755")
    for name in spec.get("hierarchies", []):
        os.mkdir(f"{root}/{name}", 0o755)
        _mount("cgroup", f"{root}/{name}", "cgroup", MS_RDONLY | hidden, name)
        for controller in name.split(","):
            if controller != name:  # co-mounted (cpu,cpuacct): each name a link, as usual
                os.symlink(name, f"{root}/{controller}")
    _mount("none", root, None, MS_REMOUNT | MS_RDONLY | hidden, "size=64k,mode=0755")


def _write_readonly(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(path, 0o444)


def _bind_readonly(source: str, target: str) -> None:
    """`source` (a file of the sandbox's own /run) over `target`, read-only."""
    hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount(source, target, None, MS_BIND)
    _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | hidden)


def _loopback_up() -> None:
    """A new network namespace has `lo`, down: up, as a container's (kernels such as Deno's
    talk over it)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH22x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING)
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, request)


def _drop(uid: int, gid: int, bpf: bytes) -> None:
    """The sandbox user, no capability in any set, no_new_privs, the seccomp filter."""
    _drop_bounding_and_ambient()
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _clear_capabilities()
    _prctl(PR_SET_DUMPABLE, 0)  # pid 1's memory and /proc files stay root's (the kernel: 1)
    count = len(bpf) // 8
    program = (_SockFilter * count).from_buffer_copy(bpf)
    fprog = _SockFprog(count, ctypes.cast(program, ctypes.POINTER(_SockFilter)))
    _check(
        _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0),
        "seccomp",
    )


def _kernel(request: dict[str, Any], kind: str) -> None:
    """The kernel process: its own session, nothing of the parent's open, fresh randomness."""
    os.setsid()
    os.closerange(3, 65536)  # stdin /dev/null, stdout and stderr the kernel's log (pid 1's)
    _prctl(PR_SET_DUMPABLE, 1)  # its own /proc files are its own, as after an exec
    os.umask(0o022)
    os.chdir(WORKDIR)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    reseed()
    argv = [str(a) for a in request["argv"]]
    if kind == "ipykernel":
        from kernels.python import prebuilt

        sys.argv = ["ipykernel", *argv]
        prebuilt.launch(argv)
    elif kind == "bash":
        from kernels import snapshot
        from kernels.bash.__main__ import run
        from kernels.bash.kernel import resume

        sys.argv = ["bash-kernel", *argv]
        snapshot.listen(resume)
        code = run(argv)
        if snapshot.kept():  # its run asked to keep its state: a fork of it is the snapshot
            snapshot.freeze()
        sys.exit(code)
    else:
        os.execve(argv[0], argv, dict(os.environ))  # noqa: S606 - the kernel's own command


def reseed() -> None:
    """Every random generator the parent may have seeded: a fork copies their state."""
    random.seed(os.urandom(32))
    numpy_random = sys.modules.get("numpy.random")  # imported later, it seeds itself then
    if numpy_random is not None:
        numpy_random.seed([int.from_bytes(os.urandom(4), "little") for _ in range(8)])
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None  # type: ignore[attr-defined]  # its own Random, made anew


def main(argv: list[str]) -> None:
    control_fd, kind, seccomp_file = int(argv[0]), argv[1], argv[2]
    warming = json.loads(argv[3])
    with open(seccomp_file, "rb") as program:
        bpf = program.read()
    if "/opt/gateway" not in sys.path:
        sys.path.insert(0, "/opt/gateway")
    os.environ.pop("PWD", None)  # bubblewrap's: a kernel's environment has none
    global _OWN_PID_NAMESPACE
    _OWN_PID_NAMESPACE = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    warm(kind, list(warming["preloads"]), list(warming["argv"]))
    serve(control_fd, kind, bpf)


if __name__ == "__main__":
    main(sys.argv[1:])
