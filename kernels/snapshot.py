"""A kept kernel, and the continuations forked from it (issue 32; DESIGN decision 24).
The same for every kernel that is a Python process (ipykernel: `kernels.python.resume`;
our bash kernel: `kernels.bash.kernel`); what differs is how each is told to keep its
state and how a continuation starts it again (the `restart` given to `listen`).

`keep()`, run silently in a kernel after its run, marks it, and the next request stops its
loop; the kernel's launcher then calls `freeze()`: the run's other processes end,
and a fork of the kernel process (its main thread alone) becomes the snapshot, blocked on
a socket in its socket folder (`SNAPSHOT_SOCKET`), which only the gateway reaches (through the
folder's descriptor); the kernel process itself becomes `sleep`.

Each order on that socket forks a continuation. The child (`_continue`) joins the
branch's cgroups and namespaces the gateway sends (built by the forkserver's parent,
owned by a user namespace whose owner is the sandbox uid: `kernels/zygote.py`,
`branch`), drops what that gave it, and forks the kernel process proper, which starts the
kernel again (`restart`) around the same state: the user's variables, imports and
execution count are the snapshot's; its key, sockets, threads and loop are its own.

Nothing here is trusted by the gateway: the snapshot ran user code, so this module's code
in it may have been replaced. What keeps branches apart is what the parent built.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import random
import socket
import stat
import sys
import traceback
from collections.abc import Callable
from typing import Any

SNAPSHOT_SOCKET = "/run/kernel/snapshot"
MAX_MESSAGE = 1 << 16
# setns(2)'s nstype for each namespace the gateway may hand over, in the order joined: the
# user namespace first (it is what allows the others), the PID namespace last (for children)
NAMESPACES = (
    ("user", 0x10000000),
    ("mnt", 0x00020000),
    ("uts", 0x04000000),
    ("ipc", 0x08000000),
    ("net", 0x40000000),
    ("cgroup", 0x02000000),
    ("pid", 0x20000000),
)
PR_CAPBSET_DROP = 24
LINUX_CAPABILITY_VERSION_3 = 0x20080522
WORKDIR = "/workspace"
KERNEL_LOG = "/run/kernel/kernel.log"

_kept = False


def keep() -> None:
    """This kernel is to become a snapshot once its loop stops: asked in a request of its
    own, whose reply goes out as any (a loop stopped in the same request could keep the
    reply queued)."""
    global _kept
    _kept = True


def kept() -> bool:
    return _kept


_listener: socket.socket | None = None
# how a continuation starts the kernel again, in its own process, with the order's argv
_restart: Callable[[list[str]], None] | None = None


def listen(restart: Callable[[list[str]], None]) -> None:
    """Bind the snapshot's socket, as the kernel starts: the gateway takes the socket folder
    from the kernel once its sockets exist, so nothing can be bound there later (and
    nothing swapped for what the gateway will connect to). `restart` is how a continuation
    starts the kernel again (it serves until the kernel ends, then freezes if kept)."""
    global _listener, _restart
    _restart = restart
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(SNAPSHOT_SOCKET)
    listener.listen(8)
    listener.set_inheritable(False)
    _listener = listener


SLEEP = ("/bin/sleep", "sleep", "infinity")


def freeze() -> None:
    """Become the snapshot, frozen: every other process of the sandbox ends (the kernel's
    pid 1, its reaper, excepted), a fork of this one (its main thread alone: no thread of
    the run's goes on) serves continuation orders (`hold`), and this process, which the
    sandbox's pid 1 waits for, becomes `sleep` (an exec ends its other threads and frees
    its memory; the fork keeps every page). Nothing of the run's runs any more."""
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # the kernel's log, not iopub
    with contextlib.suppress(OSError):
        os.kill(-1, 9)  # every process this uid may signal here, but pid 1 and this one
    if os.fork() == 0:
        code = 70
        try:
            hold()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.execv(SLEEP[0], list(SLEEP[1:]))  # noqa: S606 - a fixed program, no shell


