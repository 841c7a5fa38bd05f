"""The gateway's end of a kernel's ZMQ channels: ZMTP 3.0 over a unix socket, written so that
what a kernel sends (hostile input) is bounded as it arrives.

Why not libzmq, through jupyter_client's channels: libzmq reads a whole multipart message
into the gateway's memory before the application sees any of it. `ZMQ_MAXMSGSIZE` bounds one
frame and `RCVHWM` counts messages, so one message of many frames had no bound at all (250
frames of 8 MiB took a gateway from 121 MiB to 4 GiB), and a message whose last frame never
comes grows until the run's deadline without ever being seen. Here:

- a frame's size is read before its body. A message whose frames add up to more than
  `max_message_bytes`, or that has more than `MAX_FRAMES` frames, is read on in small pieces
  and dropped (`receive` answers `Dropped` with its size), never held;
- nothing is read until a message is asked for (`receive`), so at most one message per
  channel is in the gateway's memory, and a kernel that sends faster than the gateway reads
  waits on its own send, inside its own sandbox;
- every byte read, framing included, is added to the `Meter` that the kernel's channels
  share. A frame that would take it past its `ceiling` (the run's output limit) is not read:
  `OverLimit`, and the channel reads no more;
- a frame's bytes are taken from the gateway-wide `ByteBudget` of kernel messages before
  they are read, and given back once the message has been parsed (`release`).

Roles: DEALER (shell, control) to the kernel's ROUTER, and SUB (iopub, subscribed to
everything) to its XPUB; security mechanism NULL, since the socket files are reachable by
the gateway and that one kernel only, and jupyter's `Session` signs every message. ZMTP 3.0
is what libzmq 4 (ipykernel, our bash kernel) and zmq.rs (Deno's kernel) both speak; a 3.1
peer falls back to it (RFC 37: the lower version wins).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Hashable, Sequence
from typing import Literal

from gateway.budget import ByteBudget, Hold

SocketType = Literal["DEALER", "SUB"]

GREETING = (
    b"\xff"
    + bytes(8)
    + b"\x7f"  # signature
    + bytes([3, 0])  # version 3.0
    + b"NULL".ljust(20, b"\0")  # mechanism
    + b"\0"  # as-server: no
    + bytes(31)  # filler
)
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
MAX_FRAMES = 256  # frames of one message (a Jupyter message has 6 and a few buffers)
MAX_COMMAND_BYTES = 64 * 1024  # READY and the odd command: their properties are tiny
SKIP_CHUNK = 64 * 1024  # what is read at once of a message being dropped


class ZmtpError(Exception):
    """The peer broke the protocol or closed the connection: the channel is unusable."""


class OverLimit(Exception):
    """The kernel sent more than its meter's ceiling: nothing more is read from it."""


class Dropped:
    """A message that was read and dropped, not kept: larger than the message bound."""

    def __init__(self, nbytes: int, frames: int) -> None:
        self.nbytes = nbytes
        self.frames = frames

    def __repr__(self) -> str:
        return f"Dropped({self.nbytes} bytes in {self.frames} frames)"


class Meter:
    """Bytes received from one kernel on all its channels, and the ceiling past which
    nothing more is read (None: none yet; the run sets it to its output limit)."""

    def __init__(self) -> None:
        self.total = 0
        self.ceiling: int | None = None
        self.exceeded = False

    def admit(self, nbytes: int) -> None:
        """Count `nbytes` about to be read; OverLimit (and nothing counted) past the
        ceiling."""
        if self.exceeded or (self.ceiling is not None and self.total + nbytes > self.ceiling):
            self.exceeded = True
            raise OverLimit
        self.total += nbytes

    def limit_from_now(self, nbytes: int) -> None:
        """Allow `nbytes` more from now on."""
        self.ceiling = self.total + nbytes


