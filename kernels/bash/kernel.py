"""A Jupyter kernel for bash (messaging protocol 5.3) that needs neither IPython nor ipykernel.

The main thread runs one zmq poller over the shell, control and stdin sockets, a signal wakeup
pipe and the pipes of the bash process (see `kernels.bash.shell`); a second thread echoes
heartbeats. Shell requests are handled one at a time: while a cell runs, the shell socket is left
unread (requests queue) and the control socket stays live for interrupts and shutdown.

Every execute_reply carries ``exit_code`` (the cell's ``$?``) in its content and its metadata; a
non-zero code makes the reply ``status: error`` with ``ename: "ExitStatus"``.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import zmq
from jupyter_client.session import Session

from kernels import snapshot
from kernels.bash.shell import BashShell, MarkerCutter, ShellError, marker_bytes

log = logging.getLogger("kernels.bash")

Message = dict[str, Any]
Socket = zmq.Socket[bytes]
Handler = Callable[[Socket, list[bytes], Message], bool]

PROTOCOL_VERSION = "5.3"
IMPLEMENTATION = "gateway-bash"
IMPLEMENTATION_VERSION = "0.1.0"
CHANNELS = ("shell", "control", "stdin", "iopub", "hb")
STREAMS = ("stdout", "stderr")
FLUSH_INTERVAL = 0.05  # seconds between the stream messages of a burst of output
MAX_CHUNK = 64 * 1024  # bytes of output per stream message
MAX_SEGMENTS = 1024  # changes of stream held back before messages go out
MARKER_GRACE = 2.0  # after `done`, how long to wait for the end markers on stdout and stderr
INTERRUPT_GRACE = 3.0  # after SIGINT, how long a cell may go on before bash is killed
DRAIN_GRACE = 0.5  # after bash died, how long to read output still in the pipes
CHECK_INTERVAL = 0.1  # while a cell runs: how often to check that bash is alive
EXIT_CHECK_INTERVAL = 0.005  # the same, in the first EXIT_WINDOW s after bash closed fd 61
EXIT_WINDOW = 0.2
IDLE_INTERVAL = 1.0  # while idle: how often to check bash and the parent process
SOCKET_LINGER_MS = 500

# A kept kernel (`kernels.snapshot`, DESIGN decision 24): the gateway's two silent requests.
# `keep` writes the shell's state as a script (`_DUMP`) and keeps it in this process's
# memory, which the snapshot is a fork of; `stop` ends the loop. A continuation starts a
# new bash that sources the script before its first cell (`resume`).
KEEP_REQUEST = "__gateway_keep__"
STOP_REQUEST = "__gateway_stop__"
STATE_FILE = "state.sh"
XTRACE_MARK = "#gw-xtrace"
# In a subshell (it has the shell's variables, functions, aliases, options, folder and
# umask, and whatever it sets goes with it): what makes the shell this state, the
# options last (an `errexit` or `nounset` among them cannot stop the rest), `xtrace` off
# and marked (the kernel turns it on per cell, never in its loop). Not carried: bash's own
# variables (its PID, `RANDOM`'s state, `SECONDS`), traps, jobs and the folder stack.
_DUMP = (
    r"""(
__gw_o=$(builtin set +o) __gw_f=$-
builtin set +e +u +x
builtin declare -p IFS 2>/dev/null
IFS=$' \t\n'
for __gw_n in $(builtin compgen -v); do
  case $__gw_n in
    __gw_*|IFS|BASH|BASH_*|BASHOPTS|BASHPID|EUID|UID|PPID|SHELLOPTS|FUNCNAME|GROUPS) ;;
    RANDOM|SRANDOM|SECONDS|LINENO|HISTCMD|EPOCHREALTIME|EPOCHSECONDS|DIRSTACK) ;;
    PIPESTATUS|_|SHLVL|PWD|OLDPWD|COMP_WORDBREAKS) ;;
    *) builtin declare -p -- "$__gw_n" 2>/dev/null ;;
  esac
