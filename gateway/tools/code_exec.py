"""`POST /v1/tools/code_exec` (reference/code_exec-manual.txt): `{code, working_dir?,
timeout?, background?}` -> a Python `RunRequest`, and the final `RunRecord` ->
`{success, exit_code, output}`.

Faithful to the manual: the timeout is clamped, never refused (below 1 -> 1, above 300 ->
300, a non-numeric value -> 30; a detached call without one gets 300); `working_dir` follows
the run pipeline's rules (a non-admin is confined to their workspace, an absolute path
outside it is silently replaced by its root); `output` interleaves stdout and stderr as
they arrived with every stderr line prefixed `[stderr] `, and is `(no output)` when empty;
on timeout nothing of the run is returned: `{success: false, error: "timeout", output:
"Code execution timed out after Ns"}`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gateway.auth import Principal
from gateway.errors import InvalidRequest
from gateway.models import tools as limits
from gateway.models.record import RunRecord
from gateway.models.request import RunRequest
from gateway.runs.requests import parse_run_request
from gateway.settings import Settings
from gateway.tools import (
    kill_sentence,
    prefix_stderr,
    process_exit_code,
    program_chunks,
    reject_unknown,
    require_object,
)

# the manual's limits, written once in gateway.models.tools
FIELDS = frozenset(limits.CodeExecBody.model_fields)
MIN_TIMEOUT, MAX_TIMEOUT, DEFAULT_TIMEOUT = limits.CODE_EXEC_TIMEOUT
BACKGROUND_TIMEOUT = limits.CODE_EXEC_BACKGROUND_TIMEOUT
STDERR_PREFIX = limits.CODE_EXEC_STDERR_PREFIX
NO_OUTPUT = limits.CODE_EXEC_NO_OUTPUT


@dataclasses.dataclass(frozen=True)
class CodeExecCall:
    request: RunRequest


def parse_code_exec(body: Any, settings: Settings, caller: Principal) -> CodeExecCall:
    """Validate a code_exec body (the timeout is clamped, never a 400)."""
    body = require_object(body, None, "The request body")
    reject_unknown(body, FIELDS, "")
    code = body.get("code")
    if not isinstance(code, str):
        raise InvalidRequest("`code` (Python source, a string) is required.", field="code")
    background = body.get("background", False)
    if background is None:
        background = False
    run_body = {
        "code": code,
        "language": "python",
        "timeout": exec_timeout(body.get("timeout"), background is True),
        "working_dir": body.get("working_dir"),
        "background": background,
    }
    return CodeExecCall(request=parse_run_request(run_body, settings, caller))


def exec_timeout(value: Any, background: bool) -> float:
    """The manual's clamp: 0 -> 1, 10000 -> 300, non-numeric -> 30, none when detached -> 300."""
    if value is None:
        return BACKGROUND_TIMEOUT if background else DEFAULT_TIMEOUT
    if isinstance(value, bool):
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT
    if math.isnan(seconds):
        return DEFAULT_TIMEOUT
    return min(max(seconds, MIN_TIMEOUT), MAX_TIMEOUT)


def code_exec_answer(call: CodeExecCall, record: RunRecord) -> dict[str, Any]:
    if record.kill_reason == "timeout":
        return {
            "success": False,
            "error": "timeout",
            "output": f"Code execution timed out after {call.request.timeout:g}s",
        }
    output = prefix_stderr(program_chunks(record), STDERR_PREFIX)
    killed = kill_sentence(record)
    if killed:
        newline = "\n" if output and not output.endswith("\n") else ""
        output += f"{newline}{STDERR_PREFIX}{killed}\n"
    return {
        "success": record.success,
        "exit_code": process_exit_code(record),
        "output": output or NO_OUTPUT,
    }
