"""The gateway's side of one warm parent (`kernels/zygote.py`): starts it in the kernel
image's root file system with bubblewrap, talks to it over a socket pair (no path: nothing
else can reach it), and starts it again when it has died.

The parent runs as root with every capability (it must mount, unshare and change uid for
its children) in a mount namespace of its own whose root is the image's (read-only), with
its own /proc, /dev, /tmp and /run; it sees none of the host's files. It never runs user
code: each request is a fork whose child sandboxes itself before anything else runs. A
stop (or a start again) kills bubblewrap and the parent itself, and returns once the parent
is gone (through the pidfd it sends when it is ready).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from gateway.errors import SandboxError
from gateway.sandbox import kernelspec
from gateway.sandbox.base import to_the_end

log = logging.getLogger(__name__)

PYTHON = "/opt/venv/bin/python"
PROGRAM = "/run/forkserver/zygote.py"
FILTER = "/run/forkserver/seccomp.bpf"
MAX_MESSAGE = 1 << 16
MAX_DESCRIPTORS = 16
# what a branch's answer holds besides its folders and pidfd: its namespaces, in the order
# the continuation joins them (`kernels/zygote.py`, BRANCH_NAMESPACES)
BRANCH_NAMESPACES = ("user", "mnt", "uts", "ipc", "net", "cgroup", "pid")
READY_TIMEOUT = 120.0
SPAWN_TIMEOUT = 60.0
EXIT_TIMEOUT = 10.0  # how long a parent killed at stop may take to be gone


class Parent:
    """One warm parent of one kind (`ipykernel`, `bash` or `exec`)."""

    def __init__(
        self,
        kind: str,
        rootfs: Path,
        program: Path,
        seccomp: Path,
        preloads: tuple[str, ...],
        log_path: Path,
        kernel_argv: list[str] | None = None,
    ) -> None:
        self.kind = kind
        self.rootfs = rootfs
        self.program = program
        self.seccomp = seccomp
        self.preloads = preloads if kind == "ipykernel" else ()
        self.log_path = log_path
        # the Python kernel's command line, which the parent builds its kernel for
        self.kernel_argv = list(kernel_argv or []) if kind == "ipykernel" else []
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None  # the parent's own pid (inside bubblewrap)
        self._pidfd: int | None = None  # the parent's own pidfd, which it sent when ready
        self._sock: socket.socket | None = None
        self._ready: asyncio.Future[int] | None = None
        self._replies: dict[int, asyncio.Future[tuple[dict[str, Any], list[int]]]] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        # an end told before `spawn` has taken its kernel's reply (the two messages may be
        # read in one go): kept until then
        self._early: dict[int, int] = {}
        self._next = 0
        self._lock = asyncio.Lock()
        self.restarts = -1

    @property
    def alive(self) -> bool:
        return self._sock is not None and self.process is not None and self.process.poll() is None

    def command(self, fd: int, program: int, seccomp: int) -> list[str]:
        """Bubblewrap's command line: `fd` the parent's end of the socket pair, `program`
        and `seccomp` descriptors of zygote.py and the filter, which bubblewrap copies into
        the parent's /run (files of its tmpfs, not bind mounts: a bind mount's root, a path
        in the host's file system, is in every forked kernel's /proc/self/mountinfo)."""
        command = ["bwrap", "--die-with-parent", "--new-session", "--clearenv"]
        # the kernel's own base environment: what the parent builds is what a kernel would
        for name, value in kernelspec.image_env().items():
            command += ["--setenv", name, value]
        command += [
            "--ro-bind", str(self.rootfs), "/",
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            "--tmpfs", "/run",
            "--perms", "0444", "--file", str(program), PROGRAM,
            "--perms", "0444", "--file", str(seccomp), FILTER,
            "--unshare-ipc",
            "--unshare-uts",
            "--cap-add", "ALL",
            "--chdir", "/",
            "--",
            PYTHON, "-P", PROGRAM, str(fd), self.kind, FILTER,
            json.dumps({"preloads": list(self.preloads), "argv": self.kernel_argv}),
        ]  # fmt: skip
        return command

    async def ensure(self) -> None:
        """Start the parent if it is not running (again, if it died)."""
        async with self._lock:
            if self.alive:
                return
            await self._stop()
            await self._start()

    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.restarts += 1
        try:  # cancelled, the process is still this parent's when it is made (`_stop`)
            await to_the_end(asyncio.to_thread(self._popen, theirs.fileno()))
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_message)
        try:
            self.pid = await asyncio.wait_for(asyncio.shield(self._ready), READY_TIMEOUT)
        except (TimeoutError, SandboxError) as exc:
            tail = self.log_tail()
            await self._stop()
            raise SandboxError(
                f"The forkserver's {self.kind} parent did not start: {tail}"
            ) from exc
        log.info("forkserver: %s parent ready (pid %s)", self.kind, self.pid)

    def _popen(self, fd: int) -> None:
        with (
            open(self.log_path, "ab") as logfile,
            open(self.program, "rb") as program,
            open(self.seccomp, "rb") as seccomp,
        ):
            files = (program.fileno(), seccomp.fileno())
            self.process = subprocess.Popen(
                self.command(fd, *files),
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=logfile,
                pass_fds=(fd, *files),
                close_fds=True,
            )

    def log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-2000:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _on_message(self) -> None:
        assert self._sock is not None
        try:
            data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, MAX_DESCRIPTORS)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self._gone()
            return
        message = json.loads(data)
        if "ready" in message and self._ready is not None and not self._ready.done():
            if fds and self._pidfd is None:
                self._pidfd = fds.pop(0)
            self._ready.set_result(int(message["ready"]))
        elif "exit" in message:
            future = self._exits.pop(int(message["exit"]), None)
            if future is None:
                self._early[int(message["exit"])] = int(message["status"])
            elif not future.done():
                future.set_result(int(message["status"]))
        elif "id" in message:
            reply = self._replies.pop(int(message["id"]), None)
            if reply is not None and not reply.done():
                reply.set_result((message, list(fds)))
                return
        for fd in fds:
            os.close(fd)

    def _gone(self) -> None:
        """The parent closed its end (it died): nothing it started can be told any more."""
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        error = SandboxError(f"The forkserver's {self.kind} parent died: {self.log_tail()}")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # told to whoever awaits it; nobody else need be
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(error)
        # its kernels live on (their pid 1 was its child): each sandbox learns of its
        # kernel's end through its pidfd now (ForkserverSandbox._on_pidfd)
        self._replies.clear()
        self._exits.clear()
        self._early.clear()

    async def spawn(
        self, fds: list[int], branch: bool = False
    ) -> tuple[int, list[int], asyncio.Future[int | None]]:
        """Fork one sandboxed kernel: its pid, [working folder, socket folder, pidfd], its
        exit. What the kernel is to be (its request: uid, hostname, limits, connection,
        ...) is in the last of `fds`, a memfd the parent passes on unread
        (`kernels/zygote.py`). A `branch` is a sandbox without a kernel, for a
        continuation of a snapshot to join: its namespaces follow the socket folder
        (`BRANCH_NAMESPACES`)."""
        await self.ensure()
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        self._next += 1
        ident = self._next
        reply: asyncio.Future[tuple[dict[str, Any], list[int]]] = loop.create_future()
        self._replies[ident] = reply
        data = json.dumps({"op": "branch" if branch else "spawn", "id": ident}).encode()
        try:
            socket.send_fds(self._sock, [data], fds)
            message, handed = await asyncio.wait_for(asyncio.shield(reply), SPAWN_TIMEOUT)
        except TimeoutError:
            self._replies.pop(ident, None)
            raise SandboxError("The forkserver did not answer in time.") from None
        except BaseException:
            self._replies.pop(ident, None)
            if reply.done() and not reply.cancelled() and reply.exception() is None:
                for fd in reply.result()[1]:
                    os.close(fd)
            raise
        if "error" in message:
            for fd in handed:
                os.close(fd)
            raise SandboxError(f"The forked kernel's sandbox could not be made: {message['error']}")
        if len(handed) != 3 + (len(BRANCH_NAMESPACES) if branch else 0):
            for fd in handed:
                os.close(fd)
            raise SandboxError("The forkserver answered without the kernel's descriptors.")
        pid = int(message["pid"])
        exited: asyncio.Future[int | None] = loop.create_future()
        if pid in self._early:
            exited.set_result(self._early.pop(pid))
        else:
            self._exits[pid] = exited
        return pid, handed, exited

    async def _stop(self) -> None:
        """Kill bubblewrap and the parent itself, and return once both are gone (the
        parent would die with bubblewrap, but a while later: its address space is large)."""
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        process, self.process = self.process, None
        pidfd, self._pidfd = self._pidfd, None
        try:
            if pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await to_the_end(asyncio.to_thread(process.wait))
            if pidfd is not None:
                await to_the_end(asyncio.to_thread(_wait_gone, pidfd, EXIT_TIMEOUT))
        finally:
            if pidfd is not None:
                os.close(pidfd)

    async def close(self) -> None:
        async with self._lock:
            await self._stop()
            self._gone()


def _wait_gone(pidfd: int, timeout: float) -> None:
    """Wait until the process of `pidfd` has exited (its pidfd is readable then), at most
    `timeout` s (blocking)."""
    waiting = select.poll()
    waiting.register(pidfd, select.POLLIN)
    waiting.poll(int(timeout * 1000))
