"""`POST /v1/tools/run_python` (reference/run_python-manual.txt): `{"input": {"vars"},
"params": {source | files + entrypoint | archive_file_id + entrypoint, timeout_seconds}}`
-> `RunRequest`, and the final `RunRecord` -> `{result, stdout, stderr,
stdout_truncated?, stderr_truncated?}`.

The body is `RunPythonBody` (gateway.models.tools, with the manual's limits); what depends
on the gateway comes after: archive mode needs uploads, and the run gets no network and
512 MB of memory. `stdout` and `stderr` are cut to their first 64 KiB; the `*_truncated`
flags appear only when true. `result` is the value of `result` (else `output`) after a
successful run, null otherwise; a traceback, and a line saying why the gateway ended the
run (timeout, memory) or why `result` is missing, go to `stderr` (within its 64 KiB).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.auth import Principal
from gateway.errors import Forbidden, InvalidRequest
from gateway.models.record import RunRecord
from gateway.models.request import RunRequest
from gateway.models.tools import (
    RUN_PYTHON_MEMORY_BYTES,
    RUN_PYTHON_STREAM_BYTES,
    RunPythonAnswer,
    RunPythonBody,
)
from gateway.runs.config import RequestPolicy
from gateway.runs.requests import parse_run_request
from gateway.tools import cut_bytes, error_text, kill_sentence, renamed_fields

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
    policy: RequestPolicy,
    caller: Principal,
    *,
    archives: bool = False,
) -> RunPythonCall:
    """Validate a run_python body. `archives`: an upload store exists to unpack
    `archive_file_id` from (it also needs the operator's `allow_uploads`)."""
    params = (parsed := RunPythonBody.parse(body)).params
    if params.archive_file_id is not None and not (policy.allow_uploads and archives):
        raise Forbidden(
            "Archive mode is disabled on this gateway: `archive_file_id` cannot be used.",
            field="params.archive_file_id",
            code="archive_mode_disabled",
        )
    if params.source is None and params.entrypoint is None:
        given = "files" if params.files is not None else "archive_file_id"
        raise InvalidRequest(
            f"`params.entrypoint` is required with `params.{given}`: name the file that runs.",
            field="params.entrypoint",
        )
    files = params.files or {}
    run_body = {
        "code": params.source,
        "entrypoint": params.entrypoint,
        "files": [{"path": path, "content": text} for path, text in files.items()] or None,
        "archive": params.archive_file_id,
        "vars": parsed.input.vars,
        "timeout": params.timeout_seconds,
    }
    with renamed_fields(_RENAMES):
        request = parse_run_request(run_body, policy, caller)
    request = dataclasses.replace(request, network=False, memory_bytes=RUN_PYTHON_MEMORY_BYTES)
    return RunPythonCall(request=request)


# --- the answer ---------------------------------------------------------------------------


def run_python_answer(call: RunPythonCall, record: RunRecord) -> RunPythonAnswer:
    stdout, stdout_cut = cut_bytes(record.stdout, RUN_PYTHON_STREAM_BYTES)
    messages = "".join(line + "\n" for line in gateway_lines(call, record))
    room = RUN_PYTHON_STREAM_BYTES - len(messages.encode("utf-8"))
    stderr, stderr_cut = cut_bytes(record.stderr + error_text(record), room)
    return RunPythonAnswer(
        result=record.result if record.status == "succeeded" else None,
        stdout=stdout,
        stderr=stderr + messages,
        stdout_truncated=True if stdout_cut or record.stdout_truncated else None,
        stderr_truncated=True if stderr_cut or record.stderr_truncated else None,
    )


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
