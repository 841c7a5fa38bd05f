"""Schemas and responses that several endpoints share: the error shape and its codes, the
run record and its parts (nbformat outputs, charts, returned files, usage), staged files
and notebooks. Each endpoint's own request and answer shapes live in its own module."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema` or JSON null (OpenAPI 3.1 / JSON Schema 2020-12 style)."""
    return {"anyOf": [schema, {"type": "null"}]}


def json_body(schema: Schema, description: str = "", **extra: Any) -> Schema:
    """A JSON response (or request body) with this schema."""
    content: Schema = {"application/json": {"schema": schema, **extra}}
    return {"description": description or "JSON", "content": content}


def json_request(schema: Schema, description: str) -> Schema:
    """A JSON request body (see `JSON_BODIES` for the media types read as JSON)."""
    return {
        "required": True,
        "description": f"{description} {JSON_BODIES}",
        "content": {"application/json": {"schema": schema}},
    }


JSON_BODIES = (
    "The body is read as JSON only when its Content-Type is `application/json` or an "
    "`application/<x>+json` type; any other media type, or none (`curl -d` without "
    "`-H 'Content-Type: application/json'`), is 415 unsupported_media_type. JSON nested more "
    "than `max_json_depth` (default 64) levels deep is 400 invalid_request."
)


# --- errors -------------------------------------------------------------------------------

# Every error code the gateway answers with, by HTTP status. The 400 codes of
# `/v1/uploads` (one per archive check) are listed with that endpoint.
ERROR_CODES: dict[int, list[str]] = {
    400: ["invalid_request", "unsupported_language", "invalid_path", "conflicting_fields"],
    401: ["unauthorized"],
    403: ["forbidden", "archive_mode_disabled"],
    404: ["not_found"],
    405: ["method_not_allowed"],
    413: ["payload_too_large"],
    415: ["unsupported_media_type"],
    429: ["capacity"],
    500: ["internal"],
    503: ["sandbox_unavailable", "capacity"],
}

_ERROR_TEXT: dict[int, tuple[str, str]] = {
    400: (
        "BadRequest",
        "The request is invalid. `invalid_request`: malformed JSON (or nested too deep), a "
        "field of the wrong type, "
        "an unknown field (`field` names the first one), a missing `code`; "
        "`unsupported_language`: the message lists the supported ones; `invalid_path`: a path "
        "that is absolute, contains `..` or NUL, or names a file that is also a folder; "
        "`conflicting_fields`: `code` and `entrypoint` together. `field` names the offending "
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
        "`Sec-Fetch-Site: cross-site`) or `archive_mode_disabled` (uploads and `archive` are "
        "off).",
    ),
    404: ("NotFound", "`not_found`: no such run (or not yours), or nothing at this address."),
    413: (
        "PayloadTooLarge",
        "`payload_too_large`: the body, `code`, a staged file, the number or total size of "
        "`files`, or the number of `return_files` is over the operator's limit; the message "
        "names the limit and `field` the field.",
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
        "per-user maximum of runs in progress, or the gateway is draining. Retry after the "
        "number of seconds in `Retry-After`.",
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
        "`max_connections` connections open; this one was answered at once and closed "
        "(with `Retry-After`).",
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
        response = json_body(ref("Error"), f"{text} Codes: {', '.join(codes)}.", example=example)
        if status == 429:
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


ERROR_SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "description": (
            "Every error answer (never HTML, never a stack trace). `x-error-codes` lists the "
            "codes by HTTP status. User code that fails is not an error answer: it is a 200 "
            "run record with `status: failed`."
        ),
        "required": ["error"],
        "additionalProperties": False,
        "properties": {"error": ref("ErrorBody")},
        "x-error-codes": {str(k): v for k, v in ERROR_CODES.items()},
    },
    "ErrorBody": {
        "type": "object",
        "required": ["code", "message"],
        "additionalProperties": False,
        "properties": {
            "code": {
                "type": "string",
                "pattern": "^[a-z][a-z0-9_]*$",
                "description": "snake_case, stable: branch on this",
            },
            "message": {"type": "string", "minLength": 1, "description": "a human sentence"},
            "field": {
                "type": "string",
                "description": "the request field at fault, e.g. `timeout` or `files[0].path`",
            },
        },
    },
}


# --- the run record and its parts ----------------------------------------------------------

