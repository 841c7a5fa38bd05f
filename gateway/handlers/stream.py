"""`WebSocket /v1/stream`: many runs on one connection, their outputs sent live.

Client -> gateway: `{"type": "run", "ref", ...fields of POST /v1/runs}`, `{"type":
"notebook", "ref", "notebook", ...fields of POST /v1/notebooks/run}` and `{"type":
"cancel", "id"}` (or `"ref"` of a run of this connection).
Gateway -> client, per run: `accepted`, zero or more `output` (and `output_dropped` when a
slow client made the gateway skip live events), then `done` with the full run record;
a notebook replay also `cell_started` and `cell_finished` around each code cell's
outputs (which carry the cell's `index`), and the executed notebook in `done`. `error`
for a message that could not be acted on. Closing the connection cancels its runs.

Auth happens on the handshake: `?token=` (browsers cannot set headers on a WebSocket) or
an `Authorization: Bearer` header. A browser's `Origin` must be this gateway's own or one
of the `allowed_origins` setting (`gateway.handlers.origin`). Every refusal is the API's JSON
error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import re
import urllib.parse
from collections.abc import Awaitable
from typing import Any, ClassVar

import tornado.web
import tornado.websocket

from gateway.auth import Principal
from gateway.budget import Hold
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
)
from gateway.execution.events import CellFinished, CellOutput, CellStarted, RunEvent
from gateway.handlers.base import BUSY_RETRY_AFTER, GatewayHandler, Services
from gateway.handlers.metered import MessageRoom, MeteredProtocol
from gateway.handlers.origin import origin_allowed
from gateway.handlers.outbox import Outbox
from gateway.jsoncodec import Document, JsonShape, dumps_utf8, parse_json, scan
from gateway.models.answers import ErrorBody
from gateway.models.base import sent
from gateway.models.ipynb import record_to_notebook
from gateway.models.notebook import NotebookMessage, notebook_text, scan_text
from gateway.models.record import RunRecord
from gateway.models.request import NotebookRequest, RunRequest
from gateway.models.stream import (
    MAX_REF_CHARS,
    AcceptedEvent,
    CellFinishedEvent,
    CellStartedEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    OutputDroppedEvent,
    OutputEvent,
    RunMessage,
)
from gateway.offload import OWNER, SMALL, offload
from gateway.runs.bounds import bound_json
from gateway.runs.config import RequestPolicy
from gateway.runs.requests import notebook_request, run_request
from gateway.runs.service import ActiveRun

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# Live `output` events wait in at most this much memory per connection; past it they are
# dropped (and counted in an `output_dropped` notice). The `done` record has everything.
OUTPUT_QUEUE_BYTES = 4 * MiB
OUTPUT_QUEUE_MESSAGES = 1024
# Incoming messages are not read while more than this waits to be sent.
HOLD_BYTES = 8 * MiB
PING_INTERVAL = 30.0
# A message that may be a notebook replay (its key `type` is "notebook": the bytes of a
# key cannot be inside a string, whose quotes are escaped) is held to a notebook's limits.
_NOTEBOOK_TYPE = re.compile(rb'"type"\s*:\s*"notebook"')


@dataclasses.dataclass
class _Run:
    """A run started on this connection."""

    ref: str | int | None
    notebook: bool = False  # a replay: its cells' events are sent too
    id: str = ""
    dropped: int = 0


def _encode(event: Event | ErrorEvent) -> bytes:
    return dumps_utf8(sent(event), compact=True)


def _error_event(exc: GatewayError, ref: Any = None, run_id: str | None = None) -> ErrorEvent:
    retry_after = None if exc.retry_after is None else max(1, math.ceil(exc.retry_after))
    return ErrorEvent(
        type="error",
        ref=ref,
        id=run_id,
        error=ErrorBody(**exc.to_json()["error"]),
        retry_after=retry_after,
    )


def _cell_event(
    run: _Run, event: CellStarted | CellFinished
) -> CellStartedEvent | CellFinishedEvent:
    """A replay's cell starting or finishing, as sent: the run's ref and id, and the
    execution event's own fields (the wire event's names: index, cell_id, ...)."""
    fields = dataclasses.asdict(event)
    if isinstance(event, CellStarted):
        return CellStartedEvent(type="cell_started", ref=run.ref, id=run.id, **fields)
    return CellFinishedEvent(type="cell_finished", ref=run.ref, id=run.id, **fields)


def _run_message(data: dict[str, Any], policy: RequestPolicy, caller: Principal) -> RunRequest:
    """A run message's request: never `background` (its client is this connection, which
    waits for its events: a background run may be carried to another replica's slot)."""
    request = run_request(RunMessage.parse(data), policy, caller)
    return dataclasses.replace(request, background=False) if request.background else request


