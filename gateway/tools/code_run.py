"""`POST /v1/tools/code_run` (reference/code_run-manual.txt): `{"arguments": {...}}` ->
`RunRequest`, and the final `RunRecord` -> `{"id", "tool", "result": {language,
exit_code, output, truncated, timed_out, files?, notes?}}`.

Faithful to the manual: `timeout_seconds` is an integer 1-120 (default 30; outside that
range is a 400, as the argument's schema says, not a clamp); at most 10 `files` of at most
1,000,000 characters; at most 10 `return_files`, each returned up to 1 MB and all of them up
to 2 MB; output over 50,000 characters keeps its first 10,000 and last 40,000; after a
timeout `exit_code` is null and the output is lost (files are still read back). The
manual's working directory `/home/daytona` is accepted as an alias of the run's own.
"""

from __future__ import annotations

import dataclasses
import glob
import posixpath
from collections.abc import Mapping
from typing import Any, Literal

from gateway.auth import Principal
from gateway.models.record import RunRecord
from gateway.models.request import RunRequest
from gateway.models.run import RunBody
from gateway.models.tools import (
    CODE_RUN_OUTPUT,
    CODE_RUN_RETURN_FILE_BYTES,
    CODE_RUN_RETURN_TOTAL_BYTES,
    CodeRunAnswer,
    CodeRunBody,
    CodeRunFileResult,
    CodeRunResult,
    in_code_run_workdir,
)
from gateway.runs.config import RequestPolicy
from gateway.runs.requests import run_request
from gateway.tools import (
    kill_sentence,
    process_exit_code,
    program_chunks,
    renamed_fields,
)

OUTPUT_LIMIT, OUTPUT_HEAD, OUTPUT_TAIL = CODE_RUN_OUTPUT

_RENAMES = {
    "code": "arguments.code",
    "language": "arguments.language",
    "timeout": "arguments.timeout_seconds",
    "files": "arguments.files",
    "return_files": "arguments.return_files",
}


@dataclasses.dataclass(frozen=True)
class ReturnFile:
    """One `return_files` entry: as asked, and the pattern the run pipeline reads."""

    asked: str
    pattern: str  # a relative path (glob characters escaped) or an absolute one
    literal: str  # the path the pipeline reports for a match of an escaped pattern


@dataclasses.dataclass(frozen=True)
class CodeRunCall:
    request: RunRequest
    return_files: tuple[ReturnFile, ...] = ()


def parse_code_run(body: Any, policy: RequestPolicy, caller: Principal) -> CodeRunCall:
    """Validate a code_run body; every violation is a 400 naming `arguments.<field>`."""
    arguments = CodeRunBody.parse(body).arguments
    return_files = tuple(_return_file(asked) for asked in arguments.return_files or ())
    run_body = {
        "code": arguments.code,
        "language": arguments.language,
        "timeout": arguments.timeout_seconds,
        "files": [{"path": f.path, "content": f.content} for f in arguments.files or ()] or None,
        "return_files": list(dict.fromkeys(r.pattern for r in return_files)) or None,
    }
    with renamed_fields(_RENAMES):
        request = run_request(RunBody.parse(run_body), policy, caller)
    return CodeRunCall(request=request, return_files=return_files)


def _return_file(asked: str) -> ReturnFile:
    path = in_code_run_workdir(asked)
    if path.startswith("/"):  # the pipeline reads it if it is inside the working folder
        return ReturnFile(asked, path, path)
    literal = posixpath.normpath(path)
    # code_run names files, never patterns: glob characters are escaped
    return ReturnFile(asked, glob.escape(literal), literal)


# --- the answer ---------------------------------------------------------------------------


