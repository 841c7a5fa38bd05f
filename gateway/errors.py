"""The gateway's domain exceptions, and the one place they become HTTP.

    GatewayError                      anything we report to a client on purpose
     +-- InvalidRequest        400    invalid_request (and a more specific code)
     |    +-- UnsupportedLanguage 400 unsupported_language
     |    +-- InvalidPath         400 invalid_path
     |    +-- ConflictingFields   400 conflicting_fields
     +-- Unauthorized          401    unauthorized
     +-- Forbidden             403    forbidden (or e.g. archive_mode_disabled)
     +-- NotFound              404    not_found
     +-- PayloadTooLarge       413    payload_too_large
     +-- UnsupportedMediaType  415    unsupported_media_type
     +-- ClientGone            499    client_closed_request: never sent, the client left
     +-- CapacityExceeded      429    capacity (with Retry-After)
     +-- Overloaded            503    capacity: no memory to spare now (with Retry-After)
     +-- SandboxError          503    sandbox_unavailable: a kernel or sandbox could not start
     +-- StoreUnavailable      503    store_unavailable: the record store cannot be reached

User code that fails is never one of these: it is a run record with status "failed".
Foreign exceptions (Docker, ZMQ, nbformat, the PostgreSQL driver) are translated into these
where they are caught.
"""

from __future__ import annotations

from typing import Any

# Messages and field names may quote what the client sent (a path, a language): an answer
# never echoes more than this of it.
MAX_MESSAGE_CHARS = 2000
MAX_FIELD_CHARS = 200


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 20] + f" [... {len(text) - limit + 20} characters cut]"


class GatewayError(Exception):
    """An error reported to the client as `{"error": {code, message, field?}}`."""

    status = 500
    code = "internal"

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
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "code": self.code,
            "message": _clip(self.message, MAX_MESSAGE_CHARS),
        }
        if self.field is not None:
            body["field"] = _clip(self.field, MAX_FIELD_CHARS)
        return {"error": body}


class InvalidRequest(GatewayError, status=400, code="invalid_request"): ...


class UnsupportedLanguage(InvalidRequest, code="unsupported_language"): ...


class InvalidPath(InvalidRequest, code="invalid_path"): ...


class ConflictingFields(InvalidRequest, code="conflicting_fields"): ...


class Unauthorized(GatewayError, status=401, code="unauthorized"): ...


class Forbidden(GatewayError, status=403, code="forbidden"): ...


class NotFound(GatewayError, status=404, code="not_found"): ...


class PayloadTooLarge(GatewayError, status=413, code="payload_too_large"): ...


class UnsupportedMediaType(GatewayError, status=415, code="unsupported_media_type"): ...


class ClientGone(GatewayError, status=499, code="client_closed_request"):
    """The client went away while its request was being handled; the work for it was given
    up. Never sent (there is nobody to send it to): it ends the handler, and the access
    log shows 499, as nginx's does."""


class CapacityExceeded(GatewayError, status=429, code="capacity"): ...


class Overloaded(GatewayError, status=503, code="capacity"):
    """The gateway has no room now for what this request needs held (its body, its answer):
    not the caller's fault; the client may try again after `Retry-After`."""


class SandboxError(GatewayError, status=503, code="sandbox_unavailable"):
    """A sandbox or kernel could not be started or talked to (not the user's fault)."""


class StoreUnavailable(GatewayError, status=503, code="store_unavailable"):
    """The record store (PostgreSQL) cannot be reached now; the client may try again."""
