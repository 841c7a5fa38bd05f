"""The bash process behind the kernel: one persistent, non-interactive bash that runs cells.

bash's stdin is /dev/null; it talks to the kernel over pipes:

- fd 60 (kernel -> bash): one line per cell, the cell's marker token; the cell itself is in a
  file that bash `source`s, so variables, functions, `cd` and exports persist between cells;
- fd 61 (bash -> kernel): status lines, ``ready VERSION``, ``start`` and ``done STATUS FLAGS``;
- stdout and stderr: two pipes that the kernel reads back in write order
  (`kernels.bash.pipes`). After each cell the command loop writes ``\\x1e TOKEN \\x1e`` to
  both (through fds 62/63, copies of the original pipes, so a cell's ``exec >file`` cannot hide
  it); the kernel cuts each stream at its marker with `MarkerCutter`.

SIGINT makes the running cell return 130: the INT trap sets a DEBUG trap (inherited by functions
through ``set -T``) that returns from every function and from the sourced cell, after which the
loop removes it again. bash runs in its own session, so the kernel can signal or kill the whole
process group; if the kernel dies, bash sees EOF on fd 60 and kills its session. bash starts
with an empty signal mask and SIGPIPE at its default, whatever the kernel blocks or ignores.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shlex
import shutil
import signal
import time
from pathlib import Path

from kernels.bash.pipes import Chunk, OrderedPipes

CELL_FILE = "cell.sh"

_BOOTSTRAP = r"""
exec 60<&{cmd} 61>&{status} 62>&1 63>&2 {cmd}<&- {status}>&-
PS1= PS2=
set +m
__gw_cell={cell}
__gw_abort=
__gw_dbg='[[ -z $__gw_abort ]] || builtin return 130 2>/dev/null ||
  {{ __gw_abort=; builtin trap - DEBUG; builtin set +T; }}'
trap '__gw_abort=1; builtin set -T; builtin trap "$__gw_dbg" DEBUG' INT
{init}builtin printf 'ready %s\n' "$BASH_VERSION" >&61
while :; do
  IFS= builtin read -r -u 60 __gw_marker || {{
    (( $? > 128 )) && continue
    command rm -rf -- "${{__gw_cell%/*}}"
    builtin kill -KILL 0
  }}
  builtin printf 'start\n' >&61
  builtin source "$__gw_cell" 60<&- 61>&- 62>&- 63>&-
  {{ __gw_status=$? __gw_flags=$-; builtin set +x; }} 2>/dev/null
  builtin printf '\036%s\036' "$__gw_marker" >&62
  builtin printf '\036%s\036' "$__gw_marker" >&63
  builtin printf 'done %d %s\n' "$__gw_status" "$__gw_flags" >&61
done
"""


class ShellError(RuntimeError):
    """bash could not be started."""


def marker_bytes(token: str) -> bytes:
    """The bytes the command loop writes to stdout and stderr after the cell `token`."""
    return b"\x1e" + token.encode("ascii") + b"\x1e"


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128 + signal for a process killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


def _high_fd(fd: int) -> int:
    """Move `fd` to a number >= 64, clear of the fixed numbers 60-63 the bootstrap uses."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)
    os.close(fd)
    return new


