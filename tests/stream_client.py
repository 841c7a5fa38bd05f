"""A WebSocket client for `/v1/stream` in tests: connect, send, and wait for events."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import tornado.httpclient
import tornado.websocket


class Stream:
    """A tornado WebSocket client with helpers to wait for events."""

    def __init__(self, ws: tornado.websocket.WebSocketClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    def send(self, message: Any) -> None:
        self.ws.write_message(
            message if isinstance(message, str | bytes) else json.dumps(message),
            binary=isinstance(message, bytes),
        )

    async def recv(self, timeout: float = 60) -> dict[str, Any] | None:
        text = await asyncio.wait_for(self.ws.read_message(), timeout)
        if text is None:
            return None
        event: dict[str, Any] = json.loads(text)
        event["_t"] = time.monotonic()
        self.events.append(event)
        return event

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = await self.recv(max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"no matching event in {timeout} s: {self.events}") from None
            assert event is not None, f"connection closed; events so far: {self.events}"
            if predicate(event):
                return event

    async def done(self, ref: Any, timeout: float = 60) -> dict[str, Any]:
        """The `done` event of `ref` (perhaps received already)."""
        for event in self.events:
            if event["type"] == "done" and event["ref"] == ref:
                return event
        return await self.until(lambda e: e["type"] == "done" and e["ref"] == ref, timeout)

    async def run(self, ref: Any, **fields: Any) -> list[dict[str, Any]]:
        """Send a run and return its events up to `done`."""
        self.send({"type": "run", "ref": ref, **fields})
        await self.done(ref)
        return [e for e in self.events if e.get("ref") == ref]


def ws_url(port: int, query: str = "") -> str:
    return f"ws://127.0.0.1:{port}/v1/stream{query}"


@asynccontextmanager
async def connect(
    port: int, query: str = "", headers: dict[str, str] | None = None
) -> AsyncIterator[Stream]:
    request = tornado.httpclient.HTTPRequest(ws_url(port, query), headers=headers or {})
    ws = await tornado.websocket.websocket_connect(request)
    try:
        yield Stream(ws)
    finally:
        ws.close()
        # let the close handshake finish inside this event loop
        with _suppress_timeout():
            while await asyncio.wait_for(ws.read_message(), 5) is not None:
                pass


class _suppress_timeout:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, value: Any, tb: Any) -> bool:
        return typ is not None and issubclass(typ, asyncio.TimeoutError)


def outputs_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["output"] for e in events if e["type"] == "output"]


def stream_text(events: list[dict[str, Any]], name: str = "stdout") -> str:
    return "".join(
        o["text"] for o in outputs_of(events) if o["output_type"] == "stream" and o["name"] == name
    )
