"""What every handler shares: services from the route table, auth, JSON in and out, and
the one place where errors become the API's error shape."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import tornado.web
import tornado.websocket
from tornado.concurrent import Future
from tornado.http1connection import HTTP1Connection
from tornado.httputil import HTTPHeaders
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError

from gateway.auth import Principal, TokenTable
from gateway.budget import ByteBudget, Hold
from gateway.errors import (
    ClientGone,
    GatewayError,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    SnapshotElsewhere,
    Unauthorized,
    UnsupportedMediaType,
)
from gateway.handlers.config import FrontDoorConfig
from gateway.handlers.encode import (
    GZIP_MIN_BYTES,
    Encoded,
    accepts_gzip,
    compress,
    compressible,
    encode,
    json_size,
)
from gateway.handlers.loads import RecentSizes, Turns
from gateway.handlers.origin import refuse_foreign
from gateway.jsoncodec import Document, JsonLimits, JsonShape, parse_json, scan
from gateway.metrics import Metrics
from gateway.models.base import sent
from gateway.offload import OWNER, SMALL, offload
from gateway.runs.config import RequestPolicy
from gateway.runs.service import RunService
from gateway.sandbox.base import SandboxBackend
from gateway.uploads.service import UploadService

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

JSON_TYPE = "application/json; charset=utf-8"
# Answers up to this size are not counted in the answers budget (health, errors, a small
# record): at most `max_connections` of them are in flight, and none waits for room.
UNCOUNTED_ANSWER_BYTES = 64 * 1024
BUSY_RETRY_AFTER = 2.0  # seconds, when a body or an answer finds no room

_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


@dataclasses.dataclass
class Services:
    """Everything handlers may use, passed through `initialize(services=...)`."""

    config: FrontDoorConfig
    runs: RunService
    tokens: TokenTable
    backend: SandboxBackend
    metrics: Metrics
    uploads: UploadService | None = None
    # open WebSocket connections, closed by `Gateway.stop` after the drain
    open_streams: set[tornado.websocket.WebSocketHandler] = dataclasses.field(default_factory=set)
    # bytes held for clients, by user: request bodies and WebSocket messages being received,
    # and large answers being sent (see the settings of the same names)
    bodies: ByteBudget = dataclasses.field(init=False)
    answers: ByteBudget = dataclasses.field(init=False)
    # answers loaded before their size is known (`gateway.handlers.loads`)
    answer_turns: Turns = dataclasses.field(default_factory=Turns)
    answer_sizes: RecentSizes = dataclasses.field(default_factory=RecentSizes)

    def __post_init__(self) -> None:
        config = self.config
        self.bodies = ByteBudget(
            "request bodies",
            config.max_body_bytes_in_flight,
            config.max_body_bytes_in_flight_per_user,
        )
        self.answers = ByteBudget(
            "answers",
            config.max_answer_bytes_in_flight,
            config.max_answer_bytes_in_flight_per_user,
        )


class GatewayHandler(tornado.web.RequestHandler):
    """What the HTTP handlers and the WebSocket handler share: services from the route
    table, the refusal of foreign requests, bearer-token auth, security headers, and the one
    place where an error becomes the API's error shape."""

    navigation_ok = False  # True: a cross-site top-level navigation may GET this (the page)
    unauthorized_message = "A valid `Authorization: Bearer <token>` header is required."

    def initialize(self, services: Services) -> None:
        self.services = services
        self.config = services.config
        self.policy: RequestPolicy = services.config.policy  # what parsed bodies are put under
        self.principal: Principal | None = None
        self._gone = False  # the client went away
        self._heavy_task: asyncio.Future[Any] | None = None  # heavy work under way for it

    # --- request ----------------------------------------------------------------------

    def refuse_foreign(self) -> None:
        """403 for a cross-site request, or one to a non-loopback name without tokens."""
        refuse_foreign(
            self.request,
            single_user=not self.services.tokens.enabled,
            allowed_origins=self.config.allowed_origins,
            navigation_ok=self.navigation_ok and self.request.method in ("GET", "HEAD"),
        )

    def presented_token(self) -> str | None:
        """The token of an `Authorization: Bearer <token>` header; None without one."""
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def authenticate(self) -> Principal:
        """The caller, from their token (401 without a valid one); heavy work done for this
        request from here on is theirs (`gateway.offload.OWNER`), and so is the work of the
        tasks it starts, its run's among them."""
        principal = self.services.tokens.authenticate(self.presented_token())
        if principal is None:
            raise Unauthorized(self.unauthorized_message)
        OWNER.set(principal.user)
        return principal

    def refuse_unasked(self) -> None:
        """Refuse, at the headers, a method this address does not serve (405) and a body
        sent with a method that takes none (413): nothing of it is read, and the connection
        is closed after the answer (tornado diverts an unread body away from the handler and
        closes once the answer is written)."""
        if self.request.method not in self.allowed_methods():
            raise tornado.web.HTTPError(405)
        if self.request.method != "POST" and announces_body(self.request.headers):
            raise PayloadTooLarge(
                f"{self.request.method} {self.request.path} takes no request body; send "
                "the request without one."
            )

    @property
    def user(self) -> Principal:
        assert self.principal is not None
        return self.principal

    @property
    def budget_key(self) -> str | None:
        """Whose bytes these are, in the bodies and answers budgets: the caller's user."""
        return None if self.principal is None else self.principal.user

    # --- work -------------------------------------------------------------------------

    async def heavy(
        self, inline: bool, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`function(*args, **kwargs)` for this request: here when `inline`, else in the
        heavy-work pool (`gateway.offload`), in the caller's turn. If the client goes away
        meanwhile, the work is given up while it waits (a running piece is waited for:
        what it holds stays counted until it ends) and the handler ends (ClientGone)."""
        if inline:
            return function(*args, **kwargs)
        if self._gone:
            raise ClientGone("The client went away.")
        task = asyncio.ensure_future(offload(function, *args, **kwargs))
        self._heavy_task = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._gone and (current is None or not current.cancelling()):
                raise ClientGone("The client went away.") from None
            raise
        finally:
            self._heavy_task = None
            del task, args, kwargs  # not kept by a traceback's frames (`HeavyWork.run`)

    def client_left(self) -> None:
        """The client went away: heavy work still queued for it is given up."""
        self._gone = True
        if self._heavy_task is not None:
            self._heavy_task.cancel()

    # --- response ---------------------------------------------------------------------

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, GatewayError):
            self.set_status(exc.status)
            if exc.retry_after is not None:
                self.set_header("Retry-After", str(int(exc.retry_after + 0.999)))
            if exc.status == 401:
                self.set_header("WWW-Authenticate", 'Bearer realm="gateway"')
            if isinstance(exc, SnapshotElsewhere):  # for a load balancer that reads answers
                self.set_header("X-Gateway-Instance", exc.instance)
            self.finish(json.dumps(exc.to_json()))
            return
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        code = _HTTP_CODES.get(status_code, "internal")
        if isinstance(exc, tornado.web.HTTPError) and status_code < 500:
            message = exc.log_message or self._reason
        elif status_code < 500:
            message = self._reason
        else:
            code, message = "internal", "The gateway failed to handle this request; it was logged."
        self.finish(json.dumps({"error": {"code": code, "message": message}}))

    def allowed_methods(self) -> list[str]:
        """The HTTP methods this handler implements (for 405's Allow header)."""
        base = tornado.web.RequestHandler
        names = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
        return [m for m in names if getattr(type(self), m.lower()) is not getattr(base, m.lower())]

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, GatewayError):  # reported on purpose: no traceback
            if value.status >= 500:
                log.warning("%s %s: %s", self.request.method, self.request.path, value.message)
            return
        super().log_exception(typ, value, tb)


@tornado.web.stream_request_body
class BaseHandler(GatewayHandler):
    """An HTTP handler: its body read as it streams in, within a limit and the bodies
    budget; JSON in and out, large answers within the answers budget.

    A body is admitted at the headers, before a byte of it is read: refused when the
    method takes none (`refuse_unasked`), when the caller has no valid token, when its
    announced length is over the limit, or when the bodies in flight (of everyone, and of
    this user) leave no room for it (503). A JSON body's room then grows by what parsing
    it will make (`jsoncodec.scan`, before it is parsed; 503 when there is none) and shrinks
    to what the parsed body keeps. The room is held until the request is answered, or,
    once the body is being worked on, until that work has stopped: a client that hangs up
    mid-way gives its room back only when the parse (or the run) it started has ended, and
    heavy work still queued for it is given up (`heavy`)."""

    public = False  # True: no token needed
    body_limit: int | None = None  # None: max_body_bytes
    notebook_body = False  # True: the body is a notebook replay's (its JSON limits)

    def initialize(self, services: Services) -> None:
        super().initialize(services)
        self._body: bytearray | bytes = bytearray()
        self.body_size = 0  # bytes of body received
        self._body_too_large = False
        self._body_hold: Hold | None = None
        self._answer_hold: Hold | None = None
        self._encoded = False  # the answer was made by `encode` (`send_parts`)
        self._working = False  # the body is being worked on: its room outlives a hang-up
        self.body_shape: JsonShape | None = None  # what the JSON body held, once parsed

    # --- request ----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self.body_limit or self.config.max_body_bytes

    def prepare(self) -> None:
        self.refuse_foreign()
        self.refuse_unasked()
        if not self.public:
            self.principal = self.authenticate()
        self.admit_body()

    def admit_body(self) -> None:
        """Refuse a body over the limit, and take room for it from the bodies budget: all
        its announced length at once, or chunk by chunk as a chunked body arrives."""
        headers = self.request.headers
        length = headers.get("Content-Length", "").strip()
        announced = int(length) if length.isdigit() else None
        if announced is not None and announced > self.limit:
            raise PayloadTooLarge(f"The request body is larger than {self.limit} bytes.")
        if isinstance(self.request.connection, HTTP1Connection):
            self.request.connection.set_max_body_size(self.limit * 4)
        if announced or "Transfer-Encoding" in headers:
            self._body_hold = self.services.bodies.try_take(announced or 0, self.budget_key)
            if self._body_hold is None:
                raise self._no_room_for_body()

    def _no_room_for_body(self) -> Overloaded:
        bodies = self.services.bodies
        return Overloaded(
            f"The gateway is receiving as many request bodies as it may hold "
            f"({bodies.used} bytes in flight, {bodies.held_by(self.budget_key)} of them "
            f"yours); try again shortly.",
            retry_after=BUSY_RETRY_AFTER,
        )

    def data_received(self, chunk: bytes) -> None:
        if self._body_too_large or self._finished:
            return
        received = self.body_size + len(chunk)
        if received > self.limit:  # a chunked body (a longer one was refused at once)
            self._body_too_large = True
            self._body = bytearray()
            self._release_body()
            return
        hold = self._body_hold
        if hold is not None and received > hold.nbytes and not hold.grow(received - hold.nbytes):
            exc = self._no_room_for_body()
            self.send_error(exc.status, exc_info=(type(exc), exc, None))
            return
        assert isinstance(self._body, bytearray)
        self._body += chunk
        self.body_size = received

    @property
    def body(self) -> bytes:
        body = self._received()
        if isinstance(body, bytearray):
            self._body = body = bytes(body)
        return body

    def _received(self) -> bytearray | bytes:
        """The body as received (not copied); 413 when it was over the limit."""
        if self._body_too_large:
            raise PayloadTooLarge(f"The request body is larger than {self.limit} bytes.")
        return self._body

    def json_limits(self) -> JsonLimits:
        return self.policy.json_limits(notebook=self.notebook_body)

    async def json_body(self) -> Any:
        """The body as JSON, within the endpoint's `json_limits` (413 past them), its room
        grown by what the parse makes before it is parsed, and parsed in the heavy-work
        pool unless it is `small`. Only JSON media types are read: `application/json` and
        `application/<x>+json` (e.g. `application/x-ipynb+json`). A web page can send a
        form's types (`application/x-www-form-urlencoded`, `multipart/form-data`,
        `text/plain`) or none to any site without asking, never these."""
        content_type = self.request.headers.get("Content-Type", "")
        media = content_type.split(";")[0].strip().lower()
        if not is_json_media_type(media):
            shown = media or "no Content-Type"
            raise UnsupportedMediaType(
                f"Send JSON with `Content-Type: application/json`, not {shown}."
            )
        # (the body is named by no local: a refusal's traceback would keep it alive)
        size = len(self._received())
        if not size or self._received().isspace():
            raise InvalidRequest("The request body is empty; send a JSON object.")
        self._working = True
        limits, what = self.json_limits(), "The request body"
        shape = await self.heavy(size <= SMALL, scan, self._received(), limits, what)
        self.take_room(shape.parsed_bytes())
        # handed over: the parse lets go of the bytes once they are decoded
        document, self._body = Document(self._received()), b""
        value = await self.heavy(shape.small, parse_json, document, limits, what, shape)
        self.body_shape = shape
        self.keep_room()
        return value

    def take_room(self, nbytes: int) -> None:
        """`nbytes` more room for this request's body (what parsing it will make); 503 when
        the bodies budget has none."""
        hold = self._body_hold
        if hold is None or hold.released:
            self._body_hold = hold = self.services.bodies.try_take(0, self.budget_key)
        if hold is None or not hold.grow(nbytes):
            raise self._no_room_for_body()

    @property
    def small_body(self) -> bool:
        """The parsed body is small enough to turn into a request on the event loop."""
        return self.body_shape is not None and self.body_shape.small

    def keep_room(self) -> None:
        """The body's room, down to what its parsed value holds (its bytes are gone)."""
        if self._body_hold is not None and self.body_shape is not None:
            self._body_hold.shrink_to(self.body_shape.kept_bytes())

    def _release_body(self) -> None:
        if self._body_hold is not None:
            self._body_hold.release()

    def hand_over_body(self) -> Hold | None:
        """The body's room in the bodies budget, now the caller's to release: a run keeps
        it until it ends, since the gateway holds what the body asked to run (its files,
        its code) that long, also after a background run's 202."""
        hold, self._body_hold = self._body_hold, None
        return hold

    def on_finish(self) -> None:
        self._body = b""
        self._release_body()

    def on_connection_close(self) -> None:
        """The client went away: heavy work queued for it is given up. Its room is given
        back now only if nothing has started on its body (it may not even have arrived
        whole); else when the work has stopped (`on_finish`), and an answer's when every
        byte of it is on the socket or dropped (`finish`)."""
        self.client_left()
        self._body = b""
        if not self._working:
            self._release_body()
        super().on_connection_close()

    # --- response ---------------------------------------------------------------------

    async def send_json(
        self, payload: Any, status: int = 200, *, content_type: str = JSON_TYPE
    ) -> None:
        """Answer `payload`: plain JSON, or one of the models in gateway.models (sent as
        `sent` says). A large answer waits for room in the answers budget (holding
        `payload` meanwhile) and is encoded in the heavy-work pool."""
        value = sent(payload)
        size = await json_size(value)
        if not self._take_answer_room(size):
            await self._wait_for_answer_room(size)
        await self._answer(value, size, status, content_type)

    async def send_loaded(
        self, load: Callable[[], Awaitable[Any]], *, content_type: str = JSON_TYPE
    ) -> None:
        """Answer what `load()` gives (200), as `send_json` does, for an answer that may be
        large and can be loaded again (a stored record): see `gateway.handlers.loads`. A
        user's loads take turns; a path whose last answer was large waits for room before
        it loads, and an answer that finds no room lets go of what it loaded while it waits,
        then loads it again."""
        turns, sizes = self.services.answer_turns, self.services.answer_sizes
        key = (self.budget_key, self.request.path)
        admitted = False
        while True:
            async with turns.turn(self.budget_key):
                known = sizes.get(key)
                if admitted or known is None or self._take_answer_room(known):
                    value = sent(await load())
                    size = await json_size(value)
                    sizes.put(key, size)
                    if admitted or known is not None:
                        self._fit_answer_room(size)
                        break
                    if self._take_answer_room(size):
                        break
                    value, known = None, size
            await self._wait_for_answer_room(known)
            if self._gone:
                return
            admitted = True
        await self._answer(value, size, 200, content_type)

    def _take_answer_room(self, size: int) -> bool:
        """Room for an answer of about `size` bytes now; True also when it needs none."""
        if size <= UNCOUNTED_ANSWER_BYTES:
            return True
        self._answer_hold = self.services.answers.try_take(size, self.budget_key)
        return self._answer_hold is not None

    def _fit_answer_room(self, size: int) -> None:
        """Make the answer's room `size` bytes when it was taken for less (an estimate):
        best effort, an answer already admitted is not refused."""
        hold = self._answer_hold
        if hold is not None and not hold.released and size > hold.nbytes:
            hold.grow(size - hold.nbytes)
        elif hold is None and size > UNCOUNTED_ANSWER_BYTES:
            self._take_answer_room(size)

    async def _answer(self, value: Any, size: int, status: int, content_type: str) -> None:
        if self._gone:
            return
        self.set_header("Content-Type", content_type)
        use_gzip = accepts_gzip(self.request) and compressible(content_type)
        self._working = True
        encoded = await self.heavy(size <= SMALL, encode, value, use_gzip)
        del value
        self._fit_answer_room(encoded.size)
        self.set_status(status)
        self.send_parts(encoded)

    async def _wait_for_answer_room(self, size: int) -> None:
        """Wait (up to `write_timeout`) for room for an answer of `size` bytes; given back
        at once if the client went away meanwhile."""
        answers = self.services.answers
        try:
            hold = await answers.take(size, self.budget_key, self.config.write_timeout)
        except TimeoutError as exc:
            raise Overloaded(
                f"The gateway is sending as many large answers as it may hold "
                f"({answers.used} bytes in flight, {answers.held_by(self.budget_key)} of "
                f"them to you); try again shortly.",
                retry_after=BUSY_RETRY_AFTER,
            ) from exc
        self._answer_hold = hold
        if self._gone:
            hold.release()

    def send_parts(self, encoded: Encoded) -> None:
        """Finish with an answer made by `encode`. A large one is handed to the socket part
        by part as it is: tornado would join a body to the headers (a copy of it), so the
        headers go first and the parts after them (the stream keeps a view of each)."""
        self._encoded = True
        if encoded.gzipped:
            self.set_header("Content-Encoding", "gzip")
        self.set_header("Vary", "Accept-Encoding")
        if encoded.size <= SMALL:
            self.finish(b"".join(encoded.parts))
            return
        self.set_header("Content-Length", encoded.size)
        self.flush()
        connection = self.request.connection
        if connection is not None and self.request.method != "HEAD":
            for part in encoded.parts:
                connection.write(part)
        self.finish()

    def _compressed(self, chunk: str | bytes) -> bytes:
        """A small answer's bytes, compressed when the client takes gzip (every other
        answer comes through `send_bytes`, made in `encode`)."""
        data = chunk.encode("utf-8") if isinstance(chunk, str) else chunk
        content_type = self._headers.get("Content-Type", "")
        if not compressible(content_type) or "Content-Encoding" in self._headers:
            return data
        self.set_header("Vary", "Accept-Encoding")
        if len(data) < GZIP_MIN_BYTES or not accepts_gzip(self.request):
            return data
        self.set_header("Content-Encoding", "gzip")
        return compress(data)

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Future[None]:
        """Finish the answer; a client that has not taken all of it `write_timeout` seconds
        later loses its connection (else it could hold the answer in memory forever). The
        answer's room in the answers budget is given back once it is taken or dropped."""
        if isinstance(chunk, str | bytes) and not self._encoded and not self._headers_written:
            chunk = self._compressed(chunk)
        connection = self.request.connection
        stream = connection.stream if isinstance(connection, HTTP1Connection) else None
        written = super().finish(chunk)
        taken = _all_written(stream)
        hold = self._answer_hold
        if hold is not None:
            taken.add_done_callback(lambda _: hold.release())
        if not taken.done():
            loop = IOLoop.current()
            timer = loop.call_later(self.config.write_timeout, self._drop_unread, taken)
            taken.add_done_callback(lambda _: loop.remove_timeout(timer))
        return written

    def _drop_unread(self, written: Future[None]) -> None:
        if written.done():
            return
        log.info(
            "closing the connection of %s: the answer to %s %s was not taken in %g s",
            self.request.remote_ip,
            self.request.method,
            self.request.path,
            self.config.write_timeout,
        )
        connection = self.request.connection
        if isinstance(connection, HTTP1Connection):
            connection.close()


def _all_written(stream: IOStream | None) -> Future[None]:
    """Done when every byte queued on `stream` so far has gone to the socket, or the stream
    is closed. (Not the future of `finish`: the connection resolves that one when any of
    several writes completes, and forgets it when it is closed.)"""
    if stream is not None and not stream.closed():
        with contextlib.suppress(StreamClosedError):
            return stream.write(b"")
    done: Future[None] = Future()
    done.set_result(None)
    return done


def announces_body(headers: HTTPHeaders) -> bool:
    """Whether a request comes with a body (a length other than 0, or chunks)."""
    length = headers.get("Content-Length")
    if length is not None:
        return length.strip() != "0"
    return "Transfer-Encoding" in headers


def is_json_media_type(media: str) -> bool:
    """`application/json` or a structured `application/<x>+json` type."""
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class NotFoundHandler(BaseHandler):
    public = True

    def prepare(self) -> None:
        raise tornado.web.HTTPError(404, "There is nothing at this address.")
