"""The seed-compatible tool adapters (`/v1/tools/*`): each turns a tool's body into a
`RunRequest` and a final `RunRecord` into that tool's answer, as its manual in
`reference/` describes. One module per tool; what they share is here:

- error fields renamed to the tool's own names (`timeout` -> `arguments.timeout_seconds`),
- the program's output rebuilt, in arrival order, from the record's nbformat outputs, with
  an uncaught exception rendered as the plain-text traceback a script would print,
- the exit code and the one-line reason of a run that a limit ended.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from gateway.errors import GatewayError
from gateway.models.record import RunRecord
from gateway.terminal import strip_colors

# A process ended by SIGKILL (memory, process or output limit) exits with 128 + 9.
KILLED_EXIT_CODE = 137

_FIELD_HEAD = re.compile(r"[A-Za-z_]+")
_LINE = re.compile(r"[^\n]*\n|[^\n]+")


# --- requests -----------------------------------------------------------------------------


@contextlib.contextmanager
def renamed_fields(renames: Mapping[str, str]) -> Iterator[None]:
    """Errors raised inside name the tool's fields: the leading name of `field` is replaced
    (`files[2].path` -> `arguments.files[2].path` with `{"files": "arguments.files"}`)."""
    try:
        yield
    except GatewayError as exc:
        if exc.field is not None:
            match = _FIELD_HEAD.match(exc.field)
            if match is not None and match.group() in renames:
                exc.field = renames[match.group()] + exc.field[match.end() :]
        raise


# --- answers ------------------------------------------------------------------------------


def traceback_text(output: Mapping[str, Any]) -> str:
    """An nbformat `error` output as the plain text a script would write to stderr.

    `SystemExit` prints nothing unless its value is a message (as CPython does).
    """
    if output.get("ename") == "SystemExit":
        value = str(output.get("evalue", "")).strip()
        if value in ("", "None") or re.fullmatch(r"[+-]?\d+", value):
            return ""
        return value + "\n"
    lines = [strip_colors(str(line)) for line in output.get("traceback") or []]
    text = "\n".join(lines)
    if not text:
        return ""
    return text if text.endswith("\n") else text + "\n"


def program_chunks(record: RunRecord) -> list[tuple[str, str]]:
    """What the program wrote, as `(stream name, text)` in arrival order.

    Stream outputs as they are; an uncaught exception as its traceback on stderr. Rich
    outputs (displays, the value of the last expression) are not part of it. After a
    timeout the interrupt's `KeyboardInterrupt` is the gateway's, not the program's: left out.
    """
    chunks: list[tuple[str, str]] = []
    for output in record.outputs:
        kind = output.get("output_type")
        if kind == "stream":
            chunks.append((str(output.get("name", "stdout")), str(output.get("text", ""))))
        elif kind == "error" and not record.timed_out:
            text = traceback_text(output)
            if text:
                chunks.append(("stderr", text))
    return chunks


def error_text(record: RunRecord) -> str:
    """Only the tracebacks of `program_chunks` (they are not in the record's `stderr`)."""
    return "".join(
        traceback_text(o)
        for o in record.outputs
        if o.get("output_type") == "error" and not record.timed_out
    )


def prefix_stderr(chunks: list[tuple[str, str]], prefix: str = "[stderr] ") -> str:
    """Interleave the chunks, starting every stderr line with `prefix`.

    When the stream changes in the middle of a line, a newline is inserted first, so that
    a prefix always starts a line and stdout never continues a stderr line.
    """
    parts: list[str] = []
    open_line: str | None = None  # the stream whose last line has no newline yet
    for name, text in chunks:
        if not text:
            continue
        if open_line is not None and open_line != name:
            parts.append("\n")
            open_line = None
        for line in _LINE.findall(text):
            if name == "stderr" and open_line is None:
                parts.append(prefix)
            parts.append(line)
            open_line = None if line.endswith("\n") else name
    return "".join(parts)


def cut_bytes(text: str, limit: int) -> tuple[str, bool]:
    """The first `limit` bytes of text (UTF-8, on a character boundary), and whether it was cut."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def process_exit_code(record: RunRecord) -> int | None:
    """The exit code a process would have had: the record's, 137 when a limit killed it
    (SIGKILL), null when the timeout stopped it or it was cancelled."""
    if record.status == "killed" and record.kill_reason != "timeout":
        return KILLED_EXIT_CODE
    return record.exit_code


def kill_sentence(record: RunRecord, memory_bytes: int | None = None) -> str | None:
    """One line saying which limit ended the run (not for timeouts), or None."""
    if record.status == "cancelled":
        return "Cancelled: the run was cancelled before it finished."
    if record.status != "killed":
        return None
    if record.kill_reason == "memory":
        limit = f" ({memory_bytes // (1024 * 1024)} MB)" if memory_bytes else ""
        return f"Killed: the code used more memory than its limit{limit}."
    if record.kill_reason == "pids":
        return "Killed: the code started more processes than its limit."
    if record.kill_reason == "output_limit":
        return "Killed: the code wrote more output than the gateway's limit."
    return None
