"""The gateway's own code, in each kernel's language: the run's environment and `vars`
before the first cell, the fences of kernels that need them, and reading `result` back.

It runs silently (never shown, never in history); the kernel-side halves live in
`kernels/python/startup.py`, `kernels/deno/prelude.js` and `kernels/r/kernel.R`.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kernels
from gateway.models.common import Language
from gateway.models.languages import traits

_DENO_RUN = "globalThis[Symbol.for('gateway.run')]"
DENO_RESULT = f"{_DENO_RUN}.result()"


@functools.cache
def deno_prelude() -> str:
    path = Path(kernels.__file__).resolve().parent / "deno" / "prelude.js"
    return path.read_text(encoding="utf-8")


def setup_code(
    language: Language,
    env: Mapping[str, str],
    vars: Mapping[str, Any],
    fence_token: str | None = None,
    network: bool = False,
) -> str | None:
    """The code that applies the run's environment variables and `vars` (None: nothing to
    do). A Deno kernel always gets its prelude: its fences and `Deno.exit` need it."""
    kernel = traits(language).kernel
    if kernel == "deno":
        run = {"env": dict(env), "vars": dict(vars), "fence": fence_token, "network": network}
        payload = json.dumps(run)
        return f"{deno_prelude()}\n{_DENO_RUN}.prepare({payload});"
    if not vars and not env:
        return None
    if kernel == "ipykernel":
        payload = json.dumps({"env": dict(env), "vars": dict(vars)})
        return f"__import__('kernels.python.startup', fromlist=['_']).prepare({payload!r})"
    if kernel == "irkernel":
        payload = json.dumps({"env": dict(env), "vars": dict(vars)})
        return f".gateway_prepare({_r_string(payload)})"
    values = {**env, **{k: _bash_value(v) for k, v in vars.items()}}
    return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in values.items())


def python_result(max_bytes: int) -> str:
    """The expression whose value is the kernel's `result` (else `output`), or only its size
    when it is more than `max_bytes` as JSON (`kernels/python/startup.result_value`)."""
    return f"__import__('kernels.python.startup', fromlist=['_']).result_value({int(max_bytes)})"


def result_code(language: Language, max_bytes: int) -> str:
    """Kernels without user expressions: the code whose `execute_result` is `result` as
    `application/json` (`{"present", "name", "value"}`, or its `size` past `max_bytes`)."""
    if traits(language).kernel == "irkernel":
        return f".gateway_result({int(max_bytes)})"
    return DENO_RESULT


# Keeping a kernel's state (`gateway.runs.snapshots`): two silent requests, `keep` (its
# reply awaited), then `stop` (not: a request that stops the loop may keep its reply queued)
_KEEP_CODE: dict[str, tuple[str, str]] = {
    "ipykernel": (
        "__import__('kernels.python.resume', fromlist=['keep']).keep()",
        "__import__('kernels.python.resume', fromlist=['stop']).stop()",
    ),
    # our bash kernel takes these two silent requests as its own (`kernels.bash.kernel`)
    "bash": ("__gateway_keep__", "__gateway_stop__"),
}


def keep_code(kernel: str) -> tuple[str, str] | None:
    """The `keep` and `stop` requests of a kernel whose state can be kept, else None."""
    return _KEEP_CODE.get(kernel)


def fence_code(label: str) -> str:
    """Deno: write the fence `label` through stdout and stderr (`execution.fence`)."""
    return f"{_DENO_RUN}.fence({json.dumps(label)});"


def _r_string(text: str) -> str:
    """An R string literal: JSON's escapes are R's too (UTF-8 kept as is: R takes no
    surrogate escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _bash_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
