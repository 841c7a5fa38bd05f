"""bash's stdout and stderr: two pipes, read back in the order their writes happened.

Reading two pipes in one loop is not enough: bash writes ``echo o; echo e >&2`` microseconds
apart, faster than any reader wakes, and then both pipes hold data whose order is lost. Here
the kernel itself records the order, with three Linux features:

- each pipe is a packet pipe (``O_DIRECT``: a read returns one write, at most a page of it) of
  one page (``F_SETPIPE_SZ``), so it holds one unread packet at most;
- both read ends raise the same real-time signal on every write (``O_ASYNC`` + ``F_SETSIG``,
  aimed at the kernel's main thread), which carries the pipe's fd. Queued real-time signals
  are never merged and leave their queue in the order they were raised, so the queue, read
  through a ``signalfd``, is one log of the writes to both pipes;
- right before each read of a pipe, the kernel queues the same signal to itself with the
  stream in its value (a "marker"), so the log also records when the kernel read.

The kernel raises the write signal after a write has put its packet in (and, for a write of
several pages, after each page: the one-page pipe is then full and the writer waits). It also
raises one for a write that finds the pipe full and has to wait before putting anything in.
One rule tells them apart: after the marker of the last read of a stream, the first write
signal of that stream is where that stream's next packet goes; later signals of that stream
before the next marker are writers waiting on the full pipe (their packets get their own
signals once the kernel has read). If that first signal came from a writer that was waiting
(it got there just before the read), its packet is put where the signal is: that writer did
nothing else in between, so the order is the same. If the packet is not in the pipe yet
(that writer has not had the CPU since), reading waits for it, at most STALL_LIMIT.

A stream that delivered BULK_AFTER packets in a row while the other stayed quiet goes bulk,
so that a flood runs at the speed of plain pipes: the kernel puts a packet of its own (the
"gate") into the other, empty, pipe, so that a write there must wait before putting anything
in, and raises its signal; the bulk stream's pipe is made large, packet mode is switched off
for bash's writes to it (small writes share pages again), and it is read in large reads. The
first signal of a writer at the gate ends bulk: that writer waits, so everything in the bulk
pipe came before its write. The kernel reads it all, switches packet mode back on, makes the
pipe one page again, and takes the gate out; the writer goes on. To switch packet mode, the
kernel keeps its own handle on bash's write ends (the same open files) until bash is gone.

So for one writing process (bash and the commands it runs one after another) the order is
exact: alternating echos, several lines then a warning, pages of a big write around a line
on the other stream, a flood on one stream then a line on the other. What is best-effort:

- several processes writing at once (``cmd1 & cmd2``): each write is placed where its signal
  was raised, a few microseconds after its data went in; a second writer on the bulk stream
  is not held by the gate;
- writes through a new open file of the same pipe (``echo x >/dev/stderr`` reopens fd 2): such
  a file is not in packet mode, so a later write (through any file) can join its data while
  the kernel has not read it yet, and come out in its place;
- a writer that finds the pipe full and then never writes (a non-blocking writer giving up on
  EAGAIN, a write cut short by a signal): reading waits STALL_LIMIT for it, then goes on;
- when the real-time signal queue overflows (RLIMIT_SIGPENDING, counted per user) the kernel
  gets SIGIO instead and falls back, for the rest of the shell's life, to arrival order: it
  reads whatever either pipe holds (the pipes are made large again). The same fallback is
  used from the start where any of the above is unavailable.

What programs can notice: stdout and stderr are pipes of one page while both are in use, so a
write of several pages waits for the kernel between pages, and a non-blocking writer gets
EAGAIN sooner (and while the other stream is bulk). Output that alternates between the streams
is paced by the kernel's reading, about a context switch per write.
"""

from __future__ import annotations

import array
import collections
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import select
import signal
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kernels.bash")

