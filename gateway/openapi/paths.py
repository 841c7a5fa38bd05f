"""The API's operations: one small table of paths, each operation's id, tag, summary,
description, request body and answers by name. The shapes themselves are the generated
components (`gateway.openapi.schemas`)."""

from __future__ import annotations

from typing import Any, get_args

from gateway.models.common import LANGUAGES, Status
from gateway.models.listing import DEFAULT_LIMIT, MAX_LIMIT
from gateway.openapi.errors import UPLOAD_ERROR_CODES, errors
from gateway.uploads.archives import RAW_TYPES

Schema = dict[str, Any]

JSON_BODIES = (
    "The body is read as JSON only when its Content-Type is `application/json` or an "
    "`application/<x>+json` type; any other media type, or none (`curl -d` without "
    "`-H 'Content-Type: application/json'`), is 415 unsupported_media_type. JSON nested more "
    "than `max_json_depth` (default 64) levels deep is 400 invalid_request."
)
LOCATION = {"Location": {"description": "/v1/runs/{id}", "schema": {"type": "string"}}}
TEXT = {"type": "string"}
BINARY = {"type": "string", "format": "binary"}


SNAPSHOT_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^snap_[A-Za-z0-9_-]{16,64}$"},
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def answer(schema: Schema | str, description: str, media: str = "application/json") -> Schema:
    """A response: a component's name (JSON) or a schema in another media type."""
    if isinstance(schema, str):
        schema = ref(schema)
    return {"description": description, "content": {media: {"schema": schema}}}


def operation(
    operation_id: str,
    tag: str,
    summary: str,
    description: str,
    responses: Schema,
    *,
    body: Schema | str | None = None,
    body_text: str = "The tool call.",
    public: bool = False,
    extra: Schema | None = None,
) -> Schema:
    out: Schema = {
        "operationId": operation_id,
        "tags": [tag],
        "summary": summary,
        "description": description,
    }
    if public:
        out["security"] = []
    if body is not None:
        schema = ref(body) if isinstance(body, str) else body
        out["requestBody"] = {
            "required": True,
            "description": f"{body_text} {JSON_BODIES}",
            "content": {"application/json": {"schema": schema}},
        }
    out["responses"] = responses
    return {**out, **(extra or {})}


RUN_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "a run id (`run_` + hex), as answered by POST /v1/runs",
    "schema": {"type": "string", "pattern": "^(run_[0-9a-f]{1,64}|[A-Za-z0-9_-]{1,100})$"},
}
PAGE = (
    "Public (the page holds no data): it asks for the token when the gateway has tokens and "
    "sends it in the WebSocket handshake and as a Bearer header to the runs API (the "
    "history). Sent with a strict Content-Security-Policy (scripts and styles from this "
    "gateway only, no inline script, inline style only by a nonce and a hash; nothing may "
    "frame it)."
)
PAGE_FILES = {
    "text/javascript": TEXT,
    "text/css": TEXT,
    "application/json": {},
}

LIST_PARAMETERS = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": f"runs per page, 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIMIT,
            "default": DEFAULT_LIMIT,
        },
    },
    {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": "`next` of the previous page",
        "schema": {"type": "string", "maxLength": 2000},
    },
    {
        "name": "status",
        "in": "query",
        "required": False,
        "description": "only runs of this status",
        "schema": {"enum": list(get_args(Status))},
    },
    {
        "name": "language",
        "in": "query",
        "required": False,
        "description": "only runs of this language",
        "schema": {"enum": list(LANGUAGES)},
    },
    {
        "name": "user",
        "in": "query",
        "required": False,
        "description": "admins: list this user's runs instead (anyone else: 403, unless it "
        "names themselves)",
        "schema": {"type": "string", "minLength": 1, "maxLength": 256},
    },
]

