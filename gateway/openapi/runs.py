"""`/v1/runs` (run and wait, or in the background), `/v1/runs/{id}` (poll, cancel) and
`/v1/runs/{id}/notebook` (export): the request, its rules and the paths."""

from __future__ import annotations

from gateway.openapi.common import PATH_RUN_ID, Schema, errors, json_body, json_request, ref

RUN_REQUEST: Schema = {
    "type": "object",
    "description": (
        "Exactly one of `code` and `entrypoint` is required (both: 400 conflicting_fields; "
        "neither: 400 invalid_request, field `code`). Unknown fields are refused: 400 "
        "invalid_request with `field` naming the first unknown one. An explicit `null` is "
        "the same as leaving a field out."
    ),
    "additionalProperties": False,
    "oneOf": [{"required": ["code"]}, {"required": ["entrypoint"]}],
    "properties": {
        "code": {
            "type": "string",
            "description": "the source to run; at most `max_code_bytes` (default 1 MiB): 413",
        },
        "language": {
            "enum": ["python", "bash", "javascript", "typescript"],
            "default": "python",
            "description": "anything else: 400 unsupported_language, listing the supported ones",
        },
        "timeout": {
            "type": "number",
            "default": 30,
            "description": (
                "Wall-clock limit in seconds. Clamped to [1, `max_timeout`] (default 300); "
                "a clamp is reported in `notes`. A non-number (or NaN/Infinity) is 400. The "
                "deadline counts from when the code is sent to the kernel: starting the "
                "sandbox and kernel is bounded separately by the operator's "
                "`kernel_start_timeout` (default 60 s; past it, 503 sandbox_unavailable). At "
                "the deadline the kernel is interrupted, gets a short grace period to flush, "
                "then every process of the sandbox is killed."
            ),
        },
        "files": {
            "type": "array",
            "items": ref("StagedFile"),
            "description": (
                "Written into the working folder before the run (after `archive`). A path "
                "given twice: 400. Over the operator's count (default 1000), per-file (10 "
                "MiB decoded) or total (32 MiB) limits: 413."
            ),
        },
        "entrypoint": {
            "type": "string",
            "minLength": 1,
            "description": (
                "a path among `files` (or inside the archive) to run instead of `code`: "
                "Python runs it as `__main__` (`%run -i`), bash with `bash`"
            ),
        },
        "archive": {
            "type": "string",
            "minLength": 1,
            "description": (
                "an id from POST /v1/uploads, unpacked into the working folder before `files`; "
                "403 archive_mode_disabled unless the operator enabled uploads; an unknown or "
                "expired id (or another user's upload) is 404 not_found"
            ),
        },
        "vars": {
            "type": "object",
            "description": (
                "Python: each key that is a valid identifier and not `input`, `result` or "
                "`output` becomes a global; every key is in the global dict `input`. Bash: "
                "values must be strings or numbers and keys valid variable names (else 400); "
                "they become environment variables."
            ),
        },
        "env": {
            "type": "object",
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
            "additionalProperties": {"type": "string"},
            "description": "extra environment variables for the kernel (no NUL in values)",
        },
        "return_files": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": (
                "paths or glob patterns (`*`, `?`, `[...]`, `**`) relative to the working folder, "
                "read back after the run, also after a timeout; at most `max_return_files` "
                "(default 100; more: 413); each file up to 1 MiB, 8 MiB in all (operator's)"
            ),
        },
        "background": {
            "type": "boolean",
            "default": False,
            "description": "answer 202 `{id, status}` at once; poll GET /v1/runs/{id}",
        },
        "network": {
            "type": "boolean",
            "default": False,
            "description": "outbound network; 403 forbidden unless the operator enabled it",
        },
        "working_dir": {
            "type": "string",
            "minLength": 1,
            "description": (
                "Run inside the caller's persistent workspace (mounted read-write; files "
                "written there stay). A non-admin caller is confined to "
                "`<workspaces>/<user>/`: a relative path resolves inside it (leaving it: 400 "
                "invalid_path), an absolute path outside it is replaced by that root and a "
                "note says so. An admin may name any folder the operator allows (else 403). "
                "403 when the operator configured no workspaces."
            ),
        },
        "type": {"description": "ignored (so that a WebSocket `run` message can be posted)"},
        "ref": {"description": "ignored (so that a WebSocket `run` message can be posted)"},
    },
    "example": {
        "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        "timeout": 20,
    },
}