done
builtin declare -f
builtin alias -p
builtin shopt -p
builtin printf 'builtin cd -- %q\n' "$PWD"
builtin printf 'builtin umask %s\n' "$(builtin umask)"
builtin printf '%s\n' "$__gw_o"
[[ $__gw_f == *x* ]] && builtin printf '%s\n' '"""
    + XTRACE_MARK
    + r"""'
builtin printf 'builtin set +x\n'
) > {file} 2>/dev/null
"""
)
_kept_state: bytes | None = None  # the shell's state as `keep` found it


@dataclass(frozen=True)
class Connection:
    """The parts of a Jupyter connection file the kernel needs."""

    transport: str
    ip: str
    key: bytes
    signature_scheme: str
    ports: dict[str, int]

    @classmethod
    def load(cls, path: str | Path) -> Connection:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(
            transport=str(info.get("transport", "tcp")),
            ip=str(info.get("ip", "127.0.0.1")),
            key=str(info.get("key", "")).encode(),
            signature_scheme=str(info.get("signature_scheme", "hmac-sha256")),
            ports={channel: int(info.get(f"{channel}_port", 0)) for channel in CHANNELS},
        )

    def url(self, channel: str) -> str:
        """The address to bind, spelled as jupyter_client spells it (ipc: ``ip-port``)."""
        port = self.ports[channel]
        if port <= 0:
            raise ValueError(f"connection file has no {channel}_port")
        if self.transport == "ipc":
            return f"ipc://{self.ip}-{port}"
        if self.transport == "tcp":
            return f"tcp://{self.ip}:{port}"
        raise ValueError(f"unsupported transport {self.transport!r}")


@dataclass
class Cell:
    """An execute_request being run."""

    request: Message
    idents: list[bytes]
    started: bool = False  # bash said `start`: it is safe to send SIGINT
    status: int | None = None  # from bash's `done` line
    done_at: float = 0.0
    markers_seen: set[str] = field(default_factory=set)
    interrupt_pending: bool = False
    kill_at: float | None = None


class Output:
    """Turns stdout/stderr bytes into stream messages, in the order they came.

    Consecutive bytes of one stream go out as one message, and a change of stream starts a
    new one (as nbformat merges outputs), so a burst costs one message per change of stream,
    not one per write. Messages leave at most every FLUSH_INTERVAL (the first right away), or
    as soon as MAX_CHUNK bytes or MAX_SEGMENTS changes of stream are waiting; none is longer
    than MAX_CHUNK bytes.
    """

    def __init__(self, publish: Callable[[str, str], None]) -> None:
        self._publish = publish
        self._pending: list[tuple[str, bytearray]] = []  # (stream, bytes), oldest first
        self._size = 0
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in STREAMS
        }
        self._last_flush = 0.0

    def add(self, name: str, data: bytes, now: float) -> None:
        if not data:
            return
        if self._pending and self._pending[-1][0] == name:
            self._pending[-1][1].extend(data)
        else:
            self._pending.append((name, bytearray(data)))
        self._size += len(data)
        if (
            self._size >= MAX_CHUNK
            or len(self._pending) >= MAX_SEGMENTS
            or now - self._last_flush >= FLUSH_INTERVAL
        ):
            self.flush(now)

    def deadline(self) -> float | None:
        return self._last_flush + FLUSH_INTERVAL if self._pending else None

    def flush(self, now: float, final: bool = False) -> None:
        for name, pending in self._pending:
            decoder = self._decoders[name]
            for start in range(0, len(pending), MAX_CHUNK):
                text = decoder.decode(bytes(pending[start : start + MAX_CHUNK]))
                if text:
                    self._publish(name, text)
        self._pending.clear()
        self._size = 0
        if final:
            for name, decoder in self._decoders.items():
                text = decoder.decode(b"", final=True)
                if text:
                    self._publish(name, text)
        self._last_flush = now


def _echo_heartbeats(sock: Socket) -> None:
    try:
        while True:
            sock.send(sock.recv())
    except zmq.ContextTerminated:
        pass
    finally:
        sock.close(linger=0)


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    """Signals are read from the wakeup pipe by the event loop."""


