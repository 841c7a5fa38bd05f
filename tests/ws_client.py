"""A small WebSocket client for the attack tests: connect to `/v1/stream`, exchange JSON
messages, and close with the closing handshake finished (no socket left to the GC)."""

from __future__ import annotations

import asyncio
import contextlib
import json
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


async def handshake_status(port: int, headers: dict[str, str]) -> int:
    """101 when the handshake succeeded, else the HTTP status of the refusal."""
    try:
        async with open_stream(port, headers):
            return 101
    except tornado.httpclient.HTTPClientError as exc:
        assert exc.response is not None
        assert exc.response.headers["Content-Type"].startswith("application/json")
        return exc.code