def _kill_session(sid: int) -> None:
    """SIGKILL every process in the session (process group) led by `sid`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    # Processes that moved to another process group (e.g. after `set -m`) stay in the session.
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_bytes()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == sid:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


class _Child:
    """A process started with posix_spawn: subprocess cannot give the child a signal mask of
    its own, and the kernel blocks the signals that record the output's order."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def spawn(
        cls, argv: list[str], stdout: int, stderr: int, keep: tuple[int, ...], env: dict[str, str]
    ) -> _Child:
        """Run argv in a new session: stdin /dev/null, the given stdout and stderr, the fds in
        `keep` under their own numbers, no other fd of ours, default signal mask and SIGPIPE."""
        program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if program is None:
            raise FileNotFoundError(errno.ENOENT, "not found on PATH", argv[0])
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        actions: list[tuple[int, ...]] = [
            (os.POSIX_SPAWN_DUP2, devnull, 0),
            (os.POSIX_SPAWN_DUP2, stdout, 1),
            (os.POSIX_SPAWN_DUP2, stderr, 2),
        ]
        try:
            for fd in _inheritable_fds():  # what subprocess's close_fds would close
                if fd > 2 and fd not in keep:
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            for fd in keep:
                os.set_inheritable(fd, True)
            pid = os.posix_spawn(
                program,
                argv,
                env,
                file_actions=actions,
                setsid=True,
                setsigmask=(),
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        finally:
            os.close(devnull)
            for fd in keep:
                with contextlib.suppress(OSError):
                    os.set_inheritable(fd, False)
        return cls(pid)

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL  # reaped elsewhere: report it as killed
            else:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _inheritable_fds() -> list[int]:
    try:
        fds = [int(entry) for entry in os.listdir("/proc/self/fd")]
    except OSError:
        return []
    inheritable = []
    for fd in fds:
        with contextlib.suppress(OSError):  # the listing's own fd is gone by now
            if os.get_inheritable(fd):
                inheritable.append(fd)
    return inheritable


class BashShell:
    """One bash process; the kernel owns the event loop and reads the fds this exposes."""

    def __init__(self, workdir: Path, env: dict[str, str], init: Path | None = None) -> None:
        """A bash that sources `init` (a kept shell's state: `kernels.bash.kernel`) before
        it says it is ready, its output and errors discarded."""
        self.cell_path = workdir / CELL_FILE
        self.version = ""
        self.xtrace = False
        self.status_eof = False
        self.status_eof_at = 0.0  # time.monotonic() when the status pipe reached EOF
        self.killed = False
        cmd_r, cmd_w = os.pipe()
        status_r, status_w = os.pipe()
        cmd_r, status_w = _high_fd(cmd_r), _high_fd(status_w)
        sourced = (
            "" if init is None else f"builtin source {shlex.quote(str(init))} >/dev/null 2>&1\n"
        )
        boot = _BOOTSTRAP.format(
            cmd=cmd_r, status=status_w, cell=shlex.quote(str(self.cell_path)), init=sourced
        )
        try:
            self.output = OrderedPipes()
        except OSError as exc:
            for fd in (cmd_r, cmd_w, status_r, status_w):
                os.close(fd)
            raise ShellError(f"cannot make the output pipes: {exc}") from exc
        try:
            self.proc = _Child.spawn(
                ["bash", "--noprofile", "--norc", "-c", boot, "bash"],
                self.output.child_ends["stdout"],
                self.output.child_ends["stderr"],
                (cmd_r, status_w),
                env,
            )
        except OSError as exc:
            for fd in (cmd_r, cmd_w, status_r, status_w):
                os.close(fd)
            self.output.close()
            raise ShellError(f"cannot start bash: {exc}") from exc
        for fd in (cmd_r, status_w):
            os.close(fd)
        self._cmd_fd = cmd_w
        self.status_fd = status_r
        os.set_blocking(status_r, False)
        self._status_buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until bash reports `ready` (a few ms); raise ShellError if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.read_status()
            for line in lines or []:
                if line.startswith("ready "):
                    self.version = line.removeprefix("ready ")
                    return
            remaining = deadline - time.monotonic()
            if lines is None or remaining <= 0:
                self.kill()
                raise ShellError("bash did not start")
            select.select([self.status_fd], [], [], remaining)

    def run(self, code: str, token: str) -> None:
        """Start a cell: write it to the cell file and tell the command loop to source it."""
        if self.xtrace:  # restore `set -x` without tracing the command loop (same line 1)
            code = "builtin set -x; " + code
        fd = os.open(self.cell_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(code)
        os.write(self._cmd_fd, token.encode("ascii") + b"\n")

    def read_status(self) -> list[str] | None:
        """Complete status lines available now; None once the status pipe is at EOF."""
        if self.status_eof:
            return None
        try:
            data = os.read(self.status_fd, 4096)
        except BlockingIOError:
            return []
        if not data:
            self.status_eof = True
            self.status_eof_at = time.monotonic()
            return None
        self._status_buf += data
        *lines, self._status_buf = self._status_buf.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def read_output(self) -> list[Chunk]:
        """stdout/stderr chunks that can be passed on now, in the order bash wrote them."""
        return self.output.read()

    def drain_output(self) -> list[Chunk]:
        """What the pipes still hold, without waiting for writers (bash is gone)."""
        return self.output.drain()

    def output_open(self) -> bool:
        """Whether stdout or stderr can still deliver output (a pipe not yet at EOF)."""
        return any(self.output.is_open(name) for name in ("stdout", "stderr"))

    def poll(self) -> int | None:
        """bash's exit status (128 + signal if killed by one), or None while it runs."""
        rc = self.proc.poll()
        return None if rc is None else exit_status(rc)

    def interrupt(self) -> None:
        """SIGINT to bash's process group: the running cell returns 130."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGINT)

    def kill(self) -> int:
        """SIGKILL bash's whole session (background jobs too) and reap bash; its exit status."""
        if not self.killed:
            self.killed = True
            _kill_session(self.proc.pid)
            with contextlib.suppress(OSError):
                os.close(self._cmd_fd)
            self.output.release_writers()
        return exit_status(self.proc.wait())

    def close(self) -> None:
        """Kill bash if needed and close every fd; output still in the pipes is dropped."""
        self.kill()
        if not self.status_eof:
            self.status_eof = True
            os.close(self.status_fd)
        self.output.close()


class MarkerCutter:
    """Removes one expected marker from a byte stream and reports when it has passed.

    While armed, a tail that could be the start of the marker is held back until the next
    chunk shows whether it is.
    """

    def __init__(self) -> None:
        self._marker = b""
        self._held = b""

    def arm(self, marker: bytes) -> None:
        self._marker = marker

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """The bytes to show (marker cut out) and whether the marker was in this chunk."""
        marker = self._marker
        if not marker:
            return data, False
        buf = self._held + data
        index = buf.find(marker)
        if index >= 0:
            self._marker = self._held = b""
            return buf[:index] + buf[index + len(marker) :], True
        keep = 0
        for k in range(min(len(marker) - 1, len(buf)), 0, -1):
            if buf.endswith(marker[:k]):
                keep = k
                break
        self._held = buf[len(buf) - keep :] if keep else b""
        return buf[: len(buf) - keep], False

    def disarm(self) -> bytes:
        """Stop expecting the marker; return whatever was held back."""
        held, self._held, self._marker = self._held, b"", b""
        return held
