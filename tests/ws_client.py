"""A small WebSocket client for the attack tests: connect to `/v1/stream`, exchange JSON
messages, and close with the closing handshake finished (no socket left to the GC)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import tornado.httpclient
import tornado.websocket


@contextlib.asynccontextmanager
async def open_stream(
    port: int, headers: dict[str, str] | None = None, query: str = ""
) -> AsyncIterator[tornado.websocket.WebSocketClientConnection]:
    request = tornado.httpclient.HTTPRequest(
        f"ws://127.0.0.1:{port}/v1/stream{query}", headers=headers or {}
    )
    ws = await tornado.websocket.websocket_connect(request)
    try:
        yield ws
    finally:
        ws.close()
        with contextlib.suppress(asyncio.TimeoutError):
            while await asyncio.wait_for(ws.read_message(), 5) is not None:
                pass


async def receive(ws: tornado.websocket.WebSocketClientConnection, timeout: float = 60) -> Any:
    """The next message as JSON; None when the gateway closed the connection."""
    message = await asyncio.wait_for(ws.read_message(), timeout)
    if message is None:
        return None
    assert isinstance(message, str), "the gateway sends text frames"
    return json.loads(message)


async def handshake(port: int, headers: dict[str, str]) -> tuple[int, Any]:
    """(101, None) when the handshake succeeded, else the refusal's status and JSON body."""
    try:
        async with open_stream(port, headers):
            return 101, None
    except tornado.httpclient.HTTPClientError as exc:
        assert exc.response is not None
        assert exc.response.headers["Content-Type"].startswith("application/json")
        return exc.code, json.loads(exc.response.body)


async def handshake_status(port: int, headers: dict[str, str]) -> int:
    """101 when the handshake succeeded, else the HTTP status of the refusal."""
    return (await handshake(port, headers))[0]


class RawStream:
    """A WebSocket client on a plain blocking socket, so that not reading really leaves the
    data at the gateway (a library client reads ahead, whatever its caller does). The
    kernel's buffers still take a little: up to the receive window (~64 kB at first)."""

    def __init__(
        self, port: int, headers: dict[str, str] | None = None, receive_buffer: int = 0
    ) -> None:
        """`receive_buffer`: the socket's receive buffer in bytes, set before it connects
        (smaller: less of what the client does not read is held by this machine's kernel)."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        if receive_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(
            (
                f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
            ).encode()
        )
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            assert chunk, "closed during the handshake"
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])

    def _frame(self, opcode: int, payload: bytes) -> bytes:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            header = bytes([0x80 | opcode, 0x80 | n])
        elif n < 65536:
            header = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack(">H", n)
        else:
            header = bytes([0x80 | opcode, 0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return header + mask + masked

    def send(self, message: Any) -> None:
        self.sock.sendall(self._frame(1, json.dumps(message).encode()))

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the gateway")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def recv(self) -> Any:
        """The next text message as JSON (answering pings on the way)."""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = first & 0x0F
            if opcode == 9:
                self.sock.sendall(self._frame(10, payload))
            elif opcode == 1:
                return json.loads(payload)
            elif opcode == 8:
                raise ConnectionError("closed by the gateway")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(self._frame(8, struct.pack(">H", 1000)))
        self.sock.close()
