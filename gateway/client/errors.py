"""What the client raises: the gateway's error answers as a small exception tree, and the
one place where an answer (or no answer) becomes one of them.

    GatewayError                  every error of the client; `status`, `code`, `message`,
     |                            `field`, `retry_after`
     +-- InvalidRequest     400   invalid_request, unsupported_language, invalid_path,
     |                            conflicting_fields, archive_*: `field` names the culprit
     +-- Unauthorized       401   no token, or a wrong one
     +-- Forbidden          403   forbidden, archive_mode_disabled
     +-- NotFound           404   not_found (an unknown or expired run or upload)
     +-- PayloadTooLarge    413   payload_too_large
     +-- RateLimited        429   capacity: `retry_after` seconds from `Retry-After`
     +-- Unavailable        503   capacity, sandbox_unavailable, store_unavailable;
     |                            `retry_after` when the gateway said
     +-- ServerError        5xx   internal (a bug of the gateway; it logged it)
     +-- Unreachable         -    no answer: refused, reset, timed out (`status` 0)
     +-- UnexpectedAnswer    -    an answer that is not the API's (a proxy's HTML page, a
                                  body that does not fit the model)

Any other status (405, 415, ...) is a plain `GatewayError`. The HTTP answers, the
WebSocket handshake and the WebSocket's `error` events are translated by the functions
below; the transport libraries' own exceptions are translated where they are caught
(`raise Unreachable(...) from exc`), so none of them escapes the client.
"""

from __future__ import annotations

import datetime as dt
import email.utils

import pydantic

from gateway.models.answers import Error, ErrorBody
from gateway.models.stream import ErrorEvent


class GatewayError(Exception):
    """An error answer of the gateway, or none at all. Branch on the class or on `code`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "error",
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.status} {self.code}: {self.message}{where}"


class InvalidRequest(GatewayError):
    """400: the request is wrong; `field` names the part at fault, e.g. `files[0].path`."""


class Unauthorized(GatewayError):
    """401: a token is required, or the one given is not known."""


class Forbidden(GatewayError):
    """403: the operator does not allow this (network, uploads, a workspace, an origin)."""


class NotFound(GatewayError):
    """404: no such run or upload for this caller (or it expired, or was deleted)."""


class PayloadTooLarge(GatewayError):
    """413: code, files, a body or a message over the operator's limit."""


class RateLimited(GatewayError):
    """429 `capacity`: too many runs or connections of this caller; try again after
    `retry_after` seconds."""


class Unavailable(GatewayError):
    """503: the gateway cannot serve now (too many connections, no sandbox could start,
    the run store does not answer); `retry_after` seconds when it said."""


class ServerError(GatewayError):
    """500 (or another 5xx): the gateway failed; it logged why."""


class Unreachable(GatewayError):
    """No answer from the gateway: the connection was refused, reset or timed out."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=0, code="unreachable")


class UnexpectedAnswer(GatewayError):
    """An answer that is not the API's: not JSON, or not of the promised shape."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message, status=status, code="unexpected_answer")


BY_STATUS: dict[int, type[GatewayError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    413: PayloadTooLarge,
    429: RateLimited,
    503: Unavailable,
}

# A WebSocket `error` event has a code but no status: the status its code has over HTTP.
STATUS_OF_CODE: dict[str, int] = {
    "invalid_request": 400,
    "unsupported_language": 400,
    "invalid_path": 400,
    "conflicting_fields": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "archive_mode_disabled": 403,
    "not_found": 404,
    "payload_too_large": 413,
    "capacity": 429,
    "sandbox_unavailable": 503,
    "store_unavailable": 503,
    "internal": 500,
}

SHOWN_CHARS = 500  # of an answer that is not the API's, quoted in the error's message


def error_class(status: int) -> type[GatewayError]:
    if status in BY_STATUS:
        return BY_STATUS[status]
    return ServerError if status >= 500 else GatewayError


def error_from_answer(status: int, body: bytes, retry_after: str | None) -> GatewayError:
    """The error for an answer with `status` >= 400 (or a refused WebSocket handshake)."""
    retry = parse_retry_after(retry_after)
    try:
        error: ErrorBody = Error.model_validate_json(body).error
    except pydantic.ValidationError:
        text = body.decode("utf-8", "replace")[:SHOWN_CHARS]
        return error_class(status)(
            f"HTTP {status}: {text}", status=status, code="http_error", retry_after=retry
        )
    return error_class(status)(
        error.message, status=status, code=error.code, field=error.field, retry_after=retry
    )


def error_from_event(event: ErrorEvent) -> GatewayError:
    """The error for a WebSocket `error` event: the class its code has over HTTP."""
    status = STATUS_OF_CODE.get(event.error.code, 400)
    retry = None if event.retry_after is None else float(event.retry_after)
    return error_class(status)(
        event.error.message,
        status=status,
        code=event.error.code,
        field=event.error.field,
        retry_after=retry,
    )


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds: a number of seconds, or an HTTP date (RFC 9110 10.2.3);
    None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
    return seconds if 0 <= seconds < float("inf") else None


def is_error_answer(body: bytes) -> bool:
    """The body is the API's error shape."""
    try:
        Error.model_validate_json(body)
    except pydantic.ValidationError:
        return False
    return True


def not_the_api(status: int, detail: str) -> UnexpectedAnswer:
    return UnexpectedAnswer(f"The gateway's answer is not the API's: {detail}", status)


__all__ = [
    "Forbidden",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "Unreachable",
]
