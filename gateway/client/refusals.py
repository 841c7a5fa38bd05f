"""What the client makes of the gateway's refusals: the one place where an error answer
(or no answer) becomes an exception of the gateway's own vocabulary, `gateway.errors`, the
same classes the server raised it as: `InvalidRequest` (and `InvalidPath`, ...) with
`field`, `Unauthorized`, `Forbidden`, `NotFound`, `SnapshotElsewhere` with `instance`,
`SnapshotGone`, `PayloadTooLarge`,
`RateLimited` and `Unavailable` (`Overloaded`, `SandboxError`, `StoreUnavailable`) with
`retry_after` from `Retry-After`, `ServerError` for a 5xx, `Unreachable` when there is no answer and
`UnexpectedAnswer` for one that is not the API's (a proxy's HTML page, a body that does not
fit the model).

An answer's class is the one its status and code name; past that, its status's (any other
status, 405 say, is a plain `GatewayError`). The HTTP answers, the WebSocket handshake and
the WebSocket's `error` events are translated by the functions below; the transport
libraries' own exceptions are translated where they are caught (`raise Unreachable(...)
from exc`), so none of them escapes the client.
"""

from __future__ import annotations

import datetime as dt
import email.utils

import pydantic

from gateway.errors import (
    ConflictingFields,
    FilesGone,
    Forbidden,
    GatewayError,
    InvalidPath,
    InvalidRequest,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    ServerError,
    SnapshotElsewhere,
    SnapshotGone,
    StoreUnavailable,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
    UnsupportedLanguage,
    UnsupportedMediaType,
)
from gateway.models.answers import Error, ErrorBody
from gateway.models.stream import ErrorEvent

BY_STATUS: dict[int, type[GatewayError]] = {
    cls.status: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        SnapshotElsewhere,
        SnapshotGone,
        PayloadTooLarge,
        UnsupportedMediaType,
        RateLimited,
        ServerError,
        Unavailable,
    )
}
# Where a status has several classes, its code tells which.
BY_STATUS_AND_CODE: dict[tuple[int, str], type[GatewayError]] = {
    (cls.status, cls.code): cls
    for cls in (
        UnsupportedLanguage,
        InvalidPath,
        ConflictingFields,
        FilesGone,
        QuotaExceeded,
        Overloaded,
        SandboxError,
        StoreUnavailable,
    )
}

# A WebSocket `error` event has a code but no status: the status its code has over HTTP.
STATUS_OF_CODE: dict[str, int] = {
    "invalid_request": 400,
    "unsupported_language": 400,
    "invalid_path": 400,
    "conflicting_fields": 400,
    "snapshot_unsupported": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "archive_mode_disabled": 403,
    "not_found": 404,
    "snapshot_elsewhere": 409,
    "snapshot_gone": 410,
    "files_gone": 410,
    "payload_too_large": 413,
    "capacity": 429,
    "quota": 429,
    "sandbox_unavailable": 503,
    "store_unavailable": 503,
    "internal": 500,
}

SHOWN_CHARS = 500  # of an answer that is not the API's, quoted in the error's message


def error_class(status: int, code: str = "") -> type[GatewayError]:
    """The class of an answer of `status` with `code`."""
    if (status, code) in BY_STATUS_AND_CODE:
        return BY_STATUS_AND_CODE[status, code]
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
    found = error_class(status, error.code)(
        error.message, status=status, code=error.code, field=error.field, retry_after=retry
    )
    if isinstance(found, SnapshotElsewhere):
        found.instance = error.instance or ""
    return found


def error_from_event(event: ErrorEvent) -> GatewayError:
    """The error for a WebSocket `error` event: the class its code has over HTTP."""
    status = STATUS_OF_CODE.get(event.error.code, 400)
    retry = None if event.retry_after is None else float(event.retry_after)
    return error_class(status, event.error.code)(
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
    return UnexpectedAnswer(f"The gateway's answer is not the API's: {detail}", status=status)
