"""The gateway's one exception vocabulary: what the server reports to a client on purpose,
and what the client raises when it is told so (or told nothing). The server renders each
as `{"error": {code, message, field?}}` with its status (`handlers/base.py`, one
`write_error`); the client turns an answer back into the class of its status and code
(`gateway.client.answers`), so both sides name every error alike.

    GatewayError                      status, code, message, field, retry_after
     +-- InvalidRequest        400    invalid_request (and a more specific code)
     |    +-- UnsupportedLanguage 400 unsupported_language
     |    +-- InvalidPath         400 invalid_path
     |    +-- ConflictingFields   400 conflicting_fields
     +-- Unauthorized          401    unauthorized
     +-- Forbidden             403    forbidden (or e.g. archive_mode_disabled)
     +-- NotFound              404    not_found
     +-- SnapshotElsewhere     409    snapshot_elsewhere: another replica holds it (instance)
     +-- SnapshotGone          410    snapshot_gone: it existed and went
     +-- FilesGone             410    files_gone: a run's files were not kept, or went
     +-- PayloadTooLarge       413    payload_too_large
     +-- UnsupportedMediaType  415    unsupported_media_type
     +-- RateLimited           429    capacity: too many runs or connections (Retry-After)
     |    +-- QuotaExceeded       429 quota: the user's CPU-seconds or runs are spent (Retry-After)
     +-- ClientGone            499    client_closed_request: never sent, the client left
     +-- ServerError           500    internal: a bug of the gateway (logged)
     +-- Unavailable           503    the gateway cannot serve now (Retry-After)
     |    +-- Overloaded          503 capacity: no memory to spare now
     |    +-- SandboxError        503 sandbox_unavailable: a kernel or sandbox could not start
     |    +-- StoreUnavailable    503 store_unavailable: the record store cannot be reached
     +-- Unreachable            -     the client's: no answer (refused, reset, timed out)
     +-- UnexpectedAnswer       -     the client's: an answer that is not the API's

User code that fails is never one of these: it is a run record with status "failed".
Foreign exceptions (Docker, ZMQ, nbformat, the PostgreSQL driver, the client's HTTP and
WebSocket libraries) are translated into these where they are caught.
"""

from __future__ import annotations

from typing import Any, ClassVar

# Messages and field names may quote what the client sent (a path, a language): an answer
# never echoes more than this of it.
MAX_MESSAGE_CHARS = 2000
MAX_FIELD_CHARS = 200


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 20] + f" [... {len(text) - limit + 20} characters cut]"


class GatewayError(Exception):
    """An error answer of the gateway (`status`, `code`, `message`, `field`,
    `retry_after`), or, in the client, none at all. Branch on the class or on `code`."""

    status = 500
    code = "internal"
    # False for what the server never answers: the client's own, a never-sent ClientGone, a
    # base class whose kinds are answered instead (tests/test_contract.py: every code the
    # server answers is documented)
    answered: ClassVar[bool] = True

    def __init_subclass__(
        cls, *, status: int | None = None, code: str | None = None, **kwargs: Any
    ) -> None:
        """A subclass says its HTTP status and error code in its bases, e.g.
        `class NotFound(GatewayError, status=404, code="not_found")`; it inherits what it
        does not say."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        code: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        if status is not None:  # an answer's own (the client meets any status)
            self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.status} {self.code}: {self.message}{where}"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "code": self.code,
            "message": _clip(self.message, MAX_MESSAGE_CHARS),
        }
        if self.field is not None:
            body["field"] = _clip(self.field, MAX_FIELD_CHARS)
        return {"error": body}


class InvalidRequest(GatewayError, status=400, code="invalid_request"):
    """400: the request is wrong; `field` names the part at fault, e.g. `files[0].path`."""


class UnsupportedLanguage(InvalidRequest, code="unsupported_language"): ...


class InvalidPath(InvalidRequest, code="invalid_path"): ...


class ConflictingFields(InvalidRequest, code="conflicting_fields"): ...


class Unauthorized(GatewayError, status=401, code="unauthorized"):
    """401: a token is required, or the one given is not known."""


class Forbidden(GatewayError, status=403, code="forbidden"):
    """403: the operator does not allow this (network, uploads, a workspace, an origin)."""


class NotFound(GatewayError, status=404, code="not_found"):
    """404: no such run or upload for this caller (or it expired, or was deleted)."""


class SnapshotGone(GatewayError, status=410, code="snapshot_gone"):
    """The snapshot existed and went: its TTL passed, it was evicted or deleted, or the
    gateway that held it stopped."""


class FilesGone(GatewayError, status=410, code="files_gone"):
    """`files_from` names a run whose files were not kept (`keep_files`), or went: past
    its owner's upload quota, or after `upload_ttl`. The client adds them again."""


class SnapshotElsewhere(GatewayError, status=409, code="snapshot_elsewhere"):
    """The snapshot lives on another replica, `instance`: send the request there (a load
    balancer routes on the `X-Gateway-Instance` header: docs/DESIGN.md decision 24)."""

    def __init__(self, message: str, *, instance: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.instance = instance

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        body["error"]["instance"] = _clip(self.instance, MAX_FIELD_CHARS)
        return body


class PayloadTooLarge(GatewayError, status=413, code="payload_too_large"):
    """413: code, files, a body or a message over the operator's limit."""


class UnsupportedMediaType(GatewayError, status=415, code="unsupported_media_type"): ...


class RateLimited(GatewayError, status=429, code="capacity"):
    """429 `capacity`: too many runs or connections of this caller, or the queue is full;
    try again after `retry_after` seconds."""


class QuotaExceeded(RateLimited, status=429, code="quota"):
    """429 `quota`: the caller's CPU-seconds of a rolling hour or day, or runs of a rolling
    minute, are spent; `retry_after` is when enough of the window has passed."""


class ClientGone(GatewayError, status=499, code="client_closed_request"):
    """The client went away while its request was being handled; the work for it was given
    up. Never sent (there is nobody to send it to): it ends the handler, and the access
    log shows 499, as nginx's does."""

    answered = False


class ServerError(GatewayError, status=500, code="internal"):
    """500 (or another 5xx): the gateway failed; it logged why."""


class Unavailable(GatewayError, status=503, code="unavailable"):
    """503: the gateway cannot serve now (no memory to spare, no sandbox could start, the
    run store does not answer); `retry_after` seconds when it said."""

    answered = False  # the server answers one of its kinds


class Overloaded(Unavailable, code="capacity"):
    """The gateway has no room now for what this request needs held (its body, its answer):
    not the caller's fault; the client may try again after `Retry-After`."""


class SandboxError(Unavailable, code="sandbox_unavailable"):
    """A sandbox or kernel could not be started or talked to (not the user's fault)."""


class StoreUnavailable(Unavailable, code="store_unavailable"):
    """The record store (PostgreSQL) cannot be reached now; the client may try again."""


class Unreachable(GatewayError, status=0, code="unreachable"):
    """The client's: no answer from the gateway (the connection was refused, reset or
    timed out)."""

    answered = False


class UnexpectedAnswer(GatewayError, status=0, code="unexpected_answer"):
    """The client's: an answer that is not the API's (not JSON, or not of the promised
    shape; a proxy's page)."""

    answered = False