_MULTILINE = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
    "description": "a string (nbformat also allows a list of lines)",
}
_MIMEBUNDLE = {
    "type": "object",
    "description": (
        "mime type -> data: text for text types and SVG, base64 for PNG/JPEG, a JSON value "
        "for `application/json` and `+json` types"
    ),
}

OUTPUT_SCHEMAS: dict[str, Schema] = {
    "Output": {
        "description": (
            "One nbformat v4 output, exactly as an .ipynb code cell holds it. Consecutive "
            "stream outputs of the same name are merged in the run record. When output was "
            "cut (see `output_truncated`), a stderr stream output with the marker "
            "`[... N bytes truncated ...]` stands where the middle was."
        ),
        "oneOf": [
            ref("StreamOutput"),
            ref("DisplayDataOutput"),
            ref("ExecuteResultOutput"),
            ref("ErrorOutput"),
        ],
        "discriminator": {
            "propertyName": "output_type",
            "mapping": {
                "stream": "#/components/schemas/StreamOutput",
                "display_data": "#/components/schemas/DisplayDataOutput",
                "execute_result": "#/components/schemas/ExecuteResultOutput",
                "error": "#/components/schemas/ErrorOutput",
            },
        },
    },
    "StreamOutput": {
        "type": "object",
        "required": ["output_type", "name", "text"],
        "properties": {
            "output_type": {"const": "stream"},
            "name": {"enum": ["stdout", "stderr"]},
            "text": _MULTILINE,
        },
    },
    "DisplayDataOutput": {
        "type": "object",
        "required": ["output_type", "data", "metadata"],
        "properties": {
            "output_type": {"const": "display_data"},
            "data": _MIMEBUNDLE,
            "metadata": {
                "type": "object",
                "description": (
                    "per-mime metadata; images the gateway published carry "
                    "`gateway: {source, path?, spec?}`"
                ),
            },
        },
    },
    "ExecuteResultOutput": {
        "type": "object",
        "required": ["output_type", "data", "metadata", "execution_count"],
        "properties": {
            "output_type": {"const": "execute_result"},
            "execution_count": nullable({"type": "integer"}),
            "data": _MIMEBUNDLE,
            "metadata": {"type": "object"},
        },
    },
    "ErrorOutput": {
        "type": "object",
        "required": ["output_type", "ename", "evalue", "traceback"],
        "properties": {
            "output_type": {"const": "error"},
            "ename": {"type": "string"},
            "evalue": {"type": "string"},
            "traceback": {"type": "array", "items": {"type": "string"}},
        },
    },
}

_POINT = {"type": ["number", "string", "null"]}

CHART_SCHEMAS: dict[str, Schema] = {
    "Chart": {
        "type": "object",
        "description": (
            "An image the run produced: `plt.show()`, a figure left open at the end of the "
            "run, a `savefig` call (with the path it saved to), or any PNG/JPEG/SVG display."
        ),
        "required": ["mime", "data", "source"],
        "additionalProperties": False,
        "properties": {
            "mime": {"enum": ["image/png", "image/jpeg", "image/svg+xml"]},
            "data": {"type": "string", "description": "base64 for PNG/JPEG, the text for SVG"},
            "source": {"enum": ["display", "savefig"]},
            "path": {"type": "string", "description": "the path given to `savefig`"},
            "spec": ref("ChartSpec"),
        },
    },
    "ChartSpec": {
        "type": "object",
        "description": (
            "The chart's data, read back from the matplotlib figure when it can be (best "
            "effort, at most 1000 points per series). For several axes, `type` is "
            "`subplots`, the top-level fields describe the first axes and `axes` lists all."
        ),
        "required": ["type", "title", "x_label", "y_label", "series"],
        "properties": {
            "type": {
                "type": "string",
                "description": "line, bar, scatter, pie, mixed, unknown or subplots",
            },
            "title": nullable({"type": "string"}),
            "x_label": nullable({"type": "string"}),
            "y_label": nullable({"type": "string"}),
            "series": {"type": "array", "items": ref("ChartSeries")},
            "axes": nullable({"type": "array", "items": ref("ChartAxes")}),
        },
    },
    "ChartAxes": {
        "type": "object",
        "required": ["type", "title", "x_label", "y_label", "series"],
        "properties": {
            "type": {"type": "string"},
            "title": nullable({"type": "string"}),
            "x_label": nullable({"type": "string"}),
            "y_label": nullable({"type": "string"}),
            "series": {"type": "array", "items": ref("ChartSeries")},
        },
    },
    "ChartSeries": {
        "type": "object",
        "required": ["type", "label", "y"],
        "properties": {
            "type": {"enum": ["line", "bar", "scatter", "pie"]},
            "label": nullable({"type": "string"}),
            "x": {"type": "array", "items": _POINT},
            "y": {"type": "array", "items": _POINT},
            "tick_labels": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "array", "items": {"type": "string"}},
        },
    },
}