@dataclasses.dataclass(eq=False)
class Channel:
    """One connected channel to a kernel; `open_channel` makes one."""

    _reader: asyncio.StreamReader
    _writer: asyncio.StreamWriter
    meter: Meter
    budget: ByteBudget
    max_message_bytes: int
    key: Hashable
    _holds: list[Hold] = dataclasses.field(default_factory=list, init=False)
    # closed, a protocol error, or past the ceiling mid-message
    broken: bool = dataclasses.field(default=False, init=False)

    # --- receiving --------------------------------------------------------------------

    async def receive(self) -> list[bytes] | Dropped:
        """The next message's frames, or `Dropped` for one too large to keep. Raises
        OverLimit past the meter's ceiling and ZmtpError when the connection is unusable.
        Call `release()` once the frames are parsed."""
        self.release()
        if self.broken:
            raise ZmtpError("the channel is closed")
        try:
            return await self._receive()
        except (OverLimit, ZmtpError):
            self.broken = True
            self.release()
            raise
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.broken = True
            self.release()
            raise ZmtpError(f"the kernel closed the connection ({exc!r})") from None
        except BaseException:  # cancelled mid-message: the stream is out of step
            self.broken = True
            self.release()
            raise

    async def _receive(self) -> list[bytes] | Dropped:
        frames: list[bytes] = []
        total = count = 0
        dropping = False
        while True:
            flags, size = await self._frame_header()
            if flags & COMMAND:
                if count:
                    raise ZmtpError("a command inside a multipart message")
                await self._command(size)  # e.g. a 3.1 peer's PING: nothing for us
                continue
            count += 1
            total += size
            if not dropping and (total > self.max_message_bytes or count > MAX_FRAMES):
                dropping = True
                frames.clear()
                self.release()
            if dropping:
                await self._skip(size)
            else:
                self.meter.admit(size)
                self._holds.append(await self.budget.take(size, self.key))
                frames.append(await self._reader.readexactly(size))
            if not flags & MORE:
                return Dropped(total, count) if dropping else frames

    async def _frame_header(self) -> tuple[int, int]:
        self.meter.admit(1)
        flags = (await self._reader.readexactly(1))[0]
        if flags & ~(MORE | LONG | COMMAND):
            raise ZmtpError(f"reserved frame flags set ({flags:#x})")
        width = 8 if flags & LONG else 1
        self.meter.admit(width)
        size = int.from_bytes(await self._reader.readexactly(width), "big")
        return flags, size

    async def _command(self, size: int) -> bytes:
        """A command's body (name and data), bounded; an ERROR command ends the channel."""
        if size > MAX_COMMAND_BYTES:
            raise ZmtpError(f"a command of {size} bytes")
        self.meter.admit(size)
        body = await self._reader.readexactly(size)
        name = body[1 : 1 + body[0]] if body else b""
        if name == b"ERROR":
            reason = body[2 + len(name) :].decode("utf-8", "replace")
            raise ZmtpError(f"the kernel refused the connection: {reason!r}")
        return body

    async def _skip(self, size: int) -> None:
        while size > 0:
            piece = min(size, SKIP_CHUNK)
            self.meter.admit(piece)
            await self._reader.readexactly(piece)
            size -= piece

    def release(self) -> None:
        """Give back the budget of the last message received (it has been parsed)."""
        holds, self._holds = self._holds, []
        for hold in holds:
            hold.release()

    # --- sending ----------------------------------------------------------------------

    def send(self, frames: Sequence[bytes]) -> None:
        """Queue a message (the gateway's own requests: small, bounded by `max_code_bytes`);
        the transport writes it without blocking."""
        if self.broken or self._writer.is_closing():
            return  # a dead kernel's requests go nowhere, as with libzmq
        last = len(frames) - 1
        for index, frame in enumerate(frames):
            self._writer.write(_frame(frame, MORE if index < last else 0))

    def close(self) -> None:
        self.broken = True
        self.release()
        self._writer.close()

    # --- handshake --------------------------------------------------------------------

    async def _handshake(self, socket_type: SocketType) -> None:
        ready = _command_body(b"READY", {b"Socket-Type": socket_type.encode()})
        self._writer.write(GREETING + _frame(ready, COMMAND))
        self.meter.admit(64)
        greeting = await self._reader.readexactly(64)
        if greeting[0] != 0xFF or greeting[9] != 0x7F:
            raise ZmtpError("the peer does not speak ZMTP 3")
        if greeting[10] < 3:
            raise ZmtpError(f"the peer speaks ZMTP {greeting[10]}.{greeting[11]}, not 3")
        if greeting[12:32].rstrip(b"\0") != b"NULL":
            raise ZmtpError("the peer asks for a security mechanism other than NULL")
        flags, size = await self._frame_header()
        if not flags & COMMAND:
            raise ZmtpError("the peer sent a message before READY")
        body = await self._command(size)
        if body[1 : 1 + body[0]] != b"READY":
            raise ZmtpError("the peer did not send READY")
        if socket_type == "SUB":
            self.send([b"\x01"])  # subscribe to every topic (ZMTP 3.0's way)


async def open_channel(
    path: str,
    socket_type: SocketType,
    meter: Meter,
    budget: ByteBudget,
    max_message_bytes: int,
    key: Hashable,
) -> Channel:
    """A channel connected to the unix socket `path`, its handshake done. Raises OSError
    when nothing listens there yet, ZmtpError when the peer is not a ZMTP 3 peer."""
    reader, writer = await asyncio.open_unix_connection(path, limit=SKIP_CHUNK)
    channel = Channel(reader, writer, meter, budget, max_message_bytes, key)
    try:
        await channel._handshake(socket_type)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        channel.close()
        raise ZmtpError(f"the kernel closed the connection in the handshake ({exc!r})") from None
    except BaseException:
        channel.close()
        raise
    return channel


def _frame(body: bytes, flags: int) -> bytes:
    if len(body) > 255:
        return bytes([flags | LONG]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


def _command_body(name: bytes, properties: dict[bytes, bytes]) -> bytes:
    parts = [bytes([len(name)]), name]
    for key, value in properties.items():
        parts += [bytes([len(key)]), key, len(value).to_bytes(4, "big"), value]
    return b"".join(parts)
