"""Patches to ipykernel's `OutStream` (stdout and stderr): the order the program wrote the
two streams in is kept across them, and buffers, queues and messages stay bounded.

ipykernel buffers each stream on its own and sends what a buffer holds 0.2 s after its first
write, so `print('o'); print('e', file=sys.stderr); print('o')` arrives as `o o`, then `e`.
Here all stream text leaves through one queue, in write order:

- a write to one stream first moves ("takes") what the stream written last still buffers
  into the queue, then writes into its own buffer, so consecutive writes to one stream still
  share a buffer: one message per change of stream, never one per write;
- every flush (ipykernel's periodic one, `flush()`, the end of a cell) takes its own stream's
  buffer into the queue, then sends the whole queue, oldest first, from the iopub thread;
- taking and queueing happen under one lock, never held while waiting; a write to the stream
  written last, with nothing queued, takes no lock at all (a print loop costs what it did).

Why the order holds for one writing thread: text t1 written to stream A before t2 is written
to stream B means a switch away from A happened in between, and that switch took A (with t1,
unless a flush took it earlier) into the queue before t2 existed. The queue is sent in order,
and the iopub thread sends both streams' messages and every other message through one event
queue. ipykernel flushes both streams before it publishes a display, a result, an error or
the end of a cell, so those keep their place too.

Where it is best-effort: several threads writing at once (a switch and its write are not one
step); output that child processes write to the file descriptors (`os.system`), which
ipykernel's watcher threads read from pipes of their own; an iopub thread stalled longer than
ipykernel's flush timeout (10 s), after which a writer goes on without waiting.

Backpressure: a writer waits for the iopub thread (`flush()`) once its stream buffered
FLUSH_AT characters or the queue holds MAX_QUEUED messages or FLUSH_AT characters; messages
carry at most STREAM_CHUNK characters. The iopub socket is told never to drop a message
(`keep_every_message`), so a slow reader slows the writer down instead of losing output.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from types import ModuleType
from typing import Any

STREAM_CHUNK = 64 * 1024
FLUSH_AT = 1024 * 1024
MAX_QUEUED = 256


class _Queue:
    """Stream text taken out of the buffers, in write order, not yet sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: collections.deque[tuple[Any, dict[str, Any], str]] = collections.deque()
        self.chars = 0
        self.last: Any = None  # the stream written last
        self.send_scheduled = False

    def take(self, stream: Any) -> None:
        """Move what `stream` buffers to the end of the queue (the caller holds the lock)."""
        for parent, data in stream._flush_buffers():
            if data:
                self.items.append((stream, parent, data))
                self.chars += len(data)

    def pop_all(self) -> list[tuple[Any, dict[str, Any], str]]:
        with self.lock:
            items = list(self.items)
            self.items.clear()
            self.chars = 0
            self.send_scheduled = False
        return items

    def full(self) -> bool:
        return len(self.items) >= MAX_QUEUED or self.chars >= FLUSH_AT

    def after_fork(self) -> None:
        """In a forked child: the parent's queue is the parent's to send; the lock may have
        been held by another thread at the fork."""
        self.lock = threading.Lock()
        self.items = collections.deque()
        self.chars = 0
        self.last = None
        self.send_scheduled = False


_QUEUE = _Queue()
os.register_at_fork(after_in_child=_QUEUE.after_fork)


def patch_out_stream(module: ModuleType) -> None:
    """Patch `module.OutStream` (the class of `ipykernel.iostream`) once."""
    out_stream = module.OutStream
    if hasattr(out_stream.write, "__wrapped__"):
        return
    _chunk_messages(out_stream)
    _order_streams(out_stream)


def _chunk_messages(out_stream: Any) -> None:
    """A buffer is taken in pieces of at most STREAM_CHUNK characters (one message each)."""
    flush_buffers = out_stream._flush_buffers

    def chunked_flush_buffers(self: Any) -> Any:
        for parent, data in flush_buffers(self):
            for start in range(0, len(data), STREAM_CHUNK):
                yield parent, data[start : start + STREAM_CHUNK]

    chunked_flush_buffers.__wrapped__ = flush_buffers  # type: ignore[attr-defined]
    out_stream._flush_buffers = chunked_flush_buffers


