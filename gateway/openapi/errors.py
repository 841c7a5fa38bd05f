"""The error answers: every code by HTTP status, what each status means, and the shared
response components that operations refer to (`errors(400, 404)`)."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]
ERROR = {"$ref": "#/components/schemas/Error"}


def json_body(schema: Schema, description: str = "", **extra: Any) -> Schema:
    """A JSON response with this schema."""
    content: Schema = {"application/json": {"schema": schema, **extra}}
    return {"description": description or "JSON", "content": content}


# Every error code the gateway answers with, by HTTP status. The 400 codes of
# `/v1/uploads` (one per archive check) are listed with that endpoint.
ERROR_CODES: dict[int, list[str]] = {
    400: [
        "invalid_request",
        "unsupported_language",
        "invalid_path",
        "conflicting_fields",
        "snapshot_unsupported",
    ],
    401: ["unauthorized"],
    403: ["forbidden", "archive_mode_disabled"],
    404: ["not_found"],
    405: ["method_not_allowed"],
    409: ["snapshot_elsewhere"],
    410: ["snapshot_gone", "files_gone"],
    413: ["payload_too_large"],
    415: ["unsupported_media_type"],
    429: ["capacity", "quota"],
    500: ["internal"],
    503: ["sandbox_unavailable", "capacity", "store_unavailable"],
}

_ERROR_TEXT: dict[int, tuple[str, str]] = {
    400: (
        "BadRequest",
        "The request is invalid. `invalid_request`: malformed JSON (or nested too deep), a "
        "field of the wrong type, "
        "an unknown field (`field` names the first one), a missing `code`; "
        "`unsupported_language`: the message lists the supported ones; `invalid_path`: a path "
        "that is absolute, contains `..` or NUL, or names a file that is also a folder; "
        "`conflicting_fields`: `code` and `entrypoint` together, `archive` and `files_from`, "
        "or `keep`/`from` with "
        "`network` or `working_dir`; `snapshot_unsupported`: `keep` or `from` for a language "
        "or backend whose kernels cannot be kept. `field` names the offending "
        "field, e.g. `files[2].path`.",
    ),
    401: (
        "Unauthorized",
        "No valid `Authorization: Bearer <token>` header (code `unauthorized`). The answer "
        "carries `WWW-Authenticate: Bearer`.",
    ),
    403: (
        "Forbidden",
        "Refused by the operator's configuration: `forbidden` (e.g. `network: true` when "
        "network is not enabled, `working_dir` when workspaces are not enabled or outside "
        "what an admin may name, a non-loopback `Host` in single-user mode, a cross-site "
        "request: an `Origin` that is not the gateway's own or an allowed one, or "
        "`Sec-Fetch-Site: cross-site`, `/metrics` with a user's token) or "
        "`archive_mode_disabled` (uploads and `archive` are off).",
    ),
    404: (
        "NotFound",
        "`not_found`: no such run or snapshot (or not yours), or nothing at this address.",
    ),
    409: (
        "Conflict",
        "`snapshot_elsewhere`: the snapshot named in `from` lives on another replica of this "
        "gateway; `instance` names it. Resend the request with the header "
        "`X-Gateway-Instance: <instance>`, on which the load balancer routes (or with "
        "`rebuild: true`, to replay its chain's code here). A run is never started from "
        "nothing instead.",
    ),
    410: (
        "Gone",
        "`snapshot_gone`: the snapshot named in `from` (or the address) existed and went: "
        "its TTL passed, its owner's snapshot limits evicted it, it was deleted, or its "
        "gateway stopped or restarted. The message says which. A run is never started from nothing "
        "instead. `files_gone`: the run named in `files_from` kept no files (no `keep_files`), "
        "or they went (past its owner's upload quota, or after `upload_ttl`): add them again.",
    ),
    413: (
        "PayloadTooLarge",
        "`payload_too_large`: the body, `code`, a staged file, the number or total size of "
        "`files`, or the number of `return_files` is over the operator's limit; the message "
        "names the limit and `field` the field. Also a body sent with a method that takes "
        "none (only POST does): refused at the headers, and the connection closed.",
    ),
    415: (
        "UnsupportedMediaType",
        "`unsupported_media_type`: the body is not sent as JSON. Only `application/json` and "
        "`application/<x>+json` types are read as JSON; a form's types "
        "(`application/x-www-form-urlencoded`, `multipart/form-data`, `text/plain`) and no "
        "Content-Type at all are refused, because any web page can send those to any site.",
    ),
    429: (
        "Capacity",
        "`capacity`: every run slot is busy and the queue is full, you already have the "
        "per-user maximum of runs in progress, or the gateway is draining; `quota`: your "
        "CPU-seconds of a rolling hour or day, or your runs of a rolling minute, are spent "
        "(GET /v1/usage). Retry after the number of seconds in `Retry-After`.",
    ),
    500: (
        "Internal",
        "`internal`: a bug in the gateway. It was logged; the answer has no details.",
    ),
    503: (
        "SandboxUnavailable",
        "`sandbox_unavailable`: no kernel or sandbox could be started for this run (e.g. the "
        "container engine failed, or the kernel was not ready within `kernel_start_timeout`). "
        "Not the caller's fault; retrying later may work. `capacity`: the gateway has "
        "`max_connections` connections open (this one was answered at once and closed), or "
        "no room now for this request's body (`max_body_bytes_in_flight`, and its per-user "
        "share: refused at the headers) or its answer (`max_answer_bytes_in_flight`, and "
        "its per-user share: after waiting up to `write_timeout`); with `Retry-After`. "
        "`store_unavailable`: the run store (the PostgreSQL database "
        "that gateway replicas share) cannot be reached now (with `Retry-After`).",
    ),
}

RETRY_AFTER = {
    "description": "Seconds to wait before retrying (a whole number).",
    "schema": {"type": "integer", "minimum": 1},
}


def error_response_components() -> Schema:
    responses: Schema = {}
    for status, (name, text) in _ERROR_TEXT.items():
        codes = ERROR_CODES[status]
        example = {"error": {"code": codes[0], "message": "A human sentence saying what is wrong."}}
        response = json_body(
            {"$ref": "#/components/schemas/Error"},
            f"{text} Codes: {', '.join(codes)}.",
            example=example,
        )
        if status in (429, 503):
            response["headers"] = {"Retry-After": RETRY_AFTER}
        if status == 401:
            response["headers"] = {
                "WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`"}
            }
        responses[name] = response
    return responses


def errors(*statuses: int) -> Schema:
    """Error responses for an operation: the given statuses plus 500."""
    out: Schema = {}
    for status in (*statuses, 500):
        out[str(status)] = {"$ref": f"#/components/responses/{_ERROR_TEXT[status][0]}"}
    return out


# Each check of an archive has its own code (gateway/uploads/archives.py).
UPLOAD_ERROR_CODES: dict[int, list[str]] = {
    400: [
        "archive_absolute_path",
        "archive_path_traversal",
        "archive_link",
        "archive_special_file",
        "archive_invalid",
        "invalid_request",
    ],
    413: [
        "archive_too_large",
        "archive_unpacked_too_large",
        "archive_too_many_entries",
        "archive_entry_too_large",
        "archive_ratio_exceeded",
    ],
}
