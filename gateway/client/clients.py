"""`GatewayClient` (blocking) and `AsyncGatewayClient` (asyncio): the same calls, over
httpx2's `Client` and `AsyncClient`. Each method builds its call with the shared base
(`gateway.client.base`) and sends it; only sending (and sleeping, in `wait`) is written
twice.

HTTP goes through httpx2 (the maintained continuation of httpx, by the pydantic team:
the same `Client`/`AsyncClient` API, and what the MCP SDK already uses); the WebSocket
(`stream_run`, `stream_notebook`) through `websockets`: its asyncio client for
`AsyncGatewayClient`, its threaded one for `GatewayClient` (no event loop per call).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, Unpack

import httpx2
from nbformat import NotebookNode
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection as SyncClientConnection
from websockets.sync.client import connect as sync_connect

from gateway.client.base import (
    DEFAULT_TIMEOUT,
    AsyncClosing,
    BaseGatewayClient,
    Call,
    ListQuery,
    NotebookOptions,
    NotebookResult,
    RunOptions,
    Waiting,
)
from gateway.client.refusals import error_from_answer, not_the_api
from gateway.client.sessions import AsyncSession, Session
from gateway.client.stream import AsyncRunStream, RunStream
from gateway.errors import GatewayError, RateLimited, Unavailable, Unreachable
from gateway.models.answers import Health, RunAccepted, Upload
from gateway.models.environment import Environment
from gateway.models.typed import (
    TypedRunList,
    TypedRunRecord,
    TypedSnapshotList,
    TypedUsageList,
)

T = TypeVar("T")

# The largest WebSocket message taken: a `done` event is at most the gateway's
# `max_event_bytes` (default 16 MiB).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def _failure(url: str, exc: Exception) -> GatewayError:
    """httpx2's exception for a request that got no usable answer, as ours."""
    if isinstance(exc, httpx2.TimeoutException):
        return Unreachable(f"No answer from the gateway at {url} in time: {exc!r}")
    if isinstance(exc, httpx2.TransportError):
        return Unreachable(f"No answer from the gateway at {url}: {exc}")
    return not_the_api(0, f"{type(exc).__name__}: {exc}")


# what opening a WebSocket may raise: a refused handshake (an answer of the API), or none
HANDSHAKE_FAILURES = (InvalidStatus, OSError, TimeoutError, InvalidHandshake, InvalidURI)


def _refused_stream(url: str, exc: Exception) -> GatewayError:
    """websockets' exception for a handshake that failed, as ours."""
    if isinstance(exc, InvalidStatus):
        answer = exc.response
        retry_after = answer.headers.get("Retry-After")
        return error_from_answer(answer.status_code, bytes(answer.body), retry_after)
    return Unreachable(f"No WebSocket to the gateway at {url}: {exc}")