class BashKernel:
    """The kernel: sockets, message handling and the event loop."""

    def __init__(self, connection: Connection, restore: bytes | None = None) -> None:
        """`restore`: a kept shell's state (`_DUMP`), which the first bash starts in."""
        self.connection = connection
        self._restore = restore
        self._keeping = False  # the cell running is `keep`'s dump
        self.session = Session(
            key=connection.key, signature_scheme=connection.signature_scheme, username="kernel"
        )
        self.kernel_id = str(uuid.uuid4())
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("JPY_")}
        self.bash: BashShell | None = None
        self._dead: tuple[int, float] | None = None  # bash has exited: (exit code, drain until)
        self.cell: Cell | None = None
        self.parent: Message | None = None  # stream output outside a cell goes here
        self.execution_count = 0
        self.running = True
        self.output = Output(self._publish_stream)
        self.cutters = {name: MarkerCutter() for name in STREAMS}
        self._parent_pid = os.getppid() if "JPY_PARENT_PID" in os.environ else None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.context = zmq.Context()
        self.shell_socket = self._bind(zmq.ROUTER, "shell")
        self.control_socket = self._bind(zmq.ROUTER, "control")
        self.stdin_socket = self._bind(zmq.ROUTER, "stdin")
        self.iopub_socket = self._bind(zmq.XPUB, "iopub")  # XPUB: welcome new subscribers
        # wait for a slow subscriber instead of dropping messages (one per change of stream)
        self.iopub_socket.setsockopt(zmq.XPUB_NODROP, 1)
        self._hb_socket = self._bind(zmq.REP, "hb")
        self._heartbeat = threading.Thread(
            target=_echo_heartbeats, args=(self._hb_socket,), daemon=True
        )
        self.shell_handlers: dict[str, Handler] = {
            "execute_request": self._execute_request,
            "kernel_info_request": self._kernel_info_request,
            "is_complete_request": self._trivial_request,
            "complete_request": self._trivial_request,
            "inspect_request": self._trivial_request,
            "history_request": self._trivial_request,
            "comm_info_request": self._trivial_request,
            "shutdown_request": self._shutdown_request,
        }
        self.control_handlers: dict[str, Handler] = {
            "kernel_info_request": self._kernel_info_request,
            "interrupt_request": self._interrupt_request,
            "shutdown_request": self._shutdown_request,
        }
        self.workdir = Path(tempfile.mkdtemp(prefix="bash-kernel-"))  # mode 0700; holds cell.sh

    def _bind(self, kind: int, channel: str) -> Socket:
        sock = self.context.socket(kind)
        sock.linger = SOCKET_LINGER_MS
        sock.bind(self.connection.url(channel))
        return sock

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _ignore_signal)
        self._heartbeat.start()
        self._publish("status", {"execution_state": "starting"}, None)
        self._ensure_shell()

    def close(self) -> None:
        """Kill bash, remove the temp folder, close the sockets. Safe to call more than once."""
        try:
            self._stop_bash()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
            if not self.context.closed:
                for sock in (
                    self.shell_socket,
                    self.control_socket,
                    self.stdin_socket,
                    self.iopub_socket,
                ):
                    sock.close()
                if not self._heartbeat.is_alive():
                    self._hb_socket.close()
                self.context.term()  # the heartbeat thread closes its socket on ETERM
            signal.set_wakeup_fd(-1)
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _ensure_shell(self) -> BashShell:
        bash = self.bash
        if bash is not None and (self._dead is not None or bash.poll() is not None):
            bash.close()
            bash = None
            self.bash = self._dead = None
        if bash is None:
            init = None
            if self._restore is not None:  # the first bash only: a later one starts anew
                init = self.workdir / STATE_FILE
                init.write_bytes(self._restore)
                self._restore = None
            bash = BashShell(self.workdir, self.env, init)
            if init is not None:
                bash.xtrace = XTRACE_MARK.encode() in init.read_bytes()
            bash.wait_ready()
            self.bash = bash
            for cutter in self.cutters.values():
                cutter.disarm()
        return bash

    def _stop_bash(self) -> None:
        """Kill bash's session now; a running cell gets its reply with what was already output."""
        bash = self.bash
        if bash is None:
            return
        code = bash.kill()
        if self.cell is not None:
            for name, data in bash.drain_output():  # never wait for writers outside
                self._on_output(name, data)
            self._finish(self.cell.status if self.cell.status is not None else code)
        bash.close()
        self.bash = self._dead = None

    # -- event loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control_socket, zmq.POLLIN)
        poller.register(self.stdin_socket, zmq.POLLIN)
        poller.register(self.iopub_socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while self.running:
            poller.register(self.shell_socket, zmq.POLLIN if self.cell is None else 0)
            fds = self._bash_fds()
            for fd in fds:
                poller.register(fd, zmq.POLLIN)
            events = dict(poller.poll(self._timeout_ms()))
            for fd in fds:
                poller.unregister(fd)
            if self._wake_r in events:
                self._on_signals()
            bash = self.bash
            if bash is not None:
                for name, data in bash.read_output():  # before `done`: the output came first
                    self._on_output(name, data)
                if bash.status_fd in events and not bash.status_eof:
                    self._on_status(bash)
            if self.control_socket in events:
                self._receive(self.control_socket, self.control_handlers)
            if self.running and self.cell is None and self.shell_socket in events:
                self._receive(self.shell_socket, self.shell_handlers)
            if self.iopub_socket in events:
                self._on_subscription()
            if self.stdin_socket in events:
                with contextlib.suppress(zmq.Again):
                    self.stdin_socket.recv_multipart(zmq.NOBLOCK)  # we never ask for input
            self._tick()

    def _bash_fds(self) -> list[int]:
        bash = self.bash
        if bash is None:
            return []
        fds = bash.output.poll_fds()
        if not bash.status_eof:
            fds.append(bash.status_fd)
        return fds

    def _timeout_ms(self) -> int:
        now = time.monotonic()
        deadlines = [now + IDLE_INTERVAL]
        if (flush_at := self.output.deadline()) is not None:
            deadlines.append(flush_at)
        if self.bash is not None and (stalled := self.bash.output.deadline()) is not None:
            deadlines.append(stalled)
        cell = self.cell
        if cell is not None:
            bash = self.bash
            exiting = (
                bash is not None and bash.status_eof and now - bash.status_eof_at < EXIT_WINDOW
            )
            deadlines.append(now + (EXIT_CHECK_INTERVAL if exiting else CHECK_INTERVAL))
            if cell.status is not None:
                deadlines.append(cell.done_at + MARKER_GRACE)
            if cell.kill_at is not None:
                deadlines.append(cell.kill_at)
        if self._dead is not None:
            deadlines.append(self._dead[1])
        return max(0, int((min(deadlines) - now) * 1000) + 1)

    def _tick(self) -> None:
        now = time.monotonic()
        flush_at = self.output.deadline()
        if flush_at is not None and now >= flush_at:
            self.output.flush(now)
        cell = self.cell
        if (
            cell is not None
            and cell.status is not None
            and (len(cell.markers_seen) == len(STREAMS) or now >= cell.done_at + MARKER_GRACE)
        ):
            self._finish(cell.status)
            return
        if cell is not None and cell.kill_at is not None and now >= cell.kill_at:
            log.warning("cell ignored the interrupt for %.0f s: killing bash", INTERRUPT_GRACE)
            cell.kill_at = None
            if self.bash is not None:
                self.bash.kill()
        self._check_bash(now)
        if self._parent_pid is not None and os.getppid() != self._parent_pid:
            log.warning("parent process %d is gone: shutting down", self._parent_pid)
            self.running = False

    def _check_bash(self, now: float) -> None:
        """Notice that bash has exited; once its output is read, finish the cell with its code."""
        bash = self.bash
        if bash is None:
            return
        if self._dead is None:
            if bash.poll() is None:
                return
            self._dead = (bash.kill(), now + DRAIN_GRACE)  # kill what it left in the background
        code, drain_until = self._dead
        if bash.output_open() and now < drain_until:
            return
        bash.close()
        self.bash = self._dead = None
        if self.cell is not None:
            self._finish(code)

    def _on_signals(self) -> None:
        try:
            signums = os.read(self._wake_r, 64)
        except BlockingIOError:
            return
        for signum in signums:
            if signum == signal.SIGINT:
                self._interrupt()
            else:
                log.warning("signal %d: shutting down", signum)
                self.running = False

    def _on_subscription(self) -> None:
        """Greet each new iopub subscriber with ``iopub_welcome`` (as ipykernel 7 does), so a
        client can tell that its subscription is live."""
        try:
            event = self.iopub_socket.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        if event[:1] == b"\x01":
            topic = event[1:]
            content = {"subscription": topic.decode("utf-8", "replace")}
            ident = [topic] if topic else None
            self.session.send(self.iopub_socket, "iopub_welcome", content, ident=ident)

    def _on_status(self, bash: BashShell) -> None:
        cell = self.cell
        for line in bash.read_status() or []:
            word, _, rest = line.partition(" ")
            if cell is None:
                continue
            if word == "start":
                cell.started = True
                if cell.interrupt_pending:
                    bash.interrupt()
            elif word == "done":
                status, _, flags = rest.partition(" ")
                cell.status = int(status)
                cell.done_at = time.monotonic()
                bash.xtrace = "x" in flags

    def _on_output(self, name: str, data: bytes) -> None:
        data, found = self.cutters[name].feed(data)
        if found and self.cell is not None:
            self.cell.markers_seen.add(name)
        self.output.add(name, data, time.monotonic())

    def _interrupt(self) -> None:
        cell, bash = self.cell, self.bash
        if cell is None or bash is None or self._dead is not None or cell.status is not None:
            return
        if cell.started:
            bash.interrupt()
        else:
            cell.interrupt_pending = True
        if cell.kill_at is None:
            cell.kill_at = time.monotonic() + INTERRUPT_GRACE

    # -- messages ------------------------------------------------------------------------------

    def _receive(self, sock: Socket, handlers: dict[str, Handler]) -> None:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            idents, parts = self.session.feed_identities(frames)
            msg: Message = self.session.deserialize(parts)
        except Exception as exc:
            log.warning("dropped an invalid message: %s", exc)
            return
        msg_type = msg["header"].get("msg_type", "")
        self._publish("status", {"execution_state": "busy"}, msg)
        handler = handlers.get(msg_type)
        done = True
        if handler is None:
            log.warning("ignored a %r message", msg_type)
        else:
            done = handler(sock, idents, msg)
        if done:
            self._publish("status", {"execution_state": "idle"}, msg)

    def _reply(self, sock: Socket, idents: list[bytes], request: Message, content: Message) -> None:
        msg_type = request["header"]["msg_type"].replace("_request", "_reply")
        self.session.send(sock, msg_type, content, parent=request, ident=idents)

    def _publish(self, msg_type: str, content: Message, parent: Message | None) -> None:
        topic = f"kernel.{self.kernel_id}.{msg_type}".encode()
        self.session.send(self.iopub_socket, msg_type, content, parent=parent, ident=[topic])

    def _publish_stream(self, name: str, text: str) -> None:
        self._publish("stream", {"name": name, "text": text}, self.parent)

    def _execute_request(self, sock: Socket, idents: list[bytes], msg: Message) -> bool:
        content = msg["content"]
        code = str(content.get("code", ""))
        silent = bool(content.get("silent", False))
        if silent and code == STOP_REQUEST:  # no reply: the loop ends (`keep`)
            self.running = False
            return True
        if silent and code == KEEP_REQUEST:
            self._keeping = True
            code = _DUMP.replace("{file}", shlex.quote(str(self.workdir / STATE_FILE)))
        if not silent:
            self.execution_count += 1
            count = self.execution_count
            self._publish("execute_input", {"code": code, "execution_count": count}, msg)
        self.parent = msg
        self.cell = Cell(request=msg, idents=idents)
        try:
            bash = self._ensure_shell()
            token = secrets.token_hex(16)
            for cutter in self.cutters.values():
                cutter.arm(marker_bytes(token))
            bash.run(code, token)
        except (ShellError, OSError) as exc:
            log.warning("cannot run the cell: %s", exc)
            self._publish_stream("stderr", f"bash kernel: cannot run the cell: {exc}\n")
            self._finish(126)
        return False  # _finish publishes idle

    def _finish(self, exit_code: int) -> None:
        cell = self.cell
        if cell is None:
            return
        self.cell = None
        if self._keeping:
            self._keeping = False
            exit_code = self._keep() if exit_code == 0 else exit_code
        now = time.monotonic()
        for name, cutter in self.cutters.items():
            self.output.add(name, cutter.disarm(), now)
        self.output.flush(now, final=True)
        reply: Message
        if exit_code == 0:
            reply = {"status": "ok", "user_expressions": {}, "payload": []}
        else:
            reply = {"status": "error", "ename": "ExitStatus", "evalue": str(exit_code)}
            reply["traceback"] = []
        reply["execution_count"] = self.execution_count
        reply["exit_code"] = exit_code
        self.session.send(
            self.shell_socket,
            "execute_reply",
            reply,
            parent=cell.request,
            ident=cell.idents,
            metadata={"exit_code": exit_code},
        )
        self._publish("status", {"execution_state": "idle"}, cell.request)

    def _keep(self) -> int:
        """`keep`'s dump is written: hold it in memory and mark the kernel (0), or fail (1)."""
        global _kept_state
        try:
            _kept_state = (self.workdir / STATE_FILE).read_bytes()
        except OSError as exc:
            log.warning("the shell's state could not be read: %s", exc)
            return 1
        snapshot.keep()
        return 0

    def _kernel_info_request(self, sock: Socket, idents: list[bytes], msg: Message) -> bool:
        version = self.bash.version if self.bash is not None else ""
        language_info = {
            "name": "bash",
            "version": version.split("(")[0],
            "mimetype": "text/x-sh",
            "file_extension": ".sh",
            "codemirror_mode": "shell",
            "pygments_lexer": "bash",
        }
        content = {
            "status": "ok",
            "protocol_version": PROTOCOL_VERSION,
            "implementation": IMPLEMENTATION,
            "implementation_version": IMPLEMENTATION_VERSION,
            "language_info": language_info,
            "banner": f"GNU bash {version} (gateway bash kernel {IMPLEMENTATION_VERSION})",
            "help_links": [],
        }
        self._reply(sock, idents, msg, content)
        return True

    def _interrupt_request(self, sock: Socket, idents: list[bytes], msg: Message) -> bool:
        self._interrupt()
        self._reply(sock, idents, msg, {"status": "ok"})
        return True

    def _shutdown_request(self, sock: Socket, idents: list[bytes], msg: Message) -> bool:
        self._stop_bash()
        restart = bool(msg["content"].get("restart", False))
        self._reply(sock, idents, msg, {"status": "ok", "restart": restart})
        self.running = False
        return True

    def _trivial_request(self, sock: Socket, idents: list[bytes], msg: Message) -> bool:
        """Requests answered without bash: no completion, inspection, history or comms."""
        request = msg["content"]
        content: Message = {"status": "ok"}
        msg_type = msg["header"]["msg_type"]
        if msg_type == "is_complete_request":
            if str(request.get("code", "")).rstrip("\n").endswith("\\"):
                content = {"status": "incomplete", "indent": ""}
            else:
                content = {"status": "complete"}
        elif msg_type == "complete_request":
            cursor = int(request.get("cursor_pos") or 0)
            content.update(matches=[], cursor_start=cursor, cursor_end=cursor, metadata={})
        elif msg_type == "inspect_request":
            content.update(found=False, data={}, metadata={})
        elif msg_type == "history_request":
            content.update(history=[])
        elif msg_type == "comm_info_request":
            content.update(comms={})
        self._reply(sock, idents, msg, content)
        return True


def main(connection_file: str, restore: bytes | None = None) -> int:
    kernel = BashKernel(Connection.load(connection_file), restore)
    try:
        kernel.start()
        kernel.serve()
    finally:
        kernel.close()
    return 0


def resume(argv: list[str]) -> None:
    """A continuation of a kept bash kernel (`kernels.snapshot`): a new kernel whose bash
    starts in the kept shell's state; it serves until it ends, then freezes if kept."""
    snapshot.listen(resume)  # in its own socket folder, before the gateway takes it
    main(argv[argv.index("-f") + 1], _kept_state)
    if snapshot.kept():
        snapshot.freeze()
