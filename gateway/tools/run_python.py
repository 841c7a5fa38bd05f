"""`POST /v1/tools/run_python` (reference/run_python-manual.txt): `{"input": {"vars"},
"params": {source | files + entrypoint | archive_file_id + entrypoint, timeout_seconds}}`
-> `RunRequest`, and the final `RunRecord` -> `{result, stdout, stderr,
stdout_truncated?, stderr_truncated?}`.

Faithful to the manual: `source` has 1-50,000 characters; exactly one of `source`,
`files`, `archive_file_id`; at most 64 files of at most 64 KiB each and 96 KiB for the
whole request in files mode; `timeout_seconds` 1-30 (default 5); every violation is a 400
(a validation error, not a failed run). Runs get no network and 512 MB of memory.
`stdout` and `stderr` are cut to their first 64 KiB; the `*_truncated` flags appear only
when true. `result` is the value of `result` (else `output`) after a successful run, null
otherwise; a traceback, and a line saying why the gateway ended the run (timeout, memory),
go to `stderr` (within its 64 KiB).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gateway.auth import Principal
from gateway.errors import ConflictingFields, Forbidden, InvalidRequest
from gateway.models import tools as limits
from gateway.models.record import RunRecord
from gateway.models.request import RunRequest
from gateway.models.run import checked_path
from gateway.runs.requests import parse_run_request
from gateway.settings import Settings
from gateway.tools import (
    cut_bytes,
    error_text,
    kill_sentence,
    reject_unknown,
    renamed_fields,
    require_object,
    timeout_in_range,
)

# the manual's limits, written once in gateway.models.tools
TYPE = limits.RUN_PYTHON_TYPE
INPUT = frozenset(limits.RunPythonInput.model_fields)
PARAMS = frozenset(limits.RunPythonParams.model_fields)
MAX_SOURCE_CHARS = limits.RUN_PYTHON_SOURCE_CHARS
MAX_FILES = limits.RUN_PYTHON_MAX_FILES
MAX_FILE_BYTES = limits.RUN_PYTHON_MAX_FILE_BYTES
MAX_REQUEST_BYTES = limits.RUN_PYTHON_MAX_REQUEST_BYTES
MIN_TIMEOUT, MAX_TIMEOUT, DEFAULT_TIMEOUT = limits.RUN_PYTHON_TIMEOUT
STREAM_CAP_BYTES = limits.RUN_PYTHON_STREAM_BYTES
MEMORY_BYTES = limits.RUN_PYTHON_MEMORY_BYTES

_RENAMES = {
    "code": "params.source",
    "entrypoint": "params.entrypoint",
    "files": "params.files",
    "archive": "params.archive_file_id",
    "timeout": "params.timeout_seconds",
    "vars": "input.vars",
}


@dataclasses.dataclass(frozen=True)
class RunPythonCall:
    request: RunRequest


def parse_run_python(
    body: Any,
    settings: Settings,
    caller: Principal,
    *,
    archives: bool = False,
) -> RunPythonCall:
    """Validate a run_python body. `archives`: an upload store exists to unpack
    `archive_file_id` from (it also needs the operator's `allow_uploads`)."""
    envelope = require_object(body, None, "The request body")  # other step keys are ignored
    kind = envelope.get("type", TYPE)
    if kind != TYPE:
        raise InvalidRequest(f"`type` must be {TYPE!r}.", field="type")
    input_ = envelope.get("input")
    input_ = require_object({} if input_ is None else input_, "input", "`input`")
    reject_unknown(input_, INPUT, "input.")
    params = require_object(envelope.get("params"), "params", "`params`")
    reject_unknown(params, PARAMS, "params.")

    source = params.get("source")
    files = params.get("files")
    archive = params.get("archive_file_id")
    entrypoint = params.get("entrypoint")
    choices = (("source", source), ("files", files), ("archive_file_id", archive))
    given = [name for name, value in choices if value is not None]
    if not given:
        raise InvalidRequest(
            "Set exactly one of `params.source`, `params.files` or `params.archive_file_id`.",
            field="params.source",
        )
    if len(given) > 1:
        raise ConflictingFields(
            f"`params.{given[0]}` and `params.{given[1]}` are mutually exclusive: set exactly one.",
            field=f"params.{given[1]}",
        )
    if archive is not None and not (settings.allow_uploads and archives):
        raise Forbidden(
            "Archive mode is disabled on this gateway: `archive_file_id` cannot be used.",
            field="params.archive_file_id",
            code="archive_mode_disabled",
        )
    if source is not None:
        _check_source(source)
        if entrypoint is not None:
            raise ConflictingFields(
                "`params.entrypoint` goes with `files` or `archive_file_id`, not `source`.",
                field="params.entrypoint",
            )
    elif entrypoint is None:
        raise InvalidRequest(
            f"`params.entrypoint` is required with `params.{given[0]}`: name the file that runs.",
            field="params.entrypoint",
        )
    staged = None if files is None else _files(files, envelope)
    run_body = {
        "code": source,
        "entrypoint": entrypoint,
        "files": staged,
        "archive": archive,
        "vars": input_.get("vars"),
        "timeout": _timeout(params.get("timeout_seconds")),
    }
    with renamed_fields(_RENAMES):
        request = parse_run_request(run_body, settings, caller)
    request = dataclasses.replace(request, network=False, memory_bytes=MEMORY_BYTES)
    return RunPythonCall(request=request)


def _check_source(source: Any) -> None:
    if not isinstance(source, str) or not 1 <= len(source) <= MAX_SOURCE_CHARS:
        raise InvalidRequest(
            f"`params.source` must be Python source of 1 to {MAX_SOURCE_CHARS:,} characters.",
            field="params.source",
        )


def _files(files: Any, envelope: Any) -> list[dict[str, str]]:
    if not isinstance(files, dict) or not files:
        raise InvalidRequest(
            "`params.files` must be a non-empty object of path -> content.", field="params.files"
        )
    if len(files) > MAX_FILES:
        raise InvalidRequest(
            f"{len(files)} files given; at most {MAX_FILES} are allowed.", field="params.files"
        )
    staged = []
    for path, content in files.items():
        field = f"params.files[{json.dumps(path)}]"
        checked_path(path, field)
        if not isinstance(content, str):
            raise InvalidRequest("A file's content must be a string.", field=field)
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > MAX_FILE_BYTES:
            raise InvalidRequest(
                f"The file {path!r} has {size} bytes; at most {MAX_FILE_BYTES} (64 KiB) are "
                "allowed per file.",
                field=field,
            )
        staged.append({"path": path, "content": content})
    whole = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
    size = len(whole.encode("utf-8", "surrogatepass"))
    if size > MAX_REQUEST_BYTES:
        raise InvalidRequest(
            f"The request has {size} bytes (files, vars and all); at most {MAX_REQUEST_BYTES} "
            "(96 KiB) are allowed with `files`.",
            field="params.files",
        )
    return staged


def _timeout(value: Any) -> float:
    return timeout_in_range(
        value, DEFAULT_TIMEOUT, MIN_TIMEOUT, MAX_TIMEOUT, "params.timeout_seconds"
    )


# --- the answer ---------------------------------------------------------------------------


def run_python_answer(call: RunPythonCall, record: RunRecord) -> dict[str, Any]:
    stdout, stdout_cut = cut_bytes(record.stdout, STREAM_CAP_BYTES)
    messages = "".join(line + "\n" for line in gateway_lines(call, record))
    room = STREAM_CAP_BYTES - len(messages.encode("utf-8"))
    stderr, stderr_cut = cut_bytes(record.stderr + error_text(record), room)
    answer: dict[str, Any] = {
        "result": record.result if record.status == "succeeded" else None,
        "stdout": stdout,
        "stderr": stderr + messages,
    }
    if stdout_cut or record.stdout_truncated:
        answer["stdout_truncated"] = True
    if stderr_cut or record.stderr_truncated:
        answer["stderr_truncated"] = True
    return answer


def gateway_lines(call: RunPythonCall, record: RunRecord) -> list[str]:
    """What the gateway adds to stderr: why it ended the run, why `result` is missing."""
    lines = []
    if record.kill_reason == "timeout":
        lines.append(f"Killed: the run exceeded timeout_seconds ({call.request.timeout:g} s).")
    killed = kill_sentence(record, call.request.memory_bytes)
    if killed:
        lines.append(killed)
    if record.status == "succeeded" and record.result_note:
        lines.append(record.result_note)
    return lines
