"""A WebSocket connection whose incoming messages are counted in the bodies budget as they
arrive, before tornado buffers them: a message may be as large as a request body, and a
user may open several connections, so each message being received takes room from the
same budget as the request bodies (the user's share, and everyone's total).

Room is taken before each read of a frame's bytes, for every copy of them tornado holds at
once while it reads the frame's whole payload (`read_room`: about twice their number).
Once the message is whole, the room shrinks to its bytes, which tornado keeps until the
message has been handled. A text message reaches the handler as those bytes (`on_text`),
never decoded by tornado: the handler decodes it as it parses it, within the room it took
for that (`StreamHandler._parse`), so a message is never held as bytes, text and objects
at once uncounted. The room is given back when the message has been handled
(`StreamHandler`: also when the connection went away meanwhile), or when the connection is
gone with no message being handled. A message whose bytes find no room closes its
connection with 1013 ("try again later"), before its payload is read. The few bytes of
a frame's header, and of a control frame between messages (a ping, a pong: at most 125),
are not counted; every read of a fragmented message is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Hashable
from typing import Protocol, cast

from tornado.concurrent import Future
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketProtocol13

from gateway.budget import ByteBudget, Hold

TRY_AGAIN_LATER = 1013  # RFC 6455's registry: the server is overloaded


def read_room(n: int) -> int:
    """What reading `n` bytes of a frame's payload holds at most: tornado's read buffer (a
    bytearray grown as bytes arrive, CPython's growth leaving up to an eighth more) and the
    bytes it hands over, then those and their unmasked copy."""
    return 2 * n + n // 8


_TEXT = 0x1
_BINARY = 0x2
_CONTROL = 0x8  # and above: close, ping, pong
UNCOUNTED_READ = 125  # a control frame's largest payload (RFC 6455), and any header


class TextReceiver(Protocol):
    """A handler that takes a text message as its UTF-8 bytes."""

    def on_text(self, data: bytes) -> Awaitable[None] | None: ...


class MessageRoom:
    """The room one connection's message being received takes in a budget."""

    def __init__(self, budget: ByteBudget, key: Hashable) -> None:
        self.budget = budget
        self.key = key
        self._hold: Hold | None = None

    @property
    def held(self) -> int:
        return 0 if self._hold is None or self._hold.released else self._hold.nbytes

    def take(self, nbytes: int) -> bool:
        """Room for `nbytes` more of this message; False when there is none."""
        if self._hold is None or self._hold.released:
            self._hold = self.budget.try_take(nbytes, self.key)
            return self._hold is not None
        return self._hold.grow(nbytes)

    def shrink_to(self, nbytes: int) -> None:
        """Give back what the message holds past `nbytes` (once its bytes are parsed)."""
        if self._hold is not None:
            self._hold.shrink_to(nbytes)

    def release(self) -> None:
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def hand_over(self) -> Hold | None:
        """The message's room, now the caller's to release (a run keeps it until it ends:
        the gateway holds what the message asked to run that long)."""
        hold, self._hold = self._hold, None
        return hold


class MeteredProtocol(WebSocketProtocol13):
    """tornado's RFC 6455 protocol, each read of incoming bytes first taken from `room`."""

    room: MessageRoom

    async def _read_bytes(self, n: int) -> bytes:
        # A frame's header (2, 4 or 8 bytes at a time), and a control frame's payload, are
        # not counted between messages: an idle connection holds no room (which would
        # deny a user's one large message the room a body alone may take), and pings do
        # not pile up phantom room. Within a fragmented message every read counts.
        between_messages = self._fragmented_message_buffer is None
        if between_messages and n <= UNCOUNTED_READ:
            return await super()._read_bytes(n)
        if not self.room.take(read_room(n)):
            self.close(TRY_AGAIN_LATER, "The gateway is receiving too much; try again later.")
            self._abort()
            raise StreamClosedError()
        return await super()._read_bytes(n)

    def _handle_message(self, opcode: int, data: bytes) -> Future[None] | None:
        """A whole message: its room down to its bytes (what tornado keeps until it has been
        handled), and a text message handed over as those bytes, not decoded."""
        if opcode in (_TEXT, _BINARY) and not self.client_terminated:
            self.room.shrink_to(len(data))
        elif opcode >= _CONTROL and self._fragmented_message_buffer is None:
            self.room.release()  # a ping, pong or close between messages: nothing held
        if opcode != _TEXT or self.client_terminated or self._frame_compressed:
            return super()._handle_message(opcode, data)
        self._message_bytes_in += len(data)
        return self._run_callback(cast(TextReceiver, self.handler).on_text, data)