FILE_SCHEMAS: dict[str, Schema] = {
    "StagedFile": {
        "type": "object",
        "description": (
            "A file written into the working folder before the run; folders are created. "
            "Other keys are ignored."
        ),
        "required": ["path"],
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "relative; no `..`, no leading `/`, no NUL (else 400 invalid_path)",
            },
            "content": {"type": "string", "default": ""},
            "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
        },
    },
    "ReturnedFile": {
        "description": (
            "One `return_files` match, in the order asked; a glob gives one entry per match "
            "(folders skipped). Read after the run, also after a timeout; links are followed "
            "only while they stay inside the working folder."
        ),
        "oneOf": [ref("ReturnedFileContent"), ref("ReturnedFileError")],
    },
    "ReturnedFileContent": {
        "type": "object",
        "required": ["path", "size", "encoding", "content"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "size": {"type": "integer", "minimum": 0},
            "encoding": {
                "enum": ["utf-8", "base64"],
                "description": "utf-8 when the bytes are valid UTF-8, else base64",
            },
            "content": {"type": "string"},
        },
    },
    "ReturnedFileError": {
        "type": "object",
        "required": ["path", "size", "error"],
        "additionalProperties": False,
        "properties": {
            "path": {"type": "string"},
            "size": {
                "type": ["integer", "null"],
                "description": "the size when known (a file over a limit), else null",
            },
            "error": {
                "type": "string",
                "description": (
                    'Why it was not returned: "not found", "is a folder", "outside the working '
                    'folder", "not a regular file", "larger than the limit of N bytes", "the '
                    'total size limit of returned files was reached", "grew past the size '
                    'limit", "no file matches" (a glob), or the operating system\'s reason.'
                ),
            },
        },
    },
}