class GatewayClient(BaseGatewayClient):
    """Blocking calls to the gateway at `url` (`http://host:port`, perhaps with a prefix).

        with GatewayClient("http://127.0.0.1:8888", token="...") as client:
            record = client.run("print(1)")          # a TypedRunRecord
            client.get_run(record.id), client.notebook(record.id)
            with client.stream_run("print(1)") as run:
                for event in run:                    # its events, as they happen
                    ...

    Errors are raised as `gateway.errors.GatewayError` subclasses. One instance
    may be shared between threads; `close()` (or the `with` block) ends its connections.
    """

    def __init__(
        self, url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        super().__init__(url, token=token, timeout=timeout)
        self._http = httpx2.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        try:
            response = self._http.request(
                call.method, call.path, json=call.json, content=call.content, headers=call.headers
            )
        except httpx2.RequestError as exc:
            raise _failure(self.url, exc) from exc
        return call.answer(
            response.status_code, response.content, response.headers.get("Retry-After")
        )

    # --- runs -----------------------------------------------------------------------------

    def run(self, code: str | None = None, **options: Unpack[RunOptions]) -> TypedRunRecord:
        """`POST /v1/runs`: run `code` (or `entrypoint`) in a fresh kernel; its record."""
        return self._send(self._run(code, options))

    def start(self, code: str | None = None, **options: Unpack[RunOptions]) -> RunAccepted:
        """`POST /v1/runs` in the background: `{id, status}` at once; `wait(id)` for its
        record."""
        return self._send(self._start(code, options))

    def get_run(self, run_id: str) -> TypedRunRecord:
        """`GET /v1/runs/{id}`: the record (`queued` or `running` while it runs)."""
        return self._send(self._get_run(run_id))

    def wait(self, run_id: str, *, timeout: float | None = None) -> TypedRunRecord:
        """The record of a background run once it is final (`GET /v1/runs/{id}` until then,
        further and further apart: `Waiting`); `TimeoutError` if it is not after `timeout`
        seconds (the run goes on)."""
        waiting = Waiting(run_id, timeout)
        while True:
            try:
                record = self.get_run(run_id)
            except (RateLimited, Unavailable) as exc:
                time.sleep(waiting.pause(exc.retry_after))
                continue
            if record.final:
                return record
            time.sleep(waiting.pause())

    def list_runs(self, **query: Unpack[ListQuery]) -> TypedRunList:
        """`GET /v1/runs`: a page of the caller's runs, newest first (`limit`, `status`,
        `language`; admins: `user`); pass the page's `next` as `cursor` for the next."""
        return self._send(self._list_runs(query))

    def cancel(self, run_id: str) -> TypedRunRecord:
        """`DELETE /v1/runs/{id}`: cancel a queued or running run; its record afterwards."""
        return self._send(self._cancel(run_id))

    def notebook(self, run_id: str) -> NotebookNode:
        """`GET /v1/runs/{id}/notebook`: the run as an nbformat v4 notebook (`nbformat.write`
        writes it as it is)."""
        return self._send(self._notebook(run_id))

    def run_notebook(
        self, notebook: Mapping[str, Any], **options: Unpack[NotebookOptions]
    ) -> NotebookResult:
        """`POST /v1/notebooks/run`: every code cell of `notebook` in one fresh kernel."""
        return self._send(self._run_notebook(notebook, options))

    def stream_run(self, code: str | None = None, **options: Unpack[RunOptions]) -> RunStream:
        """`WebSocket /v1/stream`: run `code` and get its events as they happen
        (`gateway.client.stream.RunStream`). Nothing is sent before the first event is
        asked for; a refused handshake or run raises the client's errors then."""
        return RunStream(self._open_stream, self._run_message(code, options))

    def stream_notebook(
        self, notebook: Mapping[str, Any], **options: Unpack[NotebookOptions]
    ) -> RunStream:
        """`WebSocket /v1/stream`: replay `notebook` and get its events as they happen: per
        cell `CellStartedEvent`, its outputs (with `index`), `CellFinishedEvent`; the
        stream's `notebook` is the executed notebook after `done`."""
        return RunStream(self._open_stream, self._notebook_message(notebook, options))

    def _open_stream(self, closes: contextlib.ExitStack) -> SyncClientConnection:
        """A connection to `/v1/stream` (websockets' threaded client: it answers the
        gateway's pings while the caller is busy elsewhere), closed by `closes`."""
        headers = self.headers
        user_agent = headers.pop("User-Agent")
        try:
            connecting = sync_connect(
                self.stream_url,
                additional_headers=headers,
                user_agent_header=user_agent,
                open_timeout=self.timeout,
                max_size=MAX_MESSAGE_BYTES,
            )
            return closes.enter_context(connecting)  # as websockets asks: as a context
        except HANDSHAKE_FAILURES as exc:
            raise _refused_stream(self.stream_url, exc) from exc

    # --- uploads and operations -----------------------------------------------------------

    def upload(self, archive: str | os.PathLike[str] | bytes, filename: str = "") -> Upload:
        """`POST /v1/uploads`: a .zip or .tar.gz (a path, or its bytes named `filename`)."""
        return self._send(self._upload(archive, filename))

    def health(self) -> Health:
        """`GET /v1/health` (also when it answers 503 `store_unavailable`)."""
        return self._send(self._health())

    def environment(self) -> Environment:
        """`GET /v1/environment`: the languages, their kernels and installed packages."""
        return self._send(self._environment())

    def metrics(self) -> str:
        """`GET /metrics`: the Prometheus text."""
        return self._send(self._metrics())

    def session(self, snapshot: str | None = None) -> Session:
        """Runs that each start from the state the one before kept (`with` it: leaving
        deletes what it kept); from `snapshot` if given (gateway.client.sessions)."""
        return Session(self, snapshot)

    def list_snapshots(self) -> TypedSnapshotList:
        """`GET /v1/snapshots`: the caller's kept kernel states, least recently used first."""
        return self._send(self._list_snapshots())

    def delete_snapshot(self, snapshot_id: str) -> None:
        """`DELETE /v1/snapshots/{id}`."""
        self._send(self._delete_snapshot(snapshot_id))

    def usage(self, user: str | None = None) -> TypedUsageList:
        """`GET /v1/usage`: what the caller's runs spent and may spend (an admin: every
        user's, or `user`'s)."""
        return self._send(self._usage(user))

    def openapi(self) -> dict[str, Any]:
        """`GET /openapi.json`: the OpenAPI 3.1 document, as its JSON. A dict on purpose: it
        describes the API rather than answering a call (no model of the API stands for it),
        and what reads it (a validator, a code generator) takes the JSON."""
        return self._send(self._openapi())


class AsyncGatewayClient(BaseGatewayClient, AsyncClosing):
    """The calls of `GatewayClient` for asyncio (`await client.run(...)`); `stream_run` is
    an async iterator of a run's events.

        async with AsyncGatewayClient(url, token=token) as client:
            record = await client.run("print(1)")
            async with client.stream_run("print(1)") as run:
                async for event in run:
                    ...
    """

    def __init__(
        self, url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        super().__init__(url, token=token, timeout=timeout)
        self._http = httpx2.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method, call.path, json=call.json, content=call.content, headers=call.headers
            )
        except httpx2.RequestError as exc:
            raise _failure(self.url, exc) from exc
        return call.answer(
            response.status_code, response.content, response.headers.get("Retry-After")
        )

    # --- runs -----------------------------------------------------------------------------

    async def run(self, code: str | None = None, **options: Unpack[RunOptions]) -> TypedRunRecord:
        """`POST /v1/runs`: run `code` (or `entrypoint`) in a fresh kernel; its record."""
        return await self._send(self._run(code, options))

    async def start(self, code: str | None = None, **options: Unpack[RunOptions]) -> RunAccepted:
        """`POST /v1/runs` in the background: `{id, status}` at once; `wait(id)` for its
        record."""
        return await self._send(self._start(code, options))

    async def get_run(self, run_id: str) -> TypedRunRecord:
        """`GET /v1/runs/{id}`: the record (`queued` or `running` while it runs)."""
        return await self._send(self._get_run(run_id))

    async def wait(self, run_id: str, *, timeout: float | None = None) -> TypedRunRecord:
        """The record of a background run once it is final (`GET /v1/runs/{id}` until then,
        further and further apart: `Waiting`); `TimeoutError` if it is not after `timeout`
        seconds (the run goes on; cancelling the waiting task does not cancel the run)."""
        waiting = Waiting(run_id, timeout)
        while True:
            try:
                record = await self.get_run(run_id)
            except (RateLimited, Unavailable) as exc:
                await asyncio.sleep(waiting.pause(exc.retry_after))
                continue
            if record.final:
                return record
            await asyncio.sleep(waiting.pause())

    async def list_runs(self, **query: Unpack[ListQuery]) -> TypedRunList:
        """`GET /v1/runs`: a page of the caller's runs, newest first (`limit`, `status`,
        `language`; admins: `user`); pass the page's `next` as `cursor` for the next."""
        return await self._send(self._list_runs(query))

    async def cancel(self, run_id: str) -> TypedRunRecord:
        """`DELETE /v1/runs/{id}`: cancel a queued or running run; its record afterwards."""
        return await self._send(self._cancel(run_id))

    async def notebook(self, run_id: str) -> NotebookNode:
        """`GET /v1/runs/{id}/notebook`: the run as an nbformat v4 notebook (`nbformat.write`
        writes it as it is)."""
        return await self._send(self._notebook(run_id))

    async def run_notebook(
        self, notebook: Mapping[str, Any], **options: Unpack[NotebookOptions]
    ) -> NotebookResult:
        """`POST /v1/notebooks/run`: every code cell of `notebook` in one fresh kernel."""
        return await self._send(self._run_notebook(notebook, options))

    def stream_run(self, code: str | None = None, **options: Unpack[RunOptions]) -> AsyncRunStream:
        """`WebSocket /v1/stream`: run `code` and get its events as they happen
        (`gateway.client.stream.AsyncRunStream`). Nothing is sent before the first event is
        asked for; a refused handshake or run raises the client's errors then."""
        return AsyncRunStream(self._open_stream, self._run_message(code, options))

    def stream_notebook(
        self, notebook: Mapping[str, Any], **options: Unpack[NotebookOptions]
    ) -> AsyncRunStream:
        """`WebSocket /v1/stream`: replay `notebook` and get its events as they happen: per
        cell `CellStartedEvent`, its outputs (with `index`), `CellFinishedEvent`; the
        stream's `notebook` is the executed notebook after `done`."""
        return AsyncRunStream(self._open_stream, self._notebook_message(notebook, options))

    async def _open_stream(self) -> ClientConnection:
        """A connection to `/v1/stream`; the token goes in the `Authorization` header
        (the gateway takes `?token=` too, for browsers, which cannot set headers)."""
        headers = self.headers
        user_agent = headers.pop("User-Agent")
        try:
            return await connect(
                self.stream_url,
                additional_headers=headers,
                user_agent_header=user_agent,
                open_timeout=self.timeout,
                max_size=MAX_MESSAGE_BYTES,
            )
        except HANDSHAKE_FAILURES as exc:
            raise _refused_stream(self.stream_url, exc) from exc

    # --- uploads and operations -----------------------------------------------------------

    async def upload(self, archive: str | os.PathLike[str] | bytes, filename: str = "") -> Upload:
        """`POST /v1/uploads`: a .zip or .tar.gz (a path, or its bytes named `filename`)."""
        if not isinstance(archive, bytes):  # read in a thread: the event loop never waits
            path = Path(archive)
            archive, filename = await asyncio.to_thread(path.read_bytes), filename or path.name
        return await self._send(self._upload(archive, filename))

    async def health(self) -> Health:
        """`GET /v1/health` (also when it answers 503 `store_unavailable`)."""
        return await self._send(self._health())

    async def environment(self) -> Environment:
        """`GET /v1/environment`: the languages, their kernels and installed packages."""
        return await self._send(self._environment())

    async def metrics(self) -> str:
        """`GET /metrics`: the Prometheus text."""
        return await self._send(self._metrics())

    def session(self, snapshot: str | None = None) -> AsyncSession:
        """Runs that each start from the state the one before kept (`async with` it:
        leaving deletes what it kept); from `snapshot` if given."""
        return AsyncSession(self, snapshot)

    async def list_snapshots(self) -> TypedSnapshotList:
        """`GET /v1/snapshots`: the caller's kept kernel states, least recently used first."""
        return await self._send(self._list_snapshots())

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """`DELETE /v1/snapshots/{id}`."""
        await self._send(self._delete_snapshot(snapshot_id))

    async def usage(self, user: str | None = None) -> TypedUsageList:
        """`GET /v1/usage`: what the caller's runs spent and may spend (an admin: every
        user's, or `user`'s)."""
        return await self._send(self._usage(user))

    async def openapi(self) -> dict[str, Any]:
        """`GET /openapi.json`: the OpenAPI 3.1 document, as its JSON (see
        `GatewayClient.openapi` for why a dict)."""
        return await self._send(self._openapi())
