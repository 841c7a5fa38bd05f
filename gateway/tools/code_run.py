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
from typing import Any

from gateway.auth import Principal
from gateway.errors import InvalidPath, InvalidRequest
from gateway.models import tools as limits
from gateway.models.record import RunRecord
from gateway.models.request import RunRequest
from gateway.models.run import checked_path
from gateway.runs.requests import parse_run_request
from gateway.settings import Settings
from gateway.tools import (
    kill_sentence,
    process_exit_code,
    program_chunks,
    reject_unknown,
    renamed_fields,
    require_object,
    timeout_in_range,
)

TOOL = "code_run"
# the manual's limits, written once in gateway.models.tools
ARGUMENTS = frozenset(limits.CodeRunArguments.model_fields)
FILE_FIELDS = frozenset(limits.CodeRunFile.model_fields)
MIN_TIMEOUT, MAX_TIMEOUT, DEFAULT_TIMEOUT = limits.CODE_RUN_TIMEOUT
MAX_FILES = limits.CODE_RUN_MAX_FILES
MAX_FILE_CHARS = limits.CODE_RUN_MAX_FILE_CHARS
MAX_RETURN_FILES = limits.CODE_RUN_MAX_RETURN_FILES
RETURN_FILE_BYTES = limits.CODE_RUN_RETURN_FILE_BYTES
RETURN_TOTAL_BYTES = limits.CODE_RUN_RETURN_TOTAL_BYTES
OUTPUT_LIMIT, OUTPUT_HEAD, OUTPUT_TAIL = limits.CODE_RUN_OUTPUT

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


def parse_code_run(body: Any, settings: Settings, caller: Principal) -> CodeRunCall:
    """Validate a code_run body; every violation is a 400 naming `arguments.<field>`."""
    envelope = require_object(body, None, "The request body")
    arguments = require_object(
        envelope.get("arguments"), "arguments", "`arguments` (the tool's arguments)"
    )
    reject_unknown(arguments, ARGUMENTS, "arguments.")
    code = arguments.get("code")
    if not isinstance(code, str):
        raise InvalidRequest("`arguments.code` (a string) is required.", field="arguments.code")
    return_files = _return_files(arguments.get("return_files"))
    run_body = {
        "code": code,
        "language": arguments.get("language"),
        "timeout": _timeout(arguments.get("timeout_seconds")),
        "files": _files(arguments.get("files")),
        "return_files": list(dict.fromkeys(r.pattern for r in return_files)) or None,
    }
    with renamed_fields(_RENAMES):
        request = parse_run_request(run_body, settings, caller)
    return CodeRunCall(request=request, return_files=return_files)


def _timeout(value: Any) -> int:
    field = "arguments.timeout_seconds"
    return int(
        timeout_in_range(value, DEFAULT_TIMEOUT, MIN_TIMEOUT, MAX_TIMEOUT, field, whole=True)
    )


def _files(value: Any) -> list[dict[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest("`files` must be a list of {path, content}.", field="arguments.files")
    if len(value) > MAX_FILES:
        raise InvalidRequest(
            f"{len(value)} files given; at most {MAX_FILES} are allowed.", field="arguments.files"
        )
    files = []
    for index, item in enumerate(value):
        field = f"arguments.files[{index}]"
        item = require_object(item, field, "Each file")
        reject_unknown(item, FILE_FIELDS, f"{field}.")
        content = item.get("content")
        if not isinstance(content, str):
            raise InvalidRequest("`content` (text) is required.", field=f"{field}.content")
        if len(content) > MAX_FILE_CHARS:
            raise InvalidRequest(
                f"The file has {len(content)} characters; at most {MAX_FILE_CHARS:,} are allowed.",
                field=f"{field}.content",
            )
        raw = item.get("path")
        path = checked_path(
            limits.in_code_run_workdir(raw) if isinstance(raw, str) else raw, f"{field}.path"
        )
        files.append({"path": path, "content": content})
    return files


def _return_files(value: Any) -> tuple[ReturnFile, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise InvalidRequest(
            "`return_files` must be a list of paths.", field="arguments.return_files"
        )
    if len(value) > MAX_RETURN_FILES:
        raise InvalidRequest(
            f"{len(value)} return_files given; at most {MAX_RETURN_FILES} are allowed.",
            field="arguments.return_files",
        )
    entries = []
    for index, asked in enumerate(value):
        if "\x00" in asked:
            raise InvalidPath(
                "The path contains a NUL byte.", field=f"arguments.return_files[{index}]"
            )
        path = limits.in_code_run_workdir(asked)
        if path.startswith("/"):  # the pipeline reads it if it is inside the working folder
            entries.append(ReturnFile(asked, path, path))
            continue
        literal = posixpath.normpath(path)
        # code_run names files, never patterns: glob characters are escaped
        entries.append(ReturnFile(asked, glob.escape(literal), literal))
    return tuple(entries)


# --- the answer ---------------------------------------------------------------------------


def code_run_answer(call: CodeRunCall, record: RunRecord) -> dict[str, Any]:
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
    result: dict[str, Any] = {
        "language": record.language,
        "exit_code": None if record.timed_out else process_exit_code(record),
        "output": output,
        "truncated": truncated,
        "timed_out": record.timed_out,
    }
    if call.return_files:
        result["files"] = returned_files(call.return_files, record.files)
    if notes:
        result["notes"] = notes
    return {"id": record.id, "tool": TOOL, "result": result}


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
) -> list[dict[str, Any]]:
    """One entry per asked path, in order, with the manual's per-file and total limits."""
    by_path = {str(entry.get("path")): entry for entry in read}
    budget = RETURN_TOTAL_BYTES
    answer = []
    for item in asked:
        entry = _entry_for(item, by_path, bool(read))
        size = entry.get("size")
        if "content" in entry and isinstance(size, int):
            if size > RETURN_FILE_BYTES:
                entry = _too_large(item.asked, size)
            elif size > budget:
                entry = {
                    "path": item.asked,
                    "size": size,
                    "error": f"not returned: all files together may have at most "
                    f"{RETURN_TOTAL_BYTES} bytes",
                }
            else:
                budget -= size
                entry = {
                    "path": item.asked,
                    "size": size,
                    "encoding": entry.get("encoding", "utf-8"),
                    "content": entry.get("content", ""),
                }
        elif isinstance(size, int) and size > RETURN_FILE_BYTES:
            entry = _too_large(item.asked, size)
        else:
            entry = {"path": item.asked, "size": size, "error": entry.get("error", "not found")}
        answer.append(entry)
    return answer


def _too_large(path: str, size: int) -> dict[str, Any]:
    return {
        "path": path,
        "size": size,
        "error": f"larger than the limit of {RETURN_FILE_BYTES} bytes",
    }


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
