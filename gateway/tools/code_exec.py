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
from typing import Any

from gateway.auth import Principal
from gateway.models.record import RunRecord
from gateway.models.request import RunRequest
from gateway.models.run import RunBody
from gateway.models.tools import (
    CODE_EXEC_BACKGROUND_TIMEOUT,
    CODE_EXEC_NO_OUTPUT,
    CODE_EXEC_STDERR_PREFIX,
    CODE_EXEC_TIMEOUT,
    CodeExecBody,
    CodeExecResult,
    CodeExecTimeout,
    clamped_timeout,
)
from gateway.runs.config import RequestPolicy
from gateway.runs.requests import run_request
from gateway.tools import (
    kill_sentence,
    prefix_stderr,
    process_exit_code,
    program_chunks,
)


@dataclasses.dataclass(frozen=True)
class CodeExecCall:
    request: RunRequest


def parse_code_exec(data: Any, policy: RequestPolicy, caller: Principal) -> CodeExecCall:
    """Validate a code_exec body (the timeout is clamped, never a 400)."""
    body = CodeExecBody.parse(data)
    background = bool(body.background)
    run = {
        "code": body.code,
        "language": "python",
        "timeout": exec_timeout(body.timeout, background),
        "working_dir": body.working_dir,
        "background": background,
    }
    return CodeExecCall(request=run_request(RunBody.parse(run), policy, caller))


def exec_timeout(value: Any, background: bool) -> float:
    """The manual's clamp: 0 -> 1, 10000 -> 300, non-numeric -> 30, none when detached -> 300."""
    if value is None:
        return CODE_EXEC_BACKGROUND_TIMEOUT if background else CODE_EXEC_TIMEOUT[2]
    return float(clamped_timeout(value))


def code_exec_answer(call: CodeExecCall, record: RunRecord) -> CodeExecResult | CodeExecTimeout:
    if record.kill_reason == "timeout":
        return CodeExecTimeout(
            success=False,
            error="timeout",
            output=f"Code execution timed out after {call.request.timeout:g}s",
        )
    output = prefix_stderr(program_chunks(record), CODE_EXEC_STDERR_PREFIX)
    killed = kill_sentence(record)
    if killed:
        newline = "\n" if output and not output.endswith("\n") else ""
        output += f"{newline}{CODE_EXEC_STDERR_PREFIX}{killed}\n"
    return CodeExecResult(
        success=record.success,
        exit_code=process_exit_code(record),
        output=output or CODE_EXEC_NO_OUTPUT,
    )