def _notebook_message(
    data: dict[str, Any], policy: RequestPolicy, caller: Principal
) -> NotebookRequest:
    return notebook_request(NotebookMessage.parse(data), policy, caller)


EVENT_MARGIN = 1024  # room for the event around its record (and notebook)


def _done_event(run: _Run, record: RunRecord, limit: int) -> bytes:
    """The `done` event of a run, its record (and a replay's notebook) cut to `limit` bytes
    in all (CPU work that grows with the record: made in the heavy-work pool)."""
    cut = (
        f"This `done` event was over its limit of {limit} bytes: its largest parts were "
        f"cut. The whole record is at GET /v1/runs/{run.id}."
    )
    if not run.notebook:
        data = bound_json(record.to_json(), limit - EVENT_MARGIN, cut)
        return _encode(DoneEvent(type="done", ref=run.ref, id=run.id, run=data))
    # The notebook holds the record's outputs again: both get half of what the cells
    # without outputs leave, and the notebook is made from the record's cut outputs.
    skeleton = record.notebook
    room = limit - EVENT_MARGIN - (0 if skeleton is None else len(json.dumps(skeleton)))
    if skeleton is None or room < limit // 4:
        data = bound_json(record.to_json(), limit - EVENT_MARGIN, cut)
        data["notes"] = [
            *data["notes"],
            f"The executed notebook was left out of this `done` event: its cells alone are "
            f"over the event's limit of {limit} bytes. It is at GET /v1/runs/{run.id}/notebook.",
        ]
        return _encode(DoneEvent(type="done", ref=run.ref, id=run.id, run=data))
    data = bound_json(record.to_json(), room // 2, cut)
    notebook = record_to_notebook(record.model_copy(update={"outputs": data["outputs"]}))
    return _encode(DoneEvent(type="done", ref=run.ref, id=run.id, run=data, notebook=notebook))


# The handshake is a GET: as on every HTTP endpoint, a body sent with it is refused at the
# headers (`refuse_unasked`), which needs the body streamed rather than read in full first.
@tornado.web.stream_request_body
class StreamHandler(GatewayHandler, tornado.websocket.WebSocketHandler):
    unauthorized_message = (
        "A valid token is required: `?token=<token>` on the handshake, "
        "or an `Authorization: Bearer <token>` header."
    )
    # Tasks that outlive a message: run watchers, cancellations, closing a connection.
    _tasks: ClassVar[set[asyncio.Task[Any]]] = set()

    def initialize(self, services: Services) -> None:
        super().initialize(services)
        self._query_token: str | None = None
        self._runs: dict[str, _Run] = {}  # by run id
        self._refs: dict[str | int, _Run] = {}  # unfinished runs by ref
        self._cancelling: set[str] = set()  # runs this connection is cancelling
        self._connected = False
        self._handling = False  # a message is being handled: it holds its room until done
        self.room: MessageRoom | None = None  # made with the protocol, after the handshake
        self._given: tuple[Hold, int] | None = None  # a handed-over room, and what it keeps
        self._done_lock = asyncio.Lock()  # `done` events are queued one at a time
        self.outbox = Outbox(
            self._send,
            drop_bytes=OUTPUT_QUEUE_BYTES,
            drop_messages=OUTPUT_QUEUE_MESSAGES,
            hold_bytes=HOLD_BYTES,
            on_drained=self._flush_drop_notices,
        )

    # --- handshake --------------------------------------------------------------------

    @property
    def max_message_size(self) -> int:
        return self.config.max_body_bytes

    @property
    def ping_interval(self) -> float:
        return PING_INTERVAL

    @property
    def ping_timeout(self) -> float:
        return PING_INTERVAL

    def prepare(self) -> None:
        self._query_token = self.get_query_argument("token", None)
        self._redact_token()
        self.refuse_foreign()
        self.refuse_unasked()
        self.principal = self.authenticate()
        # Counted here and added in `open`: nothing in between yields to the event loop,
        # so two handshakes of one user cannot both pass the check.
        mine = len(
            [
                stream
                for stream in self.services.open_streams
                if isinstance(stream, StreamHandler) and stream.user.user == self.principal.user
            ]
        )
        if mine >= self.config.max_streams_per_user:
            raise RateLimited(
                f"You already have {mine} WebSocket connections open; the limit is "
                f"{self.config.max_streams_per_user}.",
                retry_after=5,
            )

    def _redact_token(self) -> None:
        """Keep the token out of the access log (which logs the request URI)."""
        if "token" not in self.request.query_arguments:
            return
        pairs = urllib.parse.parse_qsl(self.request.query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(k, "***" if k == "token" else v) for k, v in pairs], safe="*"
        )
        self.request.query = query
        self.request.uri = self.request.path + ("?" + query if query else "")

    def presented_token(self) -> str | None:
        """An `Authorization: Bearer` header's token, else the handshake's `?token=`."""
        header = super().presented_token()
        return self._query_token if header is None else header

    def get_websocket_protocol(self) -> tornado.websocket.WebSocketProtocol | None:
        """tornado's protocol, its incoming messages counted in the bodies budget (the
        caller's share and everyone's total) as they arrive (`gateway.handlers.metered`)."""
        protocol = super().get_websocket_protocol()
        if not isinstance(protocol, tornado.websocket.WebSocketProtocol13):
            return protocol
        metered = MeteredProtocol(self, False, protocol.params)
        metered.room = self.room = MessageRoom(self.services.bodies, self.user.user)
        return metered

    def check_origin(self, origin: str) -> bool:
        """`prepare` already refused foreign origins (`gateway.handlers.origin`)."""
        return origin_allowed(
            origin, self.request.headers.get("Host", ""), self.config.allowed_origins
        )

    # --- connection -------------------------------------------------------------------

    def open(self, *args: str, **kwargs: str) -> None:
        self._connected = True
        self.services.open_streams.add(self)
        self.outbox.start()

    async def _send(self, data: bytes) -> None:
        await self.write_message(data)  # a text frame: `data` is UTF-8 JSON

    def _emit(self, event: Event | ErrorEvent) -> None:
        if self._connected:
            self.outbox.put(_encode(event))

    def on_close(self) -> None:
        self._connected = False
        self.client_left()
        if self.room is not None and not self._handling:
            self.room.release()
        self.services.open_streams.discard(self)
        self._keep(asyncio.ensure_future(self._close_runs()))

    async def _close_runs(self) -> None:
        await self.outbox.close()
        await asyncio.gather(*(self._cancel_run(run_id) for run_id in list(self._runs)))

    async def _cancel_run(self, run_id: str) -> None:
        self._cancelling.add(run_id)
        try:
            await self.services.runs.cancel(run_id, self.user.user, self.user.is_admin)
        except Exception:
            log.exception("could not cancel run %s", run_id)
        finally:
            self._cancelling.discard(run_id)

    # --- incoming ---------------------------------------------------------------------

    async def on_text(self, data: bytes) -> None:
        """A text message as its UTF-8 bytes (`MeteredProtocol`)."""
        await self._receive(data, binary=False)

    async def on_message(self, message: str | bytes) -> None:
        """A binary message, refused (text comes to `on_text`, from `MeteredProtocol`)."""
        if isinstance(message, bytes):
            await self._receive(message, binary=True)
        else:
            await self._receive(message.encode(), binary=False)

    async def _receive(self, data: bytes, binary: bool) -> None:
        """One message, handled before the next is read; its bytes stay counted in the
        bodies budget until then."""
        self._handling = True
        try:
            await self._handle(data, binary)
        finally:
            self._handling = False
            if self._given is not None:  # its run holds on, but tornado lets go of the bytes
                hold, kept = self._given
                hold.shrink_to(kept)
                self._given = None
            if self.room is not None:
                self.room.release()

    async def _handle(self, message: bytes, binary: bool) -> None:
        # Not reading on while answers pile up is the backpressure on a non-reading client.
        await self.outbox.wait_for_room()
        if not self._connected:
            return
        OWNER.set(self.user.user)  # heavy work for this message is its sender's
        ref: Any = None
        run_id: str | None = None
        try:
            if binary:
                raise InvalidRequest("Send JSON messages as text frames, not binary ones.")
            data, shape = await self._parse(message)
            if not isinstance(data, dict):
                raise InvalidRequest("A message must be a JSON object with a `type`.")
            ref = data.get("ref")
            given_id = data.get("id")
            run_id = given_id if isinstance(given_id, str) and _valid_ref(given_id) else None
            kind = data.get("type")
            if kind != "notebook" and shape.values > self.policy.max_json_values:
                raise PayloadTooLarge(
                    f"The message holds more than {self.policy.max_json_values} JSON "
                    "values; only a notebook replay's may hold more."
                )
            if kind == "run":
                await self._start_run(data, shape)
            elif kind == "notebook":
                await self._start_notebook(data, shape)
            elif kind == "cancel":
                await self._cancel(data)
            else:
                raise InvalidRequest(
                    f"Unknown message type {kind!r}; send `run`, `notebook` or `cancel`.",
                    field="type",
                )
        except GatewayError as exc:
            self._emit(_error_event(exc, ref if _valid_ref(ref) else None, run_id))
        except Exception:
            log.exception("stream message failed")
            self._emit(
                _error_event(
                    GatewayError("The gateway failed to handle this message; it was logged."),
                    ref if _valid_ref(ref) else None,
                )
            )

    async def _parse(self, message: bytes) -> tuple[Any, JsonShape]:
        """A message decoded within its limits (a notebook's when it may be one), its room
        in the bodies budget grown by what the parse makes before it is parsed: the text
        and the objects, beside the bytes tornado keeps until the message is handled."""
        notebook = _NOTEBOOK_TYPE.search(message) is not None
        limits = self.policy.json_limits(notebook=notebook)
        what = "The message"
        shape = await self.heavy(len(message) <= SMALL, scan, message, limits, what)
        self._take_room(shape.parsed_bytes(bytes_kept=True))
        document = Document(message)  # decoded as strictly as a request body
        data = await self.heavy(shape.small, parse_json, document, limits, what, shape)
        if self.room is not None:  # parsed: down to what the parsed value keeps, and the bytes
            self.room.shrink_to(shape.kept_bytes() + shape.nbytes)
        return data, shape

    def _take_room(self, nbytes: int) -> None:
        if self.room is not None and not self.room.take(nbytes):
            bodies = self.services.bodies
            raise Overloaded(
                f"The gateway is receiving as many messages as it may hold ({bodies.used} "
                f"bytes in flight, {bodies.held_by(self.user.user)} of them yours); try "
                "again shortly.",
                retry_after=BUSY_RETRY_AFTER,
            )

    def _new_ref(self, data: dict[str, Any]) -> Any:
        ref = data.get("ref")
        if not _valid_ref(ref):
            raise InvalidRequest(
                f"`ref` must be a string of at most {MAX_REF_CHARS} characters or an integer.",
                field="ref",
            )
        if ref is not None and ref in self._refs:
            raise InvalidRequest(f"A run with ref {ref!r} is still in progress.", field="ref")
        return ref

    async def _start_run(self, data: dict[str, Any], shape: JsonShape) -> None:
        ref = self._new_ref(data)
        request = await self.heavy(shape.small, _run_message, data, self.policy, self.user)
        held = self._hand_over(shape)
        await self._begin(_Run(ref=ref), self.services.runs.submit(request, held))

    async def _start_notebook(self, data: dict[str, Any], shape: JsonShape) -> None:
        """A replay, admitted as POST /v1/notebooks/run admits it (nbformat's validation
        is CPU work that grows with the notebook: in the heavy-work pool)."""
        ref = self._new_ref(data)
        text = notebook_text(data)
        if text is not None:  # sent as its JSON text: room for what parsing that makes too
            limits = self.policy.json_limits(notebook=True)
            inner = await self.heavy(len(text) <= SMALL, scan_text, text, limits)
            self._take_room(inner.parsed_bytes())
        request = await self.heavy(False, _notebook_message, data, self.policy, self.user)
        run = _Run(ref=ref, notebook=True)
        held = self._hand_over(shape)
        await self._begin(run, self.services.runs.submit_notebook(request, held))

    def _hand_over(self, shape: JsonShape) -> Hold | None:
        """The message's room, for its run to hold: what its parsed value keeps, and its
        bytes until the message has been handled (then tornado lets go of them)."""
        if self.room is None:
            return None
        self.room.shrink_to(shape.kept_bytes() + shape.nbytes)
        hold = self.room.hand_over()
        if hold is not None:
            self._given = (hold, shape.kept_bytes())
        return hold

    async def _begin(self, run: _Run, submitting: Awaitable[ActiveRun]) -> None:
        ref = run.ref
        active = await submitting
        active.events.subscribe(functools.partial(self._on_event, run))
        # No await between submit and here: the run's task has not started yet, so the
        # `accepted` event is queued before any output of it.
        run.id = active.record.id
        self._runs[run.id] = run
        if ref is not None:
            self._refs[ref] = run
        self._emit(AcceptedEvent(type="accepted", ref=ref, id=run.id))
        self._keep(asyncio.create_task(self._watch(run, active)))
        if not self._connected:  # closed while the run was being admitted
            self._keep(asyncio.create_task(self._cancel_run(run.id)))

    async def _watch(self, run: _Run, active: ActiveRun) -> None:
        """Send the `done` event when the run has its final record.

        `done` events must arrive, so they are never dropped; what bounds them is that each
        is at most `max_event_bytes` (a larger record is cut, the whole one is at GET
        /v1/runs/{id}) and that they are queued one at a time, only while less than the
        outbox's `hold_bytes` waits: a client that reads nothing holds them back here."""
        assert active.task is not None
        record = active.record
        with contextlib.suppress(asyncio.CancelledError):
            record = await asyncio.shield(active.task)
        event = await offload(_done_event, run, record, self.config.max_event_bytes)
        self._runs.pop(run.id, None)
        if run.ref is not None:
            self._refs.pop(run.ref, None)
        async with self._done_lock:
            await self.outbox.wait_for_room()
            self._flush_drop_notice(run)
            if self._connected:
                self.outbox.put(event)

    async def _cancel(self, data: dict[str, Any]) -> None:
        run_id = data.get("id")
        if run_id is None and _valid_ref(data.get("ref")) and data.get("ref") in self._refs:
            run_id = self._refs[data["ref"]].id
        if not isinstance(run_id, str) or not run_id:
            raise InvalidRequest("`cancel` needs the run's `id` (or this connection's `ref`).")
        # Ownership is checked now (NotFound becomes an error event); the run ends on its
        # own time and its `done` event follows.
        await self.services.runs.get(run_id, self.user.user, self.user.is_admin)
        if run_id not in self._cancelling:  # one cancel per run: a repeat adds no work
            self._keep(asyncio.create_task(self._cancel_run(run_id)))

    @classmethod
    def _keep(cls, task: asyncio.Task[Any]) -> None:
        """Hold a reference to a task until it is done (the loop keeps only weak ones)."""
        cls._tasks.add(task)
        task.add_done_callback(cls._tasks.discard)

    # --- outgoing outputs -------------------------------------------------------------

    def _on_event(self, run: _Run, event: RunEvent) -> None:
        """What the run did (`gateway.execution.events`), on the event loop as it happens:
        its outputs are sent live, and a replay's cells starting and finishing."""
        if not self._connected:
            return
        if self.outbox.full:
            run.dropped += 1
            return
        if isinstance(event, CellOutput):
            display_id = event.display_id
            self._offer(
                run,
                OutputEvent(
                    type="output",
                    ref=run.ref,
                    id=run.id,
                    output=event.output,
                    display_id=display_id,
                    update=True if display_id is not None and event.replaces else None,
                    index=event.index if run.notebook else None,
                ),
            )
        elif run.notebook and isinstance(event, CellStarted | CellFinished):
            self._offer(run, _cell_event(run, event))

    def _offer(self, run: _Run, event: Event) -> None:
        """Queue a live event, or count it dropped (too large, or too much unread)."""
        self._flush_drop_notice(run)
        data = _encode(event)
        if len(data) > self.config.max_event_bytes or not self.outbox.offer(data):
            run.dropped += 1

    def _flush_drop_notice(self, run: _Run) -> None:
        if run.dropped:
            dropped, run.dropped = run.dropped, 0
            self._emit(
                OutputDroppedEvent(type="output_dropped", ref=run.ref, id=run.id, dropped=dropped)
            )

    def _flush_drop_notices(self) -> None:
        for run in self._runs.values():
            self._flush_drop_notice(run)


def _valid_ref(ref: Any) -> bool:
    if ref is None or (isinstance(ref, int) and not isinstance(ref, bool)):
        return True
    return isinstance(ref, str) and len(ref) <= MAX_REF_CHARS


__all__ = ["StreamHandler"]