class _Frames:
    """Stands in for a socket in `Session.send`: keeps the serialized frames to send later."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[Any], dict[str, Any]]] = []

    def send_multipart(self, frames: list[Any], **kwargs: Any) -> None:
        self.messages.append((frames, kwargs))


def _send_queued() -> None:
    """Send the queue, oldest first.

    Runs in the iopub thread (or in the writer's once no iopub thread runs: a forked child).
    The messages are handed to the iopub thread as one event: one event per message would
    also mean one wake-up message per message on the thread's own event pipe, which blocks
    for good once a few thousand are waiting.
    """
    batches: dict[Any, _Frames] = {}
    for stream, parent, data in _QUEUE.pop_all():
        pub_thread = stream.pub_thread
        if pub_thread is None:
            continue
        # as ipykernel's `_flush` does for each message
        stream.session.pid = os.getpid()
        msg = stream.session.msg("stream", {"name": stream.name, "text": data}, parent=parent)
        for hook in stream._hooks:
            msg = hook(msg)
            if msg is None:
                break
        if msg is not None:
            frames = batches.setdefault(pub_thread, _Frames())
            stream.session.send(frames, msg, ident=stream.topic)
    for pub_thread, frames in batches.items():
        pub_thread.schedule(_sender(pub_thread, frames.messages))


def _sender(pub_thread: Any, messages: list[tuple[list[Any], dict[str, Any]]]) -> Any:
    def send() -> None:
        for frames, kwargs in messages:
            pub_thread._really_send(frames, **kwargs)

    return send


def _order_streams(out_stream: Any) -> None:
    """Replace `_flush` and `write` (see the module docstring); `write` also keeps each
    stream's buffer small (the writer waits for a flush after every FLUSH_AT characters:
    ipykernel would send whatever accumulated in 0.2 s as one message, so a print loop grew one
    buffer, and one message, without bound)."""
    write = out_stream.write

    def ordered_flush(self: Any) -> None:
        """Take this stream's buffer, then send the queue."""
        self._flush_pending = False
        self._subprocess_flush_pending = False
        if self.echo is not None:
            try:
                self.echo.flush()
            except OSError as exc:
                if self.echo is not sys.__stderr__:
                    print(f"Flush failed: {exc}", file=sys.__stderr__)
        with _QUEUE.lock:
            _QUEUE.take(self)
        _send_queued()

    def ordered_write(self: Any, string: str) -> Any:
        if string and self.pub_thread is not None:
            if _QUEUE.last is not self:
                _switch(self)
            elif _QUEUE.items and _QUEUE.full():  # lock-free: the common case
                self.flush()
        written = write(self, string)
        pending = self.__dict__.get("_gateway_pending", 0) + len(string)
        if pending >= FLUSH_AT:
            pending = 0
            self.flush()
        self.__dict__["_gateway_pending"] = pending
        return written

    ordered_flush.__wrapped__ = out_stream._flush  # type: ignore[attr-defined]
    ordered_write.__wrapped__ = write  # type: ignore[attr-defined]
    out_stream._flush = ordered_flush
    out_stream.write = ordered_write


def _switch(stream: Any) -> None:
    """`stream` is about to be written and another was written last: queue what that one
    holds, have the queue sent, and wait for the iopub thread if the queue is full."""
    with _QUEUE.lock:
        last, _QUEUE.last = _QUEUE.last, stream
        if last is not None and last is not stream:
            _QUEUE.take(last)
        schedule = bool(_QUEUE.items) and not _QUEUE.send_scheduled
        _QUEUE.send_scheduled = _QUEUE.send_scheduled or schedule
        full = _QUEUE.full()
    if schedule:
        stream.pub_thread.schedule(_send_queued)
    if full:
        stream.flush()  # waits until the iopub thread has sent the queue


def keep_every_message(iopub_thread: Any) -> None:
    """Make the iopub socket wait for a slow reader instead of dropping messages.

    An XPUB socket silently drops messages once a subscriber's queue holds its high-water mark
    (1000 messages): ordered output sends a message per change of stream, so a flood of
    alternating writes would lose some. With XPUB_NODROP the iopub thread waits until the
    gateway reads, and the writer waits for the iopub thread (see the module docstring).
    """
    import zmq

    socket = iopub_thread.socket
    if hasattr(socket, "setsockopt"):
        iopub_thread.schedule(lambda: socket.setsockopt(zmq.XPUB_NODROP, 1))