SCHEMAS: dict[str, Schema] = {
    "RunRequest": RUN_REQUEST,
    "RunAccepted": {
        "type": "object",
        "description": "The answer to a background run.",
        "required": ["id", "status"],
        "additionalProperties": False,
        "properties": {"id": {"type": "string"}, "status": ref("RunStatus")},
    },
}

_RUN_DESCRIPTION = (
    "Runs the code in a fresh kernel in its own sandbox and answers when it ends. User code "
    "that fails is not an HTTP error: it is a 200 record with `status: failed`. A run that "
    "cannot be admitted is 429 capacity with `Retry-After` (all run slots busy and the queue "
    "full, or the caller's per-user limit of runs in progress reached). A kernel that cannot "
    "start is 503 sandbox_unavailable."
)

PATHS: dict[str, Schema] = {
    "/v1/runs": {
        "post": {
            "operationId": "createRun",
            "tags": ["runs"],
            "summary": "Run code in a fresh kernel and wait for the result",
            "description": _RUN_DESCRIPTION,
            "requestBody": json_request(ref("RunRequest"), "What to run."),
            "responses": {
                "200": json_body(ref("RunRecord"), "The finished run."),
                "202": {
                    **json_body(ref("RunAccepted"), "`background: true`: the run was queued."),
                    "headers": {
                        "Location": {
                            "description": "/v1/runs/{id}",
                            "schema": {"type": "string"},
                        }
                    },
                },
                **errors(400, 401, 403, 404, 413, 415, 429, 503),
            },
        }
    },
    "/v1/runs/{id}": {
        "parameters": [PATH_RUN_ID],
        "get": {
            "operationId": "getRun",
            "tags": ["runs"],
            "summary": "A run's record",
            "description": (
                "`status` is `queued` or `running` while a background run is in progress. "
                "Records are kept for the operator's TTL (default 7 days), and each user "
                "keeps at most `max_records_per_user` (default 1000) records of at most "
                "`max_record_store_bytes_per_user` (default 1 GiB) in all: past that, the "
                "user's oldest finished records are deleted (404 from then on); records of "
                "runs in progress never are. Another user's run is 404 (admins see every run)."
            ),
            "responses": {
                "200": json_body(ref("RunRecord"), "The run record."),
                **errors(401, 404),
            },
        },
        "delete": {
            "operationId": "cancelRun",
            "tags": ["runs"],
            "summary": "Cancel a queued or running run",
            "description": (
                "Its kernel and sandbox are destroyed and the answer is the record with "
                "`status: cancelled`, `kill_reason: cancelled` and whatever output came "
                "before. A run that already ended is left as it is (the answer is its record)."
            ),
            "responses": {
                "200": json_body(ref("RunRecord"), "The record after cancelling."),
                **errors(401, 404),
            },
        },
    },
    "/v1/runs/{id}/notebook": {
        "parameters": [PATH_RUN_ID],
        "get": {
            "operationId": "getRunNotebook",
            "tags": ["runs"],
            "summary": "The run as an nbformat v4 notebook",
            "description": (
                "One code cell with the code (for an `entrypoint`, the command that ran it) "
                "and its outputs; kernelspec and language_info set; `metadata.gateway` holds "
                "`{run_id, status, exit_code, started_at, finished_at}`. Opens in JupyterLab "
                "and can be replayed. Sent with `Content-Disposition: attachment`."
            ),
            "responses": {
                "200": {
                    "description": "The notebook.",
                    "content": {"application/x-ipynb+json": {"schema": ref("Notebook")}},
                },
                **errors(401, 404),
            },
        },
    },
}