RECORD_SCHEMAS: dict[str, Schema] = {
    "Usage": {
        "type": "object",
        "description": "What the run's sandbox used.",
        "required": ["wall_ms", "cpu_ms", "peak_memory_bytes"],
        "additionalProperties": False,
        "properties": {
            "wall_ms": {
                "type": "integer",
                "minimum": 0,
                "description": "from the start of the run (sandbox start included) to its end",
            },
            "cpu_ms": nullable({"type": "integer", "minimum": 0}),
            "peak_memory_bytes": nullable({"type": "integer", "minimum": 0}),
        },
    },
    "RunError": {
        "type": "object",
        "description": "The uncaught error (Python: the exception; `SystemExit(0)` is none).",
        "required": ["ename", "evalue", "traceback"],
        "properties": {
            "ename": {"type": "string"},
            "evalue": {"type": "string"},
            "traceback": {
                "type": "array",
                "items": {"type": "string"},
                "description": "lines, with the kernel's ANSI colour codes",
            },
        },
    },
    "RunStatus": {
        "enum": ["queued", "running", "succeeded", "failed", "timed_out", "killed", "cancelled"],
        "description": (
            "`queued`/`running` only while a background run is in progress. `succeeded`: exit "
            "code 0. `failed`: the code failed (non-zero exit, uncaught exception), or the "
            "kernel died of something else than a limit (then `exit_code` is 128+signal and a "
            "note says so), or the gateway could not run it (a note says why). `timed_out`: the "
            "timeout ended it (`kill_reason: timeout`). `killed`: a limit ended it "
            "(`kill_reason` memory, pids or output_limit); a memory or process limit that "
            "struck before a timeout reports `killed` with that reason and `timed_out: true`. "
            "`cancelled`: `DELETE /v1/runs/{id}` or a WebSocket cancel (`kill_reason: "
            "cancelled`)."
        ),
    },
    "RunRecord": {
        "type": "object",
        "description": (
            "Everything known about one run. The same object is the answer of POST /v1/runs, "
            "GET and DELETE /v1/runs/{id}, the `run` of a WebSocket `done` message and of "
            "POST /v1/notebooks/run."
        ),
        "additionalProperties": False,
        "required": [
            "id",
            "language",
            "status",
            "success",
            "exit_code",
            "stdout",
            "stderr",
            "output",
            "stdout_truncated",
            "stderr_truncated",
            "output_truncated",
            "outputs",
            "result",
            "error",
            "charts",
            "files",
            "timed_out",
            "kill_reason",
            "usage",
            "started_at",
            "finished_at",
            "notes",
        ],
        "properties": {
            "id": {"type": "string"},
            "language": {"enum": ["python", "bash", "javascript", "typescript"]},
            "status": ref("RunStatus"),
            "success": {"type": "boolean", "description": '`status == "succeeded"`'},
            "exit_code": {
                "type": ["integer", "null"],
                "description": (
                    "0 on success; Python: 1 for an uncaught exception, n for `sys.exit(n)`; "
                    "bash: the script's `$?`; 128+signal when the kernel died; null when the "
                    "run timed out, was killed or cancelled, or has not finished"
                ),
            },
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "output": {"type": "string", "description": "stdout and stderr as they arrived"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "output_truncated": {
                "type": "boolean",
                "description": (
                    "Each of stdout, stderr and output is kept up to the operator's cap "
                    "(default 1 MiB): the first and the last half of the cap are kept and "
                    "`[... N bytes truncated ...]` marks the cut. Output far past the cap "
                    "(default 64 MiB in all) kills the run (`kill_reason: output_limit`)."
                ),
            },
            "outputs": {"type": "array", "items": ref("Output")},
            "result": {
                "description": (
                    "Python: the value of the global `result`, else of `output`, after the "
                    "run, when it is JSON-serialisable (numpy values and arrays, pandas "
                    "objects are converted with `tolist()`/`to_dict()`); else null and a "
                    "note. Also null with a note when its JSON is larger than "
                    "`result_cap_bytes` (default 4 MiB) or nested more than `max_json_depth` "
                    "levels deep. Null for bash and for runs that did not finish."
                ),
            },
            "error": nullable(
                {
                    **ref("RunError"),
                    "description": (
                        "The uncaught error. Its `evalue` and its `traceback` (in all) are "
                        "each cut to `error_cap_bytes` (default 256 KiB) as they arrive, "
                        "head and tail kept, and its `ename` to 1 KiB; the error output in "
                        "`outputs` is the same cut error."
                    ),
                }
            ),
            "charts": {"type": "array", "items": ref("Chart")},
            "files": {"type": "array", "items": ref("ReturnedFile")},
            "timed_out": {"type": "boolean"},
            "kill_reason": {
                "enum": ["timeout", "memory", "output_limit", "pids", "cancelled", None],
            },
            "usage": ref("Usage"),
            "started_at": nullable({"type": "string", "format": "date-time"}),
            "finished_at": nullable({"type": "string", "format": "date-time"}),
            "notes": {
                "type": "array",
                "items": {"type": "string"},
                "description": (
                    "sentences about anything clamped, truncated or not returned; each at "
                    "most 1000 characters, at most 100 of them"
                ),
            },
        },
    },
}

NOTEBOOK_SCHEMAS: dict[str, Schema] = {
    "Notebook": {
        "type": "object",
        "description": (
            "An nbformat v4 notebook (the full rules are nbformat's JSON schema; the gateway "
            "validates with nbformat)."
        ),
        "required": ["nbformat", "nbformat_minor", "metadata", "cells"],
        "properties": {
            "nbformat": {"const": 4},
            "nbformat_minor": {"type": "integer", "minimum": 0},
            "metadata": {"type": "object"},
            "cells": {"type": "array", "items": ref("NotebookCell")},
        },
    },
    "NotebookCell": {
        "type": "object",
        "required": ["cell_type", "source", "metadata"],
        "properties": {
            "id": {"type": "string"},
            "cell_type": {"enum": ["code", "markdown", "raw"]},
            "source": _MULTILINE,
            "metadata": {"type": "object"},
            "execution_count": nullable({"type": "integer"}),
            "outputs": {"type": "array", "items": ref("Output")},
            "attachments": {"type": "object"},
        },
    },
}


def shared_schemas() -> dict[str, Schema]:
    return {
        **ERROR_SCHEMAS,
        **OUTPUT_SCHEMAS,
        **CHART_SCHEMAS,
        **FILE_SCHEMAS,
        **RECORD_SCHEMAS,
        **NOTEBOOK_SCHEMAS,
    }


PATH_RUN_ID: Schema = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "a run id (`run_` + hex), as answered by POST /v1/runs",
    "schema": {"type": "string", "pattern": "^(run_[0-9a-f]{1,64}|[A-Za-z0-9_-]{1,100})$"},
}