def hold() -> None:
    """Serve continuation orders until the gateway kills this process (blocking)."""
    listener = _listener
    if listener is None:
        raise RuntimeError("this kernel has no snapshot socket")
    while True:
        connection, _ = listener.accept()
        with connection:
            try:
                data, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 32)
            except OSError:
                continue
            try:
                order = json.loads(data)
                # Python re-seeds `random` in a forked child: the continuation gets this back
                # (a continuation is the same state; numpy's generators carry theirs anyway)
                state = random.getstate()
                child = os.fork()
                if child == 0:
                    code = 70
                    try:
                        listener.close()
                        _continue(order, fds, state)
                        code = 0
                    except BaseException as exc:
                        traceback.print_exc()  # the snapshot's log
                        told = json.dumps({"error": repr(exc)}).encode()
                        with contextlib.suppress(OSError):
                            socket.send_fds(connection, [told], [])
                    finally:
                        os._exit(code)
                pidfd = os.pidfd_open(child)
                try:
                    socket.send_fds(connection, [json.dumps({"pid": child}).encode()], [pidfd])
                finally:
                    os.close(pidfd)
                os.waitpid(child, 0)  # it forks the kernel and ends at once
            except (OSError, ValueError):
                pass
            finally:
                for fd in fds:
                    os.close(fd)


def _continue(order: dict[str, Any], fds: list[int], state: object) -> None:
    """The continuation's first process: into the branch's sandbox, then fork the kernel."""
    count = int(order.get("cgroups", 0))
    names = [str(n) for n in order.get("namespaces", [])]
    *rest, private = fds
    for fd in rest[:count]:
        os.write(fd, b"0")  # opened by the gateway (root): its open-time rights allow this
    namespaces = dict(zip(names, rest[count:], strict=True))
    # the snapshot's working folder, opened before the branch's mount namespace hides it
    working = os.open(WORKDIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    libc = ctypes.CDLL(None, use_errno=True)
    for name, nstype in NAMESPACES:
        if name in namespaces and libc.setns(namespaces[name], nstype) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
    if "user" in namespaces:
        _drop_capabilities(libc)
    kernel = os.fork()
    if kernel == 0:
        code = 70
        try:
            random.setstate(state)  # type: ignore[arg-type]
            _kernel(private, working)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)


def _drop_capabilities(libc: Any) -> None:
    """Joining the user namespace gave every capability in it: none are kept."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # past the last capability

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("e", ctypes.c_uint32), ("p", ctypes.c_uint32), ("i", ctypes.c_uint32)]

    header = Header(LINUX_CAPABILITY_VERSION_3, 0)
    data = (Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _kernel(private: int, working: int) -> None:
    """The continuation's kernel process: the snapshot's working folder copied, its own
    session, output, environment and sockets."""
    global _kept
    _kept = False  # the snapshot's was True: this kernel is kept only if asked again
    # Every object of the snapshot is never collected here: the old kernel's sockets, which
    # the restart lets go of, are cycles a later collection would end, and ending a zmq
    # socket whose descriptors are /dev/null now aborts the process (libzmq's signaler); nor
    # does a collection walk, and so copy, the snapshot's pages
    gc.freeze()
    os.setsid()
    with os.fdopen(os.dup(private), "rb") as source:
        request: dict[str, Any] = json.loads(source.read())
    _copy_tree(working, WORKDIR)
    _cover_inherited_descriptors()
    os.umask(0o022)
    os.chdir(WORKDIR)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    argv = [str(a) for a in request["argv"]]
    if _restart is None:
        raise RuntimeError("this kernel cannot be started again")
    _restart(argv)


def _copy_tree(source: int, target: str) -> None:
    """Copy the folder open as `source` into `target` (files, folders, links as links;
    nothing followed)."""
    for folder, dirs, files, fd in os.fwalk(".", dir_fd=source, follow_symlinks=False):
        here = os.path.normpath(os.path.join(target, folder))
        for name in dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(here, name), 0o755)
        for name in files:
            to = os.path.join(here, name)
            try:
                os.symlink(os.readlink(name, dir_fd=fd), to)
                continue
            except OSError:
                pass  # not a link
            try:
                opened = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            except OSError:
                continue  # a socket, a fifo: not carried
            with os.fdopen(opened, "rb") as src:
                mode = os.fstat(src.fileno()).st_mode
                if not stat.S_ISREG(mode):
                    continue
                with open(to, "xb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                os.chmod(to, mode & 0o777)
    os.close(source)


def _cover_inherited_descriptors() -> None:
    """Every descriptor the snapshot had open (its files, sockets, the old kernel's) is
    /dev/null from here: closed, its number could be reused by a new socket and then
    written to by an object of the snapshot that still holds it."""
    null = os.open("/dev/null", os.O_RDWR)
    log = os.open(KERNEL_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in (null, log):
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
