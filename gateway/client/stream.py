"""One run's events over the WebSocket `/v1/stream`, as the `gateway.models.stream` events:
`RunStream` for the blocking client (an iterator), `AsyncRunStream` for asyncio (an async
iterator). They differ only in how they wait for a message; what a message is and what it
tells is written once (`StreamEvents`).

    with client.stream_run("print(1)") as run:           # GatewayClient
        for event in run:                                # AcceptedEvent, OutputEvent..., DoneEvent
            ...
    run.record                                           # the final record (after `done`)

    async with client.stream_run("print(1)") as run:     # AsyncGatewayClient
        async for event in run:
            ...

`client.stream_notebook(nb)` is the same for a notebook replay, whose events also hold
`CellStartedEvent` and `CellFinishedEvent` around each cell's outputs; `run.notebook` is
then the executed notebook (an nbformat `NotebookNode`).

Each stream has a connection of its own, opened on the first event asked for and closed
after `done`. Leaving the iteration early (`break`, an exception, leaving the `with`)
closes the connection, and the gateway cancels a run whose connection closed; `cancel()`
asks the gateway to cancel it and the iteration goes on to its `done` event (`status:
cancelled`). An `error` event about the run is raised as the client's error
(`gateway.client.refusals`); the connection's own failures as `Unreachable`. The blocking
stream's connection is websockets' threaded one (no event loop); `cancel()` and `close()`
may be called from another thread while one waits for an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, ClassVar, Self

import pydantic
from nbformat import NotebookNode
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection as SyncClientConnection

from gateway.client.base import AsyncClosing, notebook_node
from gateway.client.refusals import error_from_event, not_the_api
from gateway.errors import Unreachable
from gateway.models.stream import (
    AcceptedEvent,
    CellFinishedEvent,
    CellStartedEvent,
    DoneEvent,
    ErrorEvent,
    OutputDroppedEvent,
    OutputEvent,
)
from gateway.models.typed import TypedRunRecord

StreamEvent = (
    AcceptedEvent
    | OutputEvent
    | OutputDroppedEvent
    | DoneEvent
    | CellStartedEvent
    | CellFinishedEvent
)
Connect = Callable[[], Awaitable[ClientConnection]]
# opens a connection whose closing it leaves to the stack it is given
SyncConnect = Callable[[contextlib.ExitStack], SyncClientConnection]


class StreamEvents:
    """What both streams share, without I/O: the message that starts the run, how each
    message of the gateway becomes its event, and what the events told so far."""

    # the events of a run, by `type` (an `error` event is raised instead)
    events: ClassVar[dict[str, type[StreamEvent]]] = {
        "accepted": AcceptedEvent,
        "output": OutputEvent,
        "output_dropped": OutputDroppedEvent,
        "done": DoneEvent,
        # a notebook replay's (`stream_notebook`)
        "cell_started": CellStartedEvent,
        "cell_finished": CellFinishedEvent,
    }

    def __init__(self, message: dict[str, Any]) -> None:
        self._message = message
        self._ref = message.get("ref")
        self._closing = False  # closed on purpose: the connection's end is no failure
        self.id: str | None = None  # the run's id, from its `accepted` event
        self.record: TypedRunRecord | None = None  # the run's final record, from `done`
        self.notebook: NotebookNode | None = None  # a replay's executed notebook, from `done`

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, done={self.record is not None})"

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

    def _seen(self, event: StreamEvent) -> bool:
        """Keep what `event` tells; whether it is the last (`done`)."""
        if isinstance(event, AcceptedEvent):
            self.id = event.id
        elif isinstance(event, DoneEvent):
            self.record = _record(event)
            self.notebook = None if event.notebook is None else notebook_node(event.notebook)
            return True
        return False

    def _cancel_message(self) -> str:
        return json.dumps({"type": "cancel", "ref": self._ref})

    def _ended(self, exc: ConnectionClosed) -> Unreachable | None:
        """The error a connection that closed before `done` is (none when closed here)."""
        if self._closing:
            return None
        return Unreachable(f"The gateway closed the stream before the run was done: {exc}")


class AsyncRunStream(StreamEvents, AsyncClosing):
    """The events of the run that `message` starts, on a connection `connect` opens."""

    def __init__(self, connect: Connect, message: dict[str, Any]) -> None:
        super().__init__(message)
        self._connect = connect
        self._connection: ClientConnection | None = None
        self._waiting = False  # a task awaits the next event
        self._iterator = self._receive()

    def __aiter__(self) -> Self:
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
            await self._send(json.dumps(self._message))
            while True:
                try:
                    data = await connection.recv()
                except ConnectionClosed as exc:
                    error = self._ended(exc)
                    if error is None:
                        return
                    raise error from exc
                event = self.parse(data)
                done = self._seen(event)
                yield event
                if done:
                    return
        finally:
            self._connection = None
            self._closing = True
            try:
                await connection.close()
            except asyncio.CancelledError:
                connection.transport.abort()  # the gateway sees the connection end anyway
                raise

    async def cancel(self) -> None:
        """Ask the gateway to cancel the run; its `done` event follows (`cancelled`). Before
        the stream is connected there is nothing to cancel: the stream is closed."""
        if self._connection is None:
            await self.aclose()
            return
        await self._send(self._cancel_message())

    async def aclose(self) -> None:
        """Close the connection (the gateway then cancels the run if it is not done)."""
        self._closing = True
        if self._connection is not None:
            await self._connection.close()
        if not self._waiting:  # else the waiting task sees the connection closed, and ends
            await self._iterator.aclose()

    async def _send(self, message: str) -> None:
        assert self._connection is not None
        try:
            await self._connection.send(message)
        except ConnectionClosed as exc:
            raise Unreachable(f"The stream to the gateway is closed: {exc}") from exc


class RunStream(StreamEvents):
    """The blocking twin of `AsyncRunStream`: an iterator of the run's events, on a
    connection of websockets' threaded client that `connect` opens.

    It holds no generator (whose frame would hold the stream back in a reference cycle): a
    stream dropped before its end is closed as soon as it is dropped, and the gateway then
    cancels its run."""

    def __init__(self, connect: SyncConnect, message: dict[str, Any]) -> None:
        super().__init__(message)
        self._connect = connect
        self._connection: SyncClientConnection | None = None
        self._closes = contextlib.ExitStack()  # closes the connection
        self._ended_here = False  # `done` came, or the stream was closed or failed

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> StreamEvent:
        """The next event: connect and start the run first; after `done`, the end. The
        connection is closed on every way out."""
        if self._ended_here:
            raise StopIteration
        try:
            connection = self._connection or self._start()
            try:
                data = connection.recv()
            except ConnectionClosed as exc:
                error = self._ended(exc)
                if error is None:
                    raise StopIteration from None
                raise error from exc
            event = self.parse(data)
            if self._seen(event):
                self._finish()
            return event
        except BaseException:
            self._finish()
            raise

    def _start(self) -> SyncClientConnection:
        connection = self._connect(self._closes)
        self._connection = connection
        self._send(json.dumps(self._message), connection)
        return connection

    def _finish(self) -> None:
        self._ended_here = self._closing = True
        self._connection = None
        self._closes.close()

    def cancel(self) -> None:
        """Ask the gateway to cancel the run; its `done` event follows (`cancelled`). Before
        the stream is connected there is nothing to cancel: the stream is closed."""
        connection = self._connection
        if connection is None:
            self.close()
            return
        self._send(self._cancel_message(), connection)

    def close(self) -> None:
        """Close the connection (the gateway then cancels the run if it is not done); a
        thread waiting for an event sees the end of the events."""
        self._finish()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _send(self, message: str, connection: SyncClientConnection) -> None:
        try:
            connection.send(message)
        except ConnectionClosed as exc:
            raise Unreachable(f"The stream to the gateway is closed: {exc}") from exc


def _record(event: DoneEvent) -> TypedRunRecord:
    try:
        return TypedRunRecord.model_validate(event.run)
    except pydantic.ValidationError as exc:
        raise not_the_api(0, f"a `done` event whose record does not fit: {exc}") from None
