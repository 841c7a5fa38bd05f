"""What every handler shares: services from the route table, auth, JSON in and out, and
the one place where errors become the API's error shape."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import tornado.web
import tornado.websocket
from tornado.http1connection import HTTP1Connection

from gateway.auth import Principal, TokenTable, is_loopback_host
from gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from gateway.metrics import Metrics
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


@tornado.web.stream_request_body
class BaseHandler(tornado.web.RequestHandler):
    public = False  # True: no token needed
    body_limit: int | None = None  # None: settings.max_body_bytes

    def initialize(self, services: Services) -> None:
        self.services = services
        self.settings_ = services.settings
        self.principal: Principal | None = None
        self._body = bytearray()
        self._body_too_large = False

    # --- request ----------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self.body_limit or self.settings_.max_body_bytes

    def prepare(self) -> None:
        if not self.services.tokens.enabled and not is_loopback_host(self.request.host):
            # single-user mode answers only to loopback names: a DNS-rebound web page
            # (evil.example -> 127.0.0.1) must not be able to run code as the local user
            raise Forbidden("Without tokens this gateway answers only on a loopback address.")
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

    def authenticate(self) -> Principal:
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else None
        principal = self.services.tokens.authenticate(presented)
        if principal is None:
            raise Unauthorized("A valid `Authorization: Bearer <token>` header is required.")
        return principal

    @property
    def user(self) -> Principal:
        assert self.principal is not None
        return self.principal

    def json_body(self) -> Any:
        content_type = self.request.headers.get("Content-Type", "application/json")
        media = content_type.split(";")[0].strip().lower()
        # curl -d sends application/x-www-form-urlencoded unless told otherwise: accept it
        # as JSON, like the tools we replace do; anything else is refused.
        lenient = ("application/json", "", "application/x-www-form-urlencoded", "text/json")
        if media not in lenient and not media.endswith("+json"):
            raise UnsupportedMediaType(f"Send JSON (application/json), not {media}.")
        body = self.body
        if not body.strip():
            raise InvalidRequest("The request body is empty; send a JSON object.")
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from exc

    # --- response ---------------------------------------------------------------------

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    def send_json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(payload, ensure_ascii=False))

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


class NotFoundHandler(BaseHandler):
    public = True

    def prepare(self) -> None:
        raise tornado.web.HTTPError(404, "There is nothing at this address.")
