"""The program's `result` value, read back from its kernel after the last cell.

ipykernel evaluates it as a user expression: of the last cell's own request when that cell
succeeded (one kernel round trip fewer per run), else of a silent request made after it.
Deno's and IRkernel's have no user expressions, so there it is the `execute_result` of a
request without history, which no cell sees. The kernel measures the value against
`result_cap_bytes` and sends only its size past it; the gateway checks again, since what a
kernel sends is hostile input.
"""

from __future__ import annotations

from typing import Any

from gateway.execution.collector import json_size
from gateway.execution.config import ExecutionConfig
from gateway.execution.errorcap import clip_middle
from gateway.execution.kernel_code import python_result
from gateway.execution.session import KernelSession

SETUP_TIMEOUT = 10.0  # seconds for the gateway's own silent requests
RESULT_EXPRESSION = "gateway_result"  # the name of `result` among a request's user expressions


async def read_result(
    session: KernelSession,
    config: ExecutionConfig,
    user_expressions: bool,
    last_reply: dict[str, Any] | None = None,
    code: str = "",
) -> tuple[Any, str | None, str | None]:
    """The kernel's global `result` (else `output`); why the code's value was not returned
    (not JSON-serialisable, larger than `result_cap_bytes` as JSON, nested deeper than
    `max_json_depth`), or why nothing could be read back at all.

    ipykernel evaluates it as a user expression: of the last cell's request when that cell
    succeeded (`last_reply` carries it), else of a silent request made now. Deno's and
    IRkernel's have no user expressions, so there it is the `execute_result` of `code`
    (`kernel_code.result_code`) in a request without history, which no cell sees."""
    data: dict[str, Any] | None
    if user_expressions:
        evaluated = evaluated_result(last_reply)
        if evaluated is None:
            reply = await session.run_silent(
                "", timeout=SETUP_TIMEOUT, user_expressions=result_expressions(config)
            )
            evaluated = evaluated_result(reply)
        if evaluated is not None and evaluated.get("status") == "error":
            why = clip_middle(f"{evaluated.get('ename')}: {evaluated.get('evalue')}", 300)
            return None, None, f"`result` could not be read back from the kernel ({why})."
        if evaluated is None:
            data = None
        else:
            found = evaluated.get("data")
            data = found if isinstance(found, dict) else {}
    else:
        data = await session.display_value(code, timeout=SETUP_TIMEOUT)
    if data is None:
        return None, None, "`result` could not be read back from the kernel."
    value = data.get("application/json")
    if not isinstance(value, dict) or not value.get("present"):
        return None, None, None
    name = clip_middle(str(value.get("name")), 100)
    if "error" in value:
        reason = clip_middle(str(value["error"]), 500)
        return None, f"`{name}` was not returned: it is not JSON-serialisable ({reason}).", None
    large = "`{}` was not returned: it is {} bytes as JSON, over the limit of {} bytes."
    if "size" in value:  # the kernel's own measure: it sent no value (ipykernel)
        size_text = clip_middle(str(value["size"]), 40)
        return None, large.format(name, size_text, config.result_cap_bytes), None
    result = value.get("value")
    size = json_size(result, config.max_json_depth)
    if size is None:
        deep = f"it is nested more than {config.max_json_depth} levels deep"
        return None, f"`{name}` was not returned: {deep}.", None
    if size > config.result_cap_bytes:  # a kernel that sent more than it was asked for
        return None, large.format(name, size, config.result_cap_bytes), None
    return result, None, None


def result_expressions(config: ExecutionConfig) -> dict[str, str]:
    """The user expressions that have ipykernel evaluate `result` (within its cap)."""
    return {RESULT_EXPRESSION: python_result(config.result_cap_bytes)}


def evaluated_result(reply: Any) -> dict[str, Any] | None:
    """The `result` user expression as ipykernel evaluated it (`{"status", "data"}`, or
    `{"status": "error", "ename", "evalue"}`) from an execute_reply's content; None when
    the reply has none (no reply, a failed request: ipykernel then evaluates no user
    expressions). A kernel's reply is hostile input: any other shape reads as no value."""
    if not isinstance(reply, dict) or reply.get("status") != "ok":
        return None
    expressions = reply.get("user_expressions")
    if not isinstance(expressions, dict) or RESULT_EXPRESSION not in expressions:
        return None
    evaluated = expressions[RESULT_EXPRESSION]
    return evaluated if isinstance(evaluated, dict) else {}