PATHS: dict[str, Schema] = {
    "/v1/runs": {
        "post": operation(
            "createRun",
            "runs",
            "Run code in a fresh kernel and wait for the result",
            "Runs the code in a fresh kernel in its own sandbox and answers when it ends. User "
            "code that fails is not an HTTP error: it is a 200 record with `status: failed`. A "
            "run that cannot be admitted is 429 capacity with `Retry-After` (all run slots busy "
            "and the queue full, or the caller's per-user limit of runs in progress reached). A "
            "kernel that cannot start is 503 sandbox_unavailable.",
            {
                "200": answer("RunRecord", "The finished run."),
                "202": {
                    **answer("RunAccepted", "`background: true`: the run was queued."),
                    "headers": LOCATION,
                },
                **errors(400, 401, 403, 404, 409, 410, 413, 415, 429, 503),
            },
            body="RunRequest",
            body_text="What to run.",
        ),
        "get": operation(
            "listRuns",
            "runs",
            "The caller's runs, newest first, a page at a time",
            "Each run as a summary (`RunSummary`), newest first (by submission time; ties by "
            "id). `next` is the cursor of the following page, null on the last. The records "
            "listed are those still kept (see GET /v1/runs/{id}). A cursor continues the "
            "listing it came from: one of another listing (another user, other filters) or "
            "one that is not a cursor is 400 invalid_request (field `cursor`), as is a "
            "`limit` outside [1, 100], a `status` or `language` that is not one, or a "
            "parameter given twice. `user` (another user's runs) is for admins: 403 for "
            "anyone else.",
            {"200": answer("RunList", "A page of runs."), **errors(400, 401, 403, 413, 503)},
            extra={"parameters": LIST_PARAMETERS},
        ),
    },
    "/v1/runs/{id}": {
        "parameters": [RUN_ID],
        "get": operation(
            "getRun",
            "runs",
            "A run's record",
            "`status` is `queued` or `running` while a background run is in progress. Records "
            "are kept for the operator's TTL (default 7 days), and each user keeps at most "
            "`max_records_per_user` (default 1000) records of at most "
            "`max_record_store_bytes_per_user` (default 1 GiB) in all: past that, the user's "
            "oldest finished records are deleted (404 from then on); records of runs in "
            "progress never are. Another user's run is 404 (admins see every run).",
            {"200": answer("RunRecord", "The run record."), **errors(401, 404, 413, 503)},
        ),
        "delete": operation(
            "cancelRun",
            "runs",
            "Cancel a queued or running run",
            "Its kernel and sandbox are destroyed and the answer is the record with `status: "
            "cancelled`, `kill_reason: cancelled` and whatever output came before. A run that "
            "already ended is left as it is (the answer is its record).",
            {
                "200": answer("RunRecord", "The record after cancelling."),
                **errors(401, 404, 413, 503),
            },
        ),
    },
    "/v1/runs/{id}/notebook": {
        "parameters": [RUN_ID],
        "get": operation(
            "getRunNotebook",
            "runs",
            "The run as an nbformat v4 notebook",
            "One code cell with the code (for an `entrypoint`, the command that ran it) and its "
            "outputs; kernelspec and language_info set; `metadata.gateway` holds `{run_id, "
            "status, exit_code, started_at, finished_at}`. Opens in JupyterLab and can be "
            "replayed. Sent with `Content-Disposition: attachment`.",
            {
                "200": answer(ref("Notebook"), "The notebook.", "application/x-ipynb+json"),
                **errors(401, 404, 413, 503),
            },
        ),
    },
    "/v1/notebooks/run": {
        "post": operation(
            "runNotebook",
            "notebooks",
            "Run every code cell of a notebook in one fresh kernel",
            "The body is an nbformat notebook (v4, or older and converted to v4), or "
            "`{notebook, timeout, cell_timeout, allow_errors, files, return_files, vars, env, "
            "network}`. All code cells run in order in one fresh kernel: state flows between "
            "the cells of this notebook, never between requests. An invalid notebook is 400 "
            "invalid_request (field `notebook`) with nbformat's reason in the message. A cell "
            "that fails is not an HTTP error: the answer is a 200 with `run.status: failed`.",
            {
                "200": answer("NotebookRunAnswer", "The executed notebook and its record."),
                **errors(400, 401, 403, 413, 415, 429, 503),
            },
            body={"anyOf": [ref("Notebook"), ref("NotebookRunRequest")]},
            body_text="A notebook, or a notebook with options.",
        )
    },
    "/v1/snapshots": {
        "get": operation(
            "listSnapshots",
            "snapshots",
            "Your snapshots",
            "The kernel states your runs kept (`keep`), least recently used first. A snapshot "
            "goes when no run has started from it for `snapshot_ttl` (default 1 h), or when "
            "keeping another would put you over `snapshots_per_user` (default 10) or "
            "`snapshot_bytes_per_user` (default 4 GiB) of their own memory: your least "
            "recently used go first. Snapshots live in their gateway's memory: a restart "
            "loses them.",
            {"200": answer("SnapshotList", "The caller's snapshots."), **errors(401)},
        )
    },
    "/v1/usage": {
        "get": operation(
            "getUsage",
            "operations",
            "What your runs spent, and may still spend",
            "CPU-seconds, runs and peak memory by rolling hour and day, by hour (48 h) and by "
            "day (30 days), your budget (`cpu_seconds_per_hour`, `cpu_seconds_per_day`, "
            "`runs_per_minute`: null when none) and what you keep stored. An admin sees every "
            "user with runs in the last 30 days, or the one `user` names; anyone else naming "
            "another user is 403.",
            {"200": answer("UsageList", "The usage asked for."), **errors(400, 401, 403)},
            extra={
                "parameters": [
                    {
                        "name": "user",
                        "in": "query",
                        "required": False,
                        "description": "admins: this user's usage only",
                        "schema": {"type": "string", "minLength": 1, "maxLength": 256},
                    }
                ]
            },
        )
    },
    "/v1/snapshots/{id}": {
        "parameters": [SNAPSHOT_ID],
        "delete": operation(
            "deleteSnapshot",
            "snapshots",
            "Delete a snapshot",
            "Gone at once for every later `from` (410). Runs already continuing from it "
            "finish first: it ends when they have.",
            {"204": {"description": "Deleted."}, **errors(401, 404, 410)},
        ),
    },
    "/v1/uploads": {
        "post": operation(
            "upload",
            "uploads",
            "Upload a .zip or .tar.gz/.tgz for later runs",
            "Off unless the operator enabled uploads (`--allow-uploads`): 403 "
            "archive_mode_disabled. The body is the archive itself (raw: any of the media "
            "types below, `application/x-www-form-urlencoded` as `curl --data-binary` sends, or "
            "none) or a multipart/form-data form holding exactly one file; the format is told "
            "by the archive's first bytes. Everything is checked before anything is unpacked, "
            "and again while unpacking. Each violation has its own code: 413 "
            + ", ".join(UPLOAD_ERROR_CODES[413])
            + "; 400 "
            + ", ".join(UPLOAD_ERROR_CODES[400])
            + " (a malformed multipart body or not exactly one file). Uploads belong to the "
            "caller and are kept for `upload_ttl` (default 24 h); each user keeps at most "
            "`max_uploads_per_user` (default 100) of at most `max_upload_store_bytes_per_user` "
            "(default 512 MiB) stored bytes in all: a new upload deletes the caller's oldest "
            "past that (a run naming a deleted upload is 404, as for an expired one). Browsers: "
            "the cross-site rules of every endpoint apply (a form on another site cannot "
            "upload).",
            {
                "201": answer("Upload", "The archive passed every check and is stored."),
                **errors(400, 401, 403, 413, 415, 503),
            },
            extra={
                "requestBody": {
                    "required": True,
                    "content": {
                        **{media: {"schema": BINARY} for media in RAW_TYPES},
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file"],
                                "properties": {"file": BINARY},
                            }
                        },
                    },
                },
                "x-error-codes": {str(k): v for k, v in UPLOAD_ERROR_CODES.items()},
            },
        )
    },
    "/v1/tools/code_run": {
        "post": operation(
            "toolCodeRun",
            "tools",
            "code_run: run Python, bash, JavaScript, TypeScript or R; get output, exit code and "
            "files",
            "The code_run tool's call (its manual is in `reference/`).",
            {
                "200": answer("CodeRunAnswer", "The tool's result."),
                **errors(400, 401, 403, 413, 415, 429, 503),
            },
            body="CodeRunRequest",
        )
    },
    "/v1/tools/run_python": {
        "post": operation(
            "toolRunPython",
            "tools",
            "run_python: run a Python snippet and return the value of `result`",
            "The run_python tool's step (its manual is in `reference/`).",
            {
                "200": answer("RunPythonAnswer", "The tool's result."),
                **errors(400, 401, 403, 404, 413, 415, 429, 503),
            },
            body="RunPythonRequest",
        )
    },
    "/v1/tools/code_exec": {
        "post": operation(
            "toolCodeExec",
            "tools",
            "code_exec: run Python, get `{success, exit_code, output}`",
            "A non-zero exit is a 200 with `success: false` and the output (usually the "
            "traceback). `background: true` answers 202 `{task_id}` at once.",
            {
                "200": answer("CodeExecAnswer", "The tool's result."),
                "202": {
                    **answer("CodeExecStarted", "`background: true`: the run is queued."),
                    "headers": LOCATION,
                },
                **errors(400, 401, 403, 413, 415, 429, 503),
            },
            body="CodeExecRequest",
        )
    },
    "/v1/stream": {
        "get": operation(
            "stream",
            "stream",
            "WebSocket: run code and receive its output live",
            "Open a WebSocket here (the GET is the handshake). Authenticate with "
            "`Authorization: Bearer <token>` or, because browsers cannot set headers, with "
            "`?token=` (the only place a token is accepted in a URL; it is kept out of the "
            "access log). A browser's Origin must be the gateway's own or one the operator "
            "allowed (`allowed_origins`; `*` only with tokens), and `Sec-Fetch-Site: "
            "cross-site` without an allowed Origin is refused, else 403; without tokens the "
            "page must also have been reached by a loopback name. A message nested more than "
            "`max_json_depth` levels deep gets an `invalid_request` error.\n\n"
            "One connection carries many runs. Every message is one JSON text frame (binary "
            'frames are refused). The client sends `{"type": "run", "ref": "<client id>", '
            "...the fields of POST /v1/runs}`; the gateway answers, in order, for that `ref`: "
            '`{"type": "accepted", "ref", "id"}`, zero or more `{"type": "output", "ref", '
            '"id", "output": <nbformat output>}` as they are produced, then `{"type": "done", '
            '"ref", "id", "run": <run record>}`. Messages of concurrent runs interleave. The '
            'client may send `{"type": "cancel", "id"}`. A malformed or refused message gets '
            '`{"type": "error", "ref", "error": {code, message, field?}}` and the connection '
            "stays open. Output is rate- and size-capped exactly as in the run record; a "
            "client that reads too slowly gets `output_dropped` instead of some live outputs, "
            "and so does one whose output event would be larger than `max_event_bytes` "
            "(default 16 MiB). A `done` event is never dropped, but its record is cut to "
            "`max_event_bytes` like a record to `max_record_bytes` (a note says so; the whole "
            "record is at GET /v1/runs/{id}), and it waits while the client has not read what "
            "was sent before. A client that does not answer the gateway's pings (every 30 s) "
            "within 30 s is disconnected. Each user may keep `max_streams_per_user` (default "
            "8) connections open; one more is 429 capacity with `Retry-After`. Closing the "
            "connection cancels its runs still in progress.\n\n"
            'A notebook is replayed with `{"type": "notebook", "ref", "notebook", ...the other '
            "fields of POST /v1/notebooks/run}` (the same validation, caps, budgets, deadline "
            'and policy): `accepted`, then for each code cell that runs `{"type": '
            '"cell_started", "ref", "id", "index", "cell_id"}`, its `output` events (with '
            '`index`), `{"type": "cell_finished", "ref", "id", "index", "cell_id", '
            '"execution_count", "status", "duration_ms"}`, and at the end `{"type": "done", '
            '"ref", "id", "run", "notebook"}` with the run record and the executed notebook. '
            "`cancel` stops the replay: `done` has `run.status: cancelled` and the cells run "
            "so far. A slow reader may miss cell events as it misses outputs "
            "(`output_dropped` counts both); `done` has everything. The message schemas are "
            "listed in `x-websocket-messages`.",
            {
                "101": {"description": "Switching to the WebSocket protocol."},
                **errors(400, 401, 403, 413, 429),
            },
            extra={
                "security": [{"bearer": []}, {"queryToken": []}],
                "parameters": [
                    {
                        "name": "token",
                        "in": "query",
                        "required": False,
                        "description": "the bearer token, for browsers",
                        "schema": TEXT,
                    }
                ],
                "x-websocket-messages": {
                    "client": [
                        ref("StreamRunMessage"),
                        ref("StreamNotebookMessage"),
                        ref("StreamCancelMessage"),
                    ],
                    "server": [
                        ref(f"Stream{kind}Message")
                        for kind in (
                            "Accepted",
                            "CellStarted",
                            "Output",
                            "OutputDropped",
                            "CellFinished",
                            "Done",
                            "Error",
                        )
                    ],
                },
            },
        )
    },
    "/v1/health": {
        "get": operation(
            "health",
            "operations",
            "Is the gateway up",
            "Public: no token needed. On a gateway with tokens the answer is only "
            "`{status}`, unless the caller sends an admin's token or the operator's metrics "
            "token (`--metrics-token-file`): the backend, the store, kernels, pools and "
            "version tell of every tenant's activity, so a user's token is not told them. "
            "A single-user gateway tells everything.",
            {
                "200": answer("Health", "The gateway's state."),
                **errors(413),
                "503": answer(
                    "Health", "The run store cannot be reached: this gateway is not ready."
                ),
            },
            public=True,
        )
    },
    "/v1/environment": {
        "get": operation(
            "environment",
            "operations",
            "What the kernels have: languages, kernels, installed packages",
            "The languages a run may ask for on this gateway, each with its kernel and their "
            "versions and the packages its code can import, read from the kernels' own "
            "environment (the kernel image lists its contents when it is built; the local "
            "backend lists the environment it runs kernels from). Runs have no network, so "
            "nothing else can be installed at run time. `source: unknown` when the backend "
            "could not tell (then every supported language is listed, without packages).",
            {"200": answer("Environment", "The kernels' environment."), **errors(401, 413)},
        )
    },
    "/metrics": {
        "get": operation(
            "metrics",
            "operations",
            "Prometheus metrics",
            "Runs by status and language, run duration and kernel start duration histograms, "
            "pool size, queue length, runs in progress: every tenant's activity, so on a "
            "gateway with tokens only for an admin's token or the operator's metrics token "
            "(`--metrics-token-file`, a Prometheus scrape's bearer token, which opens nothing "
            "else); a user's token is 403. A single-user gateway needs none.",
            {
                "200": answer(TEXT, "Prometheus text exposition format 0.0.4.", "text/plain"),
                **errors(401, 403, 413),
            },
        )
    },
    "/openapi.json": {
        "get": operation(
            "openapi",
            "operations",
            "This document",
            "Public: no token needed.",
            {
                "200": answer({"type": "object"}, "The OpenAPI 3.1 document."),
                **errors(413),
            },
            public=True,
        )
    },
    "/": {
        "get": operation(
            "page",
            "stream",
            "A browser page to run code and watch its output live",
            PAGE,
            {"200": answer(TEXT, "The page.", "text/html"), **errors(404, 413)},
            public=True,
        )
    },
    "/static/{name}": {
        "get": operation(
            "pageFile",
            "stream",
            "The page's bundle: its scripts, style sheet and their source maps",
            PAGE,
            {
                "200": {
                    "description": "The file.",
                    "content": {media: {"schema": s} for media, s in PAGE_FILES.items()},
                },
                **errors(404, 413),
            },
            public=True,
            extra={
                "parameters": [
                    {
                        "name": "name",
                        "in": "path",
                        "required": True,
                        "description": "a file of the page's bundle, named after its content, "
                        "e.g. `dist/page-7WPP5CGY.js` (the page names the current ones)",
                        "schema": TEXT,
                    }
                ]
            },
        )
    },
}
