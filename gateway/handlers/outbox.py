"""`Outbox`: one WebSocket connection's bounded send queue, drained by a single writer.

The writer awaits each `write_message` future before sending the next message, so a client
that reads slowly (or not at all) holds back the gateway instead of making it buffer:
what waits is in this queue, and the queue is bounded.

- `offer(...)` is for droppable messages (live `output` events): it refuses them once
  `drop_bytes` or `drop_messages` is reached, and the caller counts what was dropped.
- `put(...)` is for messages that must arrive (`accepted`, `done`, `error`, notices); they
  are always queued. What bounds them is that they wait for room before they are made:
  `wait_for_room()` holds back the next incoming message (and with it its answers) and
  each `done` event (`StreamHandler._watch`, one at a time, each cut to `max_event_bytes`)
  while more than `hold_bytes` wait, so a client that does not read cannot make the
  gateway queue answers without end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Send = Callable[[bytes], Awaitable[None]]


class Outbox:
    def __init__(
        self,
        send: Send,
        *,
        drop_bytes: int,
        drop_messages: int,
        hold_bytes: int,
        on_drained: Callable[[], None] | None = None,
    ) -> None:
        self._send = send
        self.drop_bytes = drop_bytes
        self.drop_messages = drop_messages
        self.hold_bytes = hold_bytes
        self._on_drained = on_drained
        self._queue: collections.deque[bytes] = collections.deque()
        self.queued_bytes = 0  # includes the message being written
        self.peak_bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        self._writer: asyncio.Task[None] | None = None

    # --- producers --------------------------------------------------------------------

    @property
    def full(self) -> bool:
        """True when a droppable message would be refused (any size)."""
        return self._closed or (
            bool(self._queue)
            and (self.queued_bytes >= self.drop_bytes or len(self._queue) >= self.drop_messages)
        )

    def offer(self, data: bytes) -> bool:
        """Queue a droppable message; False (and nothing queued) when there is no room.

        An empty queue always takes one message, so a single large image still arrives.
        """
        if self.full:
            return False
        if self._queue and self.queued_bytes + len(data) > self.drop_bytes:
            return False
        self._append(data)
        return True

    def put(self, data: bytes) -> None:
        """Queue a message that must not be dropped (unless the connection is gone)."""
        if not self._closed:
            self._append(data)

    def _append(self, data: bytes) -> None:
        self._queue.append(data)
        self.queued_bytes += len(data)
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
        if self.queued_bytes > self.hold_bytes:
            self._room.clear()
        self._wake.set()

    async def wait_for_room(self) -> None:
        """Wait while more than `hold_bytes` wait to be sent (returns at once when closed)."""
        await self._room.wait()

    # --- the writer -------------------------------------------------------------------

    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_all())

    async def _write_all(self) -> None:
        try:
            while not self._closed:
                if not self._queue:
                    self._wake.clear()
                    if self._on_drained is not None:
                        self._on_drained()  # may queue notices
                    if not self._queue:
                        await self._wake.wait()
                    continue
                data = self._queue[0]
                await self._send(data)
                self._queue.popleft()
                self.queued_bytes -= len(data)
                if self.queued_bytes <= self.hold_bytes:
                    self._room.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection went away mid-write
            log.debug("stream writer stopped: %r", exc)
        finally:
            self._close_queue()

    def _close_queue(self) -> None:
        self._closed = True
        self._queue.clear()
        self.queued_bytes = 0
        self._room.set()  # nobody may wait for a dead connection

    async def close(self) -> None:
        """Stop writing and forget what was queued."""
        self._close_queue()
        if self._writer is not None and self._writer is not asyncio.current_task():
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
