"""The OpenAPI 3.1 document of the gateway's API.

Its component schemas are generated from the pydantic models that parse the bodies and
describe the answers, and from nbformat's own schema (`schemas`); the paths are a small
hand-written table (`paths`); the error answers and their codes are in `errors`.
`tests/test_openapi.py` checks that it is valid OpenAPI 3.1, that its paths and methods are
exactly the routes of `gateway.app`, that real answers validate against it, and fuzzes the
real app from it.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from gateway.openapi.errors import ERROR_CODES, Schema, error_response_components
from gateway.openapi.paths import PATHS
from gateway.openapi.schemas import component_schemas
from gateway.version import __version__

__all__ = ["ERROR_CODES", "build_document"]

_DESCRIPTION = """\
Every request runs in a **fresh Jupyter kernel** (Python: ipykernel; bash: the gateway's own
bash kernel) in its own sandbox (a container, or a local process sandbox), which is destroyed
after the run: nothing carries over between requests.

**Conventions.** JSON in, JSON out, UTF-8. Times are seconds on input (floats allowed) and
milliseconds on output (`*_ms`); sizes are bytes; timestamps are RFC 3339 (UTC, `Z`).

**Authentication.** `Authorization: Bearer <token>` on every endpoint except `GET /v1/health`,
`GET /openapi.json` and the browser page (`/` and `/static/...`). Tokens come from the
operator's token file (each maps to a user and a role, `user` or `admin`) and are compared in
constant time; a token is accepted in a URL only in the WebSocket handshake
(`/v1/stream?token=`). With no token file the gateway runs single-user (every request is
the admin `local`), listens on loopback only, and answers only requests whose `Host` is a
loopback name (`localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]`); any other `Host` is 403
`forbidden`, so that a DNS-rebound web page cannot run code as the local user.

**Cross-site requests.** A request whose `Origin` is neither the gateway's own (same host
and port as `Host`) nor one of the operator's `allowed_origins`, or one without `Origin`
that says `Sec-Fetch-Site: cross-site`, is 403 `forbidden` on every endpoint, the WebSocket
included: a web page must not be able to make a developer's browser run code on their
gateway. The one exception is a top-level navigation to the page (`GET /` with
`Sec-Fetch-Mode: navigate`), so that a link still opens it. Clients that send neither header
(curl, SDKs, this document's examples) are not affected.

**Request bodies.** JSON endpoints read the body only when its Content-Type is
`application/json` or an `application/<x>+json` type (e.g. `application/x-ipynb+json`);
any other media type, or none, is 415 `unsupported_media_type`. (The gateway once also read
`application/x-www-form-urlencoded` and missing types, for `curl -d`; no more: those are the
types any web page may send to any address without a CORS preflight. Send
`-H 'Content-Type: application/json'`.) An empty body, invalid JSON, `NaN`/`Infinity`, a
string with a lone surrogate (`"\\ud800"`) or JSON nested more than `max_json_depth`
(default 64) levels deep is 400 `invalid_request`. Unknown fields are 400 `invalid_request`
with `field` naming the first one (the seed-compatible tool endpoints follow their manuals).
A body over the operator's limit (default 48 MiB) is 413, and so is a body sent with any method
but POST; both are refused at the headers, before the body is read. A body that finds no room
among the bodies in flight (`max_body_bytes_in_flight`, per user
`max_body_bytes_in_flight_per_user`) is 503 `capacity` with `Retry-After`, at its headers too
(send `Expect: 100-continue` to learn it before sending the body). Answers are gzip-compressed
when asked (`Accept-Encoding: gzip`).

**Errors** are never HTML and never a stack trace: `{"error": {"code", "message", "field"?}}`
(schema `Error`; the codes by status are in its `x-error-codes`). A message quotes at most
2,000 characters of what was sent, a `field` at most 200. A method an address does
not serve is 405 `method_not_allowed` with an `Allow` header; an unknown address is 404
`not_found`. User code that fails is **not** an HTTP error: it is a 200 run record with
`status: "failed"`.

**Runs.** `timeout` is clamped to [1, `max_timeout`] (default max 300 s) and the clamp is
noted in `notes`. The deadline counts from when the user's code is sent to the kernel;
starting the sandbox and kernel is bounded separately by `kernel_start_timeout` (default
60 s), and a kernel that cannot start is 503 `sandbox_unavailable`. At the deadline the
kernel is interrupted, gets a short grace period, then the sandbox's processes are killed;
what was produced before is returned with `timed_out: true`. `status`/`kill_reason`: a
timeout gives `timed_out`/`timeout`; the memory, process-count and output limits give
`killed` with `memory`, `pids` or `output_limit` (a memory or process limit that struck before
a timeout reports `killed` with that reason and `timed_out: true`; when both struck, `pids`);
a kernel that dies of anything else gives `failed` with exit code 128+signal and a note.
Admission: at most `max_concurrent_runs` run at once and `max_queued_runs` wait; past that,
or past a user's `max_runs_per_user` runs in progress, or while draining, the answer is 429
`capacity` with `Retry-After`.

**Output caps.** `stdout`, `stderr` and `output` are each kept up to the operator's cap
(default 1 MiB): the first and last halves are kept and `[... N bytes truncated ...]` marks
the cut; the `outputs` list has the same cut. Rich outputs (images, HTML) are kept up to 16
MiB per run, display updates included (an update that would pass the cap is not applied);
output far past the caps (64 MiB, display updates and errors included) kills the run
(`output_limit`). An uncaught error's value and traceback are each cut to 256 KiB as they
arrive; `result` is returned only up to 4 MiB of JSON; an output or `result` nested more than
`max_json_depth` levels deep is left out. Whatever the parts add up to, a run record is at
most `max_record_bytes` (default 64 MiB): past it the largest parts are cut first (an output
becomes a short stand-in of the same type, a chart is left out, a returned file becomes an
error entry, `result` null) and a note says so. WebSocket live output stops at the cap; the
final record has the kept head and tail.
"""


@functools.cache
def _document() -> Schema:
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {
            "title": "Kernel gateway",
            "version": __version__,
            "summary": "Run untrusted code, each request in a fresh Jupyter kernel in a sandbox.",
            "description": _DESCRIPTION,
            "license": {"name": "BSD-3-Clause", "identifier": "BSD-3-Clause"},
        },
        "servers": [{"url": "/", "description": "this gateway"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "runs", "description": "Run code, poll, cancel, export as a notebook."},
            {"name": "notebooks", "description": "Replay a notebook in one fresh kernel."},
            {"name": "uploads", "description": "Archives to unpack into a run's folder."},
            {"name": "snapshots", "description": "Kernel states kept for later runs to continue."},
            {"name": "stream", "description": "Live output over a WebSocket, and its page."},
            {"name": "tools", "description": "Adapters for existing code-execution tools."},
            {"name": "operations", "description": "Health, metrics, this document."},
        ],
        "paths": PATHS,
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token from the operator's token file",
                },
                "queryToken": {
                    "type": "apiKey",
                    "in": "query",
                    "name": "token",
                    "description": "only for the WebSocket handshake of /v1/stream",
                },
            },
            "schemas": component_schemas(ERROR_CODES),
            "responses": error_response_components(),
        },
    }


def build_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh deep copy: callers may change it)."""
    return copy.deepcopy(_document())