STREAMS = ("stdout", "stderr")
PAGE = 4096
READ_SIZE = 64 * 1024  # more than a packet (a packet read with less loses its rest)
ARRIVAL_PIPE_SIZE = 1024 * 1024  # pipes in arrival order: as large as allowed, up to this
STALL_LIMIT = 0.25  # seconds to wait for the packet of a writer that found the pipe full
ORDER_SIGNAL = signal.SIGRTMIN + 1
BULK_AFTER = 32  # consecutive packets of one stream that make it bulk
BULK_PIPE_SIZE = 256 * 1024  # a bulk stream's pipe
BULK_READS = 64  # packets read from a bulk stream per call
GATE = b"\0"
_SIGNALFD_INFO = 128  # sizeof(struct signalfd_siginfo)
_INFO = struct.Struct("<IiiIIiIIIIii")  # signo, errno, code, pid, uid, fd, ..., status, int
_SI_QUEUE = -1
_F_SETOWN_EX = 15
_F_OWNER_TID = 0

Chunk = tuple[str, bytes]


class _Sigval(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]


class _Libc:
    """The three libc calls Python does not offer."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.signalfd: Callable[..., int] = libc.signalfd
        self.signalfd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self.pthread_self: Callable[[], int] = libc.pthread_self
        self.pthread_self.restype = ctypes.c_ulong
        self.pthread_sigqueue: Callable[..., int] = libc.pthread_sigqueue
        self.pthread_sigqueue.argtypes = [ctypes.c_ulong, ctypes.c_int, _Sigval]


def _sigset(*signums: int) -> ctypes.Array[ctypes.c_ubyte]:
    mask = (ctypes.c_ubyte * 128)()  # glibc's sigset_t
    for signum in signums:
        mask[(signum - 1) // 8] |= 1 << ((signum - 1) % 8)
    return mask


def _other(name: str) -> str:
    return STREAMS[1 - STREAMS.index(name)]


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]


def _hung_up(fd: int) -> bool:
    """No writer is left and nothing is waiting."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    events = dict(poller.poll(0)).get(fd, 0)
    return bool(events & select.POLLHUP) and not events & select.POLLIN


def _set_pipe_size(fd: int, size: int) -> None:
    with contextlib.suppress(OSError):  # over the per-user quota: keep what we have
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)


