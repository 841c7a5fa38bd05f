"""`RunStream`: one run's events over the WebSocket `/v1/stream`, as an async iterator of
the `gateway.models.stream` events.

    async with client.stream_run("print(1)") as run:
        async for event in run:          # AcceptedEvent, OutputEvent..., DoneEvent
            ...
    run.record                           # the final RunRecord (after `done`)

`client.stream_notebook(nb)` is the same for a notebook replay, whose events also hold
`CellStartedEvent` and `CellFinishedEvent` around each cell's outputs; `run.notebook` is
then the executed notebook.

Each stream has a connection of its own, opened on the first event asked for and closed
after `done`. Leaving the iteration early (`break`, an exception, leaving the `async
with`) closes the connection, and the gateway cancels a run whose connection closed;
`cancel()` asks the gateway to cancel it and the iteration goes on to its `done` event
(`status: cancelled`). An `error` event about the run is raised as the client's error
(`gateway.client.refusals`); the connection's own failures as `Unreachable`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, ClassVar

import pydantic
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.client.base import AsyncClosing
from gateway.client.refusals import error_from_event, not_the_api
from gateway.errors import Unreachable
from gateway.models.record import RunRecord
from gateway.models.stream import (
    AcceptedEvent,
    CellFinishedEvent,
    CellStartedEvent,
    DoneEvent,
    ErrorEvent,
    OutputDroppedEvent,
    OutputEvent,
)

StreamEvent = (
    AcceptedEvent
    | OutputEvent
    | OutputDroppedEvent
    | DoneEvent
    | CellStartedEvent
    | CellFinishedEvent
)
Connect = Callable[[], Awaitable[ClientConnection]]


class RunStream(AsyncClosing):
    """The events of the run that `message` starts, on a connection `connect` opens."""

    # the events of a run, by `type` (an `error` event is raised instead)
    events: ClassVar[dict[str, type[StreamEvent]]] = {
        "accepted": AcceptedEvent,
        "output": OutputEvent,
        "output_dropped": OutputDroppedEvent,
        "done": DoneEvent,
        # a notebook replay's (`AsyncGatewayClient.stream_notebook`)
        "cell_started": CellStartedEvent,
        "cell_finished": CellFinishedEvent,
    }

    def __init__(self, connect: Connect, message: dict[str, Any]) -> None:
        self._connect = connect
        self._message = message
        self._ref = message.get("ref")
        self._connection: ClientConnection | None = None
        self._closing = False
        self._iterator = self._receive()
        self._waiting = False  # a task awaits the next event
        self.id: str | None = None  # the run's id, from its `accepted` event
        self.record: RunRecord | None = None  # the run's final record, from `done`
        self.notebook: dict[str, Any] | None = None  # a replay's executed notebook, from `done`

    def __repr__(self) -> str:
        return f"RunStream(id={self.id!r}, done={self.record is not None})"

    # --- iteration ------------------------------------------------------------------------

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> StreamEvent:
        self._waiting = True
        try:
            return await self._iterator.__anext__()
        finally:
            self._waiting = False

    async def _receive(self) -> AsyncGenerator[StreamEvent, None]:
        """Connect, start the run, and yield its events up to `done`; the connection is
        closed on every way out."""
        connection = await self._connect()
        self._connection = connection
        try:
            await self._send(self._message)
            while True:
                try:
                    data = await connection.recv()
                except ConnectionClosed as exc:
                    if self._closing:
                        return
                    raise Unreachable(
                        f"The gateway closed the stream before the run was done: {exc}"
                    ) from exc
                event = self.parse(data)
                if isinstance(event, AcceptedEvent):
                    self.id = event.id
                elif isinstance(event, DoneEvent):
                    self.record, self.notebook = _record(event), event.notebook
                yield event
                if isinstance(event, DoneEvent):
                    return
        finally:
            self._connection = None
            self._closing = True
            try:
                await connection.close()
            except asyncio.CancelledError:
                connection.transport.abort()  # the gateway sees the connection end anyway
                raise

    def parse(self, data: str | bytes) -> StreamEvent:
        """One message of the gateway as its event; an `error` event is raised."""
        try:
            message = json.loads(data)
        except ValueError:
            raise not_the_api(0, "a stream message that is not JSON") from None
        kind = message.get("type") if isinstance(message, dict) else None
        try:
            if kind == "error":
                raise error_from_event(ErrorEvent.model_validate(message))
            if not isinstance(kind, str) or kind not in self.events:
                raise not_the_api(0, f"a stream event of unknown type {kind!r}")
            return self.events[kind].model_validate(message)
        except pydantic.ValidationError as exc:
            raise not_the_api(0, f"a {kind} event that does not fit its model: {exc}") from None

    # --- control --------------------------------------------------------------------------

    async def cancel(self) -> None:
        """Ask the gateway to cancel the run; its `done` event follows (`cancelled`). Before
        the stream is connected there is nothing to cancel: the stream is closed."""
        if self._connection is None:
            await self.aclose()
            return
        await self._send({"type": "cancel", "ref": self._ref})

    async def aclose(self) -> None:
        """Close the connection (the gateway then cancels the run if it is not done)."""
        self._closing = True
        if self._connection is not None:
            await self._connection.close()
        if not self._waiting:  # else the waiting task sees the connection closed, and ends
            await self._iterator.aclose()

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._connection is not None
        try:
            await self._connection.send(json.dumps(message))
        except ConnectionClosed as exc:
            raise Unreachable(f"The stream to the gateway is closed: {exc}") from exc


def _record(event: DoneEvent) -> RunRecord:
    try:
        return RunRecord.model_validate(event.run)
    except pydantic.ValidationError as exc:
        raise not_the_api(0, f"a `done` event whose record does not fit: {exc}") from None