def code_run_answer(call: CodeRunCall, record: RunRecord) -> CodeRunAnswer:
    notes = list(call.request.notes)
    output, truncated = "", False
    if record.timed_out:
        notes.append(
            f"The code was stopped at timeout_seconds ({call.request.timeout:g} s); "
            "its output is lost."
        )
    else:
        output, truncated = cut_output("".join(text for _, text in program_chunks(record)))
        if truncated:
            notes.append(
                f"The output was longer than {OUTPUT_LIMIT:,} characters; its first "
                f"{OUTPUT_HEAD:,} and last {OUTPUT_TAIL:,} characters are returned."
            )
    killed = kill_sentence(record)
    if killed:
        notes.append(killed)
    notes.extend(unreturned_outputs(record))
    result = CodeRunResult(
        language=record.language,
        exit_code=None if record.timed_out else process_exit_code(record),
        output=output,
        truncated=truncated,
        timed_out=record.timed_out,
        files=returned_files(call.return_files, record.files) if call.return_files else None,
        notes=notes or None,
    )
    return CodeRunAnswer(id=record.id, result=result)


def cut_output(text: str) -> tuple[str, bool]:
    """Over 50,000 characters: the first 10,000 and the last 40,000."""
    if len(text) <= OUTPUT_LIMIT:
        return text, False
    return text[:OUTPUT_HEAD] + text[-OUTPUT_TAIL:], True


def unreturned_outputs(record: RunRecord) -> list[str]:
    """Notes for what the code showed that code_run does not return."""
    shown_charts = sum(1 for c in record.charts if c.get("source") == "display")
    saved = sum(1 for c in record.charts if c.get("source") == "savefig")
    displays = sum(1 for o in record.outputs if o.get("output_type") == "display_data")
    other = displays - shown_charts - saved
    notes = []
    if shown_charts:
        notes.append(
            f"{shown_charts} chart(s) the code showed were not returned: charts aren't "
            "returned on their own; save them with savefig and name the file in return_files."
        )
    if other > 0:
        notes.append(
            f"{other} rich display output(s) were not returned; print what you need instead."
        )
    if any(o.get("output_type") == "execute_result" for o in record.outputs):
        notes.append(
            "The value of the last expression was not printed (the code runs as a script); "
            "print() it to see it."
        )
    return notes


def returned_files(
    asked: tuple[ReturnFile, ...], read: list[dict[str, Any]]
) -> list[CodeRunFileResult]:
    """One entry per asked path, in order, with the manual's per-file and total limits."""
    by_path = {str(entry.get("path")): entry for entry in read}
    budget = CODE_RUN_RETURN_TOTAL_BYTES
    answer = []
    for item in asked:
        entry = _entry_for(item, by_path, bool(read))
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool):
            size = None
        error = str(entry.get("error", "not found"))
        if size is not None and size > CODE_RUN_RETURN_FILE_BYTES:
            error = f"larger than the limit of {CODE_RUN_RETURN_FILE_BYTES} bytes"
        elif "content" in entry and size is not None and size > budget:
            error = (
                f"not returned: all files together may have at most "
                f"{CODE_RUN_RETURN_TOTAL_BYTES} bytes"
            )
        elif "content" in entry and size is not None:
            budget -= size
            base64 = entry.get("encoding") == "base64"
            encoding: Literal["utf-8", "base64"] = "base64" if base64 else "utf-8"
            content = str(entry.get("content", ""))
            answer.append(
                CodeRunFileResult(path=item.asked, size=size, encoding=encoding, content=content)
            )
            continue
        answer.append(CodeRunFileResult(path=item.asked, size=size, error=error))
    return answer


def _entry_for(
    item: ReturnFile, by_path: Mapping[str, dict[str, Any]], any_read: bool
) -> dict[str, Any]:
    if item.pattern in by_path and by_path[item.pattern].get("error") != "no file matches":
        return by_path[item.pattern]
    if item.literal in by_path:
        return by_path[item.literal]
    if not any_read:
        return {"size": None, "error": "not read back: the run ended before files were read"}
    if item.pattern != item.literal and item.pattern not in by_path:
        return {"size": None, "error": "is a folder"}  # an escaped pattern skips folders
    return {"size": None, "error": "not found"}