class OrderedPipes:
    """The two pipes; `read()` returns what can be passed on, in write order.

    Called by one thread only (the kernel's main thread), which must also create it: the
    write signals are aimed at that thread, which blocks them. Who calls what: the shell
    gives `child_ends` to bash as its stdout and stderr and calls `release_writers` once bash
    is gone (until then the kernel keeps them, to switch packet mode); the kernel's event
    loop polls `poll_fds`, calls `read` when one is ready or at `deadline`, `drain` after
    bash was killed, and `close` at the end.
    """

    def __init__(self) -> None:
        self._read_fds: dict[str, int | None] = {}
        self.child_ends: dict[str, int] = {}
        for name in STREAMS:
            read_fd, write_fd = os.pipe2(os.O_DIRECT | os.O_CLOEXEC)
            self._read_fds[name], self.child_ends[name] = read_fd, write_fd
        self._names = {fd: name for name, fd in self._read_fds.items() if fd is not None}
        self._signalfd: int | None = None
        self._libc: _Libc | None = None
        self._thread = 0
        self._log: collections.deque[tuple[bool, str]] = collections.deque()
        # the log: (is our marker, stream), oldest first
        self._slot_open = dict.fromkeys(STREAMS, True)
        self._stalled_since: float | None = None
        self._run_stream, self._run_length = "", 0
        self._bulk: str | None = None  # the stream read in bulk, if any
        self._gate_fd: int | None = None  # our write end into the other stream's pipe
        self._gate_seen = False  # the gate's own signal was seen in the log
        self.ordered = False
        try:
            self._start_ordered()
        except (OSError, AttributeError) as exc:
            log.warning("stdout/stderr in arrival order only: %s", exc)
            self._to_arrival_order()

    # -- setup ---------------------------------------------------------------------------------

    def _start_ordered(self) -> None:
        libc = _Libc()
        signal.pthread_sigmask(signal.SIG_BLOCK, {ORDER_SIGNAL, signal.SIGIO})
        mask = _sigset(ORDER_SIGNAL, signal.SIGIO)
        signal_fd = libc.signalfd(-1, ctypes.byref(mask), os.O_NONBLOCK | os.O_CLOEXEC)
        if signal_fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"signalfd: {os.strerror(code)}")
        self._signalfd, self._libc, self._thread = signal_fd, libc, libc.pthread_self()
        owner = struct.pack("ii", _F_OWNER_TID, threading.get_native_id())
        for fd in self._names:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PAGE)
            if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) != PAGE:
                raise OSError(errno.EINVAL, "cannot make a one-page pipe")
            fcntl.fcntl(fd, _F_SETOWN_EX, owner)
            fcntl.fcntl(fd, fcntl.F_SETSIG, ORDER_SIGNAL)
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_ASYNC | os.O_NONBLOCK)
        self.ordered = True

    def _to_arrival_order(self) -> None:
        """Stop recording the order: plain non-blocking reads of large pipes."""
        self.ordered = False
        self._log.clear()
        self._stalled_since = None
        self._lift_gate()
        for fd in self._names:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, (flags & ~os.O_ASYNC) | os.O_NONBLOCK)
            _set_pipe_size(fd, ARRIVAL_PIPE_SIZE)
        for name in STREAMS:
            self._set_packets(name, False)  # one read takes many small writes again
        self._close_signalfd()

    def _close_signalfd(self) -> None:
        """Discard the signals still queued (a later shell's fds may reuse the numbers), then
        close the signalfd. Called once no pipe raises signals any more."""
        if self._signalfd is None:
            return
        with contextlib.suppress(OSError):
            while os.read(self._signalfd, _SIGNALFD_INFO * 256):
                pass
        os.close(self._signalfd)
        self._signalfd = None

    def _lift_gate(self) -> None:
        """Take our packet out of the gated pipe (a writer waiting there goes on) and close
        our write end into it."""
        if self._bulk is not None:
            other_fd = self._read_fds[_other(self._bulk)]
            if other_fd is not None:
                with contextlib.suppress(OSError):
                    os.read(other_fd, READ_SIZE)  # the oldest packet there: the gate
        if self._gate_fd is not None:
            os.close(self._gate_fd)
        self._bulk, self._gate_fd = None, None

    def release_writers(self) -> None:
        """Close our handles on bash's write ends (after bash is gone): the pipes can then
        reach EOF once every process that still has them open is gone too."""
        for name in list(self.child_ends):
            os.close(self.child_ends.pop(name))

    def _set_packets(self, name: str, on: bool) -> None:
        """Packet mode on or off for bash's writes to `name` (its open file, shared with us)."""
        fd = self.child_ends.get(name)
        if fd is not None:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            flags = flags | os.O_DIRECT if on else flags & ~os.O_DIRECT
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)

    def close(self) -> None:
        self.release_writers()
        if self._gate_fd is not None:
            os.close(self._gate_fd)
            self._gate_fd = None
        for name, fd in self._read_fds.items():
            if fd is not None:
                os.close(fd)
                self._read_fds[name] = None
        self._close_signalfd()
        self._names.clear()

    # -- state for the event loop ----------------------------------------------------------------

    def poll_fds(self) -> list[int]:
        """The fds to wait on. Not a gated pipe: the gate keeps it readable, and a writer
        there shows up as a signal."""
        gated = None if self._bulk is None else _other(self._bulk)
        fds = [fd for name, fd in self._read_fds.items() if fd is not None and name != gated]
        if self._signalfd is not None:
            fds.append(self._signalfd)
        return fds

    def is_open(self, name: str) -> bool:
        """False once the stream's pipe is at EOF (every writer closed it)."""
        return self._read_fds[name] is not None

    def deadline(self) -> float | None:
        """When `read` must run again though no fd is ready: while waiting for a packet."""
        if self._stalled_since is None:
            return None
        return self._stalled_since + STALL_LIMIT

    # -- reading -------------------------------------------------------------------------------

    def read(self) -> list[Chunk]:
        """What can be passed on now, oldest first; marks streams at EOF."""
        if not self.ordered:
            return self._read_arrival()
        try:
            return self._read_ordered()
        except _Overflow as exc:
            log.warning("stdout/stderr order is lost from here on: %s", exc)
            chunks = exc.chunks
            self._to_arrival_order()
            return chunks + self._read_arrival()

    def drain(self) -> list[Chunk]:
        """Whatever the pipes hold now, without waiting for anyone (the shell is gone)."""
        chunks = self.read()
        self._lift_gate()
        return chunks + self._read_packets(64)

    def _read_arrival(self) -> list[Chunk]:
        return self._read_packets(16)  # one call must not starve the event loop

    def _read_packets(self, per_stream: int) -> list[Chunk]:
        """Up to `per_stream` packets of each open stream, in stream order."""
        chunks: list[Chunk] = []
        for name in self._read_fds:
            self._read_stream(name, per_stream, chunks)
        return chunks

    def _read_stream(self, name: str, most: int, chunks: list[Chunk]) -> None:
        """Up to `most` packets of one stream onto `chunks`: until it is empty or closed."""
        fd = self._read_fds[name]
        for _ in range(most):
            if fd is None or not self.is_open(name):
                return
            data = self._read_packet(name, fd)
            if not data:
                return
            chunks.append((name, data))

    def _read_packet(self, name: str, fd: int) -> bytes:
        """One packet (b"" if none is waiting); at EOF, closes the stream."""
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return b""
        if not data:
            self._close_stream(name)
        return data

    def _close_stream(self, name: str) -> None:
        fd = self._read_fds[name]
        if fd is not None:
            os.close(fd)
            self._read_fds[name] = None
            self._names.pop(fd, None)

    def _read_ordered(self) -> list[Chunk]:
        chunks: list[Chunk] = []
        self._log.extend(self._signals(chunks))
        if self._bulk is not None:
            self._read_bulk(chunks)
        while self._log:
            is_marker, name = self._log[0]
            if is_marker:
                self._slot_open[name] = True
            elif self._bulk is not None and name == self._bulk:
                pass  # signals raised before the stream went bulk
            elif self._bulk is not None and name != self._bulk and self._gate_at(name, chunks):
                pass
            elif self._slot_open[name] and self.is_open(name):
                fd = self._read_fds[name]
                assert fd is not None
                if not _unread(fd):
                    if _hung_up(fd):
                        self._close_stream(name)
                    elif self._wait_for_packet():
                        break  # the rest of the log waits for this packet
                else:
                    self._mark(name, chunks)
                    data = self._read_packet(name, fd)
                    self._slot_open[name] = False
                    if data:
                        chunks.append((name, data))
                        self._count_run(name, chunks)
            self._stalled_since = None  # whatever happened, the entry no longer waits
            self._log.popleft()
        if not self._log:
            for name, fd in list(self._read_fds.items()):
                # EOF raises no signal once the last write's slot was used
                if fd is not None and self._slot_open[name] and _hung_up(fd):
                    self._close_stream(name)
        return chunks

    # -- bulk: one stream alone, read in large batches while the other is gated ----------------

    def _count_run(self, name: str, chunks: list[Chunk]) -> None:
        """Count consecutive packets of one stream; a long run makes that stream bulk."""
        if name != self._run_stream:
            self._run_stream, self._run_length = name, 0
        self._run_length += 1
        if self._run_length >= BULK_AFTER:
            self._run_length = 0
            self._start_bulk(name)

    def _start_bulk(self, name: str) -> None:
        other = _other(name)
        other_fd, fd = self._read_fds[other], self._read_fds[name]
        if other_fd is None or fd is None:
            return
        try:
            gate = os.open(f"/proc/self/fd/{other_fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            flags = fcntl.fcntl(gate, fcntl.F_GETFL)
            fcntl.fcntl(gate, fcntl.F_SETFL, flags | os.O_DIRECT)  # a packet: nothing joins it
            os.write(gate, GATE)
        except OSError:  # EAGAIN: the other stream has just written
            os.close(gate)
            return
        self._gate_fd, self._gate_seen, self._bulk = gate, False, name
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_ASYNC)
        _set_pipe_size(fd, BULK_PIPE_SIZE)
        self._set_packets(name, False)  # small writes now share pages: far fewer reads

    def _read_bulk(self, chunks: list[Chunk]) -> None:
        name = self._bulk
        assert name is not None
        self._read_stream(name, BULK_READS, chunks)
        if not self.is_open(name):
            self._stop_bulk(chunks)  # bash is gone: nobody will write to the gated stream

    def _gate_at(self, name: str, chunks: list[Chunk]) -> bool:
        """A signal of the gated stream: the gate's own, or a writer stuck at the gate.

        The gate went in when the other pipe was empty, so the slot rule places its signal: the
        first one with the slot open; signals before it are old ones, ignored as usual. A writer
        after it waits for the gate to go and did nothing since its last write: the bulk
        stream's data so far all comes before it. Returns True: the signal is used up."""
        if not self._gate_seen:
            if self._slot_open[name]:
                self._gate_seen = True
                self._slot_open[name] = False
            return True
        self._stop_bulk(chunks)
        return True

    def _stop_bulk(self, chunks: list[Chunk]) -> None:
        """Back to one page and a signal per write for the bulk stream; lift the gate."""
        name, gate = self._bulk, self._gate_fd
        assert name is not None and gate is not None
        fd = self._read_fds[name]
        if fd is not None:
            for _ in range(64):
                while self.is_open(name) and (data := self._read_packet(name, fd)):
                    chunks.append((name, data))
                if not self.is_open(name):
                    break
                self._set_packets(name, True)
                try:
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PAGE)  # EBUSY while more than a page waits
                except OSError:
                    continue
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_ASYNC)
                break
            else:
                raise _Overflow("the bulk stream does not stop", chunks)
        self._slot_open[name] = True
        self._run_length = 0
        other_fd = self._read_fds[_other(name)]
        if other_fd is not None:
            self._mark(_other(name), chunks)
            self._slot_open[_other(name)] = False
        self._lift_gate()

    def _wait_for_packet(self) -> bool:
        """True to keep waiting for the packet of the current signal, False to skip it."""
        now = time.monotonic()
        if self._stalled_since is None:
            self._stalled_since = now
        if now - self._stalled_since < STALL_LIMIT:
            return True
        self._stalled_since = None
        return False

    def _mark(self, name: str, chunks: list[Chunk]) -> None:
        """Queue our marker for `name` (right before reading it)."""
        assert self._libc is not None
        value = _Sigval(STREAMS.index(name))
        if self._libc.pthread_sigqueue(self._thread, ORDER_SIGNAL, value) != 0:
            raise _Overflow(f"cannot queue a signal: {os.strerror(ctypes.get_errno())}", chunks)

    def _signals(self, chunks: list[Chunk]) -> list[tuple[bool, str]]:
        assert self._signalfd is not None
        entries: list[tuple[bool, str]] = []
        while True:
            try:
                data = os.read(self._signalfd, _SIGNALFD_INFO * 256)
            except BlockingIOError:
                return entries
            for offset in range(0, len(data), _SIGNALFD_INFO):
                info: tuple[Any, ...] = _INFO.unpack_from(data, offset)
                signo, code, fd, value = info[0], info[2], info[5], info[11]
                if signo != ORDER_SIGNAL:
                    raise _Overflow("the real-time signal queue is full", chunks)
                if code == _SI_QUEUE:
                    if 0 <= value < len(STREAMS):
                        entries.append((True, STREAMS[value]))
                elif fd in self._names:
                    entries.append((False, self._names[fd]))


class _Overflow(Exception):
    """The log of writes is incomplete; `chunks` were read before that was noticed."""

    def __init__(self, message: str, chunks: list[Chunk]) -> None:
        super().__init__(message)
        self.chunks = chunks
