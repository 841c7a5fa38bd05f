"""What every handler shares: services from the route table, auth, JSON in and out, and
the one place where errors become the API's error shape."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import tornado.web
import tornado.websocket
from tornado.concurrent import Future
from tornado.http1connection import HTTP1Connection
from tornado.ioloop import IOLoop

from gateway.auth import Principal, TokenTable
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from gateway.handlers.origin import refuse_foreign
from gateway.jsoncodec import dumps_utf8, parse_json
from gateway.metrics import Metrics
from gateway.models.base import sent
from gateway.runs.service import RunService
from gateway.sandbox.base import SandboxBackend
from gateway.settings import Settings
from gateway.uploads.store import UploadStore

log = logging.getLogger(__name__)

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

    settings: Settings
    runs: RunService
    tokens: TokenTable
    backend: SandboxBackend
    metrics: Metrics
    uploads: UploadStore | None = None
    # open WebSocket connections, closed by `Gateway.stop` after the drain
    open_streams: set[tornado.websocket.WebSocketHandler] = dataclasses.field(default_factory=set)


class GatewayHandler(tornado.web.RequestHandler):
    """What the HTTP handlers and the WebSocket handler share: services from the route
    table, the refusal of foreign requests, bearer-token auth, security headers, and the one
    place where an error becomes the API's error shape."""

    navigation_ok = False  # True: a cross-site top-level navigation may GET this (the page)
    unauthorized_message = "A valid `Authorization: Bearer <token>` header is required."

    def initialize(self, services: Services) -> None:
        self.services = services
        self.settings_ = services.settings
        self.principal: Principal | None = None

    # --- request ----------------------------------------------------------------------

    def refuse_foreign(self) -> None:
        """403 for a cross-site request, or one to a non-loopback name without tokens."""
        refuse_foreign(
            self.request,
            single_user=not self.services.tokens.enabled,
            allowed_origins=self.settings_.allowed_origins,
            navigation_ok=self.navigation_ok and self.request.method in ("GET", "HEAD"),
        )

    def presented_token(self) -> str | None:
        """The token of an `Authorization: Bearer <token>` header; None without one."""
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def authenticate(self) -> Principal:
        principal = self.services.tokens.authenticate(self.presented_token())
        if principal is None:
            raise Unauthorized(self.unauthorized_message)
        return principal

    @property
    def user(self) -> Principal:
        assert self.principal is not None
        return self.principal

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
    """An HTTP handler: its body read as it streams in, within a limit; JSON in and out."""

    public = False  # True: no token needed
    body_limit: int | None = None  # None: settings.max_body_bytes

    def initialize(self, services: Services) -> None:
        super().initialize(services)
        self._body = bytearray()
        self._body_too_large = False

    # --- request ----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self.body_limit or self.settings_.max_body_bytes

    def prepare(self) -> None:
        self.refuse_foreign()
        if not self.public:
            self.principal = self.authenticate()
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            raise PayloadTooLarge(f"The request body is larger than {self.limit} bytes.")
        if isinstance(self.request.connection, HTTP1Connection):
            self.request.connection.set_max_body_size(self.limit * 4)

    def data_received(self, chunk: bytes) -> None:
        if len(self._body) + len(chunk) > self.limit:
            self._body_too_large = True
            self._body.clear()
        elif not self._body_too_large:
            self._body += chunk

    @property
    def body(self) -> bytes:
        if self._body_too_large:
            raise PayloadTooLarge(f"The request body is larger than {self.limit} bytes.")
        return bytes(self._body)

    def json_body(self) -> Any:
        """The body as JSON. Only JSON media types are read: `application/json` and
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
        body = self.body
        if not body.strip():
            raise InvalidRequest("The request body is empty; send a JSON object.")
        return parse_json(body, self.settings_.max_json_depth)

    # --- response ---------------------------------------------------------------------

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Future[None]:
        """Finish the answer; a client that has not taken all of it `write_timeout` seconds
        later loses its connection (else it could hold the answer in memory forever)."""
        written = super().finish(chunk)
        if not written.done():
            loop = IOLoop.current()
            timer = loop.call_later(self.settings_.write_timeout, self._drop_unread, written)
            written.add_done_callback(lambda _: loop.remove_timeout(timer))
        return written

    def _drop_unread(self, written: Future[None]) -> None:
        if written.done():
            return
        log.info(
            "closing the connection of %s: the answer to %s %s was not taken in %g s",
            self.request.remote_ip,
            self.request.method,
            self.request.path,
            self.settings_.write_timeout,
        )
        connection = self.request.connection
        if isinstance(connection, HTTP1Connection):
            connection.close()

    def send_json(self, payload: Any, status: int = 200) -> None:
        """`payload`: plain JSON, or one of the models in gateway.models (sent as `sent`
        says)."""
        self.set_status(status)
        self.finish(dumps_utf8(sent(payload)))


def is_json_media_type(media: str) -> bool:
    """`application/json` or a structured `application/<x>+json` type."""
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class NotFoundHandler(BaseHandler):
    public = True

    def prepare(self) -> None:
        raise tornado.web.HTTPError(404, "There is nothing at this address.")
