"""The bodies of the seed-compatible tool endpoints (`/v1/tools/*`) and their answers, with
each manual's limits written once here (the adapters and the OpenAPI document import
them). The manuals are in `reference/`; where this and a manual differ, the manual wins.
"""

from __future__ import annotations

import json
import math
import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, RootModel
from pydantic import model_validator as model_check

from gateway.errors import ConflictingFields, InvalidRequest
from gateway.models.base import Answer, Body, refuse
from gateway.models.common import Language
from gateway.models.run import RelativePath, non_empty_path, relative_path

# --- code_run (reference/code_run-manual.txt) ---------------------------------------------

CODE_RUN_WORKDIR = "/home/daytona"  # the manual's working directory
CODE_RUN_TIMEOUT = (1, 120, 30)  # min, max, default seconds
CODE_RUN_MAX_FILES = 10
CODE_RUN_MAX_FILE_CHARS = 1_000_000
CODE_RUN_MAX_RETURN_FILES = 10
CODE_RUN_RETURN_FILE_BYTES = 1_000_000  # "1 MB" per returned file
CODE_RUN_RETURN_TOTAL_BYTES = 2_000_000  # "2 MB in all"
CODE_RUN_OUTPUT = (50_000, 10_000, 40_000)  # limit, head, tail (characters)


def in_code_run_workdir(path: str) -> str:
    """`/home/daytona/x` -> `x` (the manual's working directory is the run's own)."""
    if path.startswith("/"):
        normal = posixpath.normpath(path)
        if normal == CODE_RUN_WORKDIR:
            return "."
        if normal.startswith(CODE_RUN_WORKDIR + "/"):
            return normal[len(CODE_RUN_WORKDIR) + 1 :]
    return path


def named_file(path: str) -> str:
    """A `return_files` entry of code_run: a file's path (never a pattern), any non-empty
    string without NUL."""
    return non_empty_path(
        path, "A path must be a non-empty string.", "The path contains a NUL byte."
    )


def whole_seconds(value: float) -> float:
    if value != int(value):
        raise refuse("invalid_request", "`timeout_seconds` must be a whole number of seconds.")
    return value


class CodeRunFile(Body):
    path: Annotated[str, AfterValidator(lambda p: relative_path(in_code_run_workdir(p)))]
    content: str = Field(max_length=CODE_RUN_MAX_FILE_CHARS)


class CodeRunArguments(Body):
    """Unknown arguments are 400 invalid_request (`field` e.g. `arguments.timeout`). Paths
    may be relative or under `/home/daytona` (the original tool's working directory, an
    alias of the run's)."""

    code: str = Field(description="the code to run; print what you want back")
    language: Language = Field(
        "python",
        description=(
            "`bash` runs the code as a bash script (python3, deno and git on its PATH); "
            "`javascript` and `typescript` run in Deno; `r` in R, where the kernel image "
            "has it (GET /v1/environment)"
        ),
    )
    timeout_seconds: Annotated[
        float,
        Field(ge=CODE_RUN_TIMEOUT[0], le=CODE_RUN_TIMEOUT[1]),
        AfterValidator(whole_seconds),
    ] = Field(
        CODE_RUN_TIMEOUT[2],
        description=f"whole seconds; outside {CODE_RUN_TIMEOUT[0]}-{CODE_RUN_TIMEOUT[1]}: 400",
    )
    files: list[CodeRunFile] | None = Field(
        None,
        max_length=CODE_RUN_MAX_FILES,
        description=(
            f"text files written before the run (folders made); more than "
            f"{CODE_RUN_MAX_FILES}, or a content over {CODE_RUN_MAX_FILE_CHARS:,} characters: 400"
        ),
    )
    return_files: list[Annotated[str, AfterValidator(named_file)]] | None = Field(
        None,
        max_length=CODE_RUN_MAX_RETURN_FILES,
        description=(
            "file paths (not patterns) read back after the run, also after a timeout; 1 MB "
            "each, 2 MB in all (past that the entry has `error`)"
        ),
    )


class CodeRunBody(Body):
    """Other top-level keys (the caller's envelope) are ignored."""

    model_config = ConfigDict(extra="ignore")

    arguments: CodeRunArguments


class CodeRunFileResult(Answer):
    path: str
    size: int | None
    encoding: Literal["utf-8", "base64"] | None = None
    content: str | None = None
    error: str | None = None


class CodeRunResult(Answer):
    language: Language
    exit_code: int | None = Field(description="null when the run hit `timeout_seconds`")
    output: str = Field(
        description=(
            f"stdout and stderr together; over {CODE_RUN_OUTPUT[0]:,} characters the first "
            f"{CODE_RUN_OUTPUT[1]:,} and the last {CODE_RUN_OUTPUT[2]:,} are kept; empty after "
            "a timeout (the output is lost, as with the original tool)"
        )
    )
    truncated: bool
    timed_out: bool
    files: list[CodeRunFileResult] | None = Field(
        None, description="present when `return_files` was given, in that order"
    )
    notes: list[str] | None = Field(
        None,
        description=(
            "present when something was not returned (e.g. charts: save them and name the "
            "file in `return_files`)"
        ),
    )


class CodeRunAnswer(Answer):
    id: str = Field(description="the run id (GET /v1/runs/{id})")
    tool: Literal["code_run"] = "code_run"
    result: CodeRunResult


# --- run_python (reference/run_python-manual.txt) -----------------------------------------

RUN_PYTHON_TYPE = "code.run_python"
RUN_PYTHON_SOURCE_CHARS = 50_000
RUN_PYTHON_MAX_FILES = 64
RUN_PYTHON_MAX_FILE_BYTES = 64 * 1024
RUN_PYTHON_MAX_REQUEST_BYTES = 96 * 1024
RUN_PYTHON_TIMEOUT = (1, 30, 5)
RUN_PYTHON_STREAM_BYTES = 64 * 1024
RUN_PYTHON_MEMORY_BYTES = 512 * 1024 * 1024


def small_file(content: str) -> str:
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > RUN_PYTHON_MAX_FILE_BYTES:
        raise refuse(
            "invalid_request",
            f"The file has {size} bytes; at most {RUN_PYTHON_MAX_FILE_BYTES} (64 KiB) are "
            "allowed per file.",
        )
    return content


class RunPythonInput(Body):
    vars: dict[str, Any] | None = Field(
        None,
        description=(
            "each key that is a valid identifier and not input/result/output becomes a "
            "variable; every key is in the dict `input`"
        ),
    )


class RunPythonParams(Body):
    __doc__ = (
        "Exactly one of `source`, `files` and `archive_file_id` (none: 400 invalid_request; "
        "two: 400 conflicting_fields); `entrypoint` is required with `files` or "
        "`archive_file_id` and refused with `source`. Runs get no network and "
        f"{RUN_PYTHON_MEMORY_BYTES // 2**20} MB of memory. Limits: source 1-"
        f"{RUN_PYTHON_SOURCE_CHARS:,} characters, at most {RUN_PYTHON_MAX_FILES} files of "
        f"{RUN_PYTHON_MAX_FILE_BYTES // 1024} KiB, {RUN_PYTHON_MAX_REQUEST_BYTES // 1024} KiB "
        "for the whole request with `files`; over them: 400."
    )

    source: str | None = Field(None, min_length=1, max_length=RUN_PYTHON_SOURCE_CHARS)
    files: (
        Annotated[
            dict[RelativePath, Annotated[str, AfterValidator(small_file)]],
            Field(min_length=1, max_length=RUN_PYTHON_MAX_FILES),
        ]
        | None
    ) = None
    archive_file_id: str | None = Field(
        None,
        min_length=1,
        description=(
            "an id from POST /v1/uploads (403 archive_mode_disabled when uploads are off; "
            "404 not_found for an unknown or expired id)"
        ),
    )
    entrypoint: RelativePath | None = None
    timeout_seconds: Annotated[float, Field(ge=RUN_PYTHON_TIMEOUT[0], le=RUN_PYTHON_TIMEOUT[1])] = (
        Field(
            RUN_PYTHON_TIMEOUT[2],
            description=f"seconds; outside {RUN_PYTHON_TIMEOUT[0]}-{RUN_PYTHON_TIMEOUT[1]}: 400",
        )
    )

    @model_check(mode="after")
    def _one_source(self) -> RunPythonParams:
        choices = (
            ("source", self.source),
            ("files", self.files),
            ("archive_file_id", self.archive_file_id),
        )
        given = [name for name, value in choices if value is not None]
        if not given:
            raise InvalidRequest(
                "Set exactly one of `params.source`, `params.files` or `params.archive_file_id`.",
                field="params.source",
            )
        if len(given) > 1:
            raise ConflictingFields(
                f"`params.{given[0]}` and `params.{given[1]}` are mutually exclusive: set "
                "exactly one.",
                field=f"params.{given[1]}",
            )
        if self.source is not None and self.entrypoint is not None:
            raise ConflictingFields(
                "`params.entrypoint` goes with `files` or `archive_file_id`, not `source`.",
                field="params.entrypoint",
            )
        return self  # a missing `entrypoint` is the adapter's to refuse, after the uploads check


class RunPythonBody(Body):
    """Unknown fields inside `input` and `params` are 400 invalid_request."""

    # other keys of the step the manual describes are ignored, as the tool does
    model_config = ConfigDict(extra="ignore")
    keyed_fields = frozenset({"params.files"})

    type: Literal["code.run_python"] = "code.run_python"
    input: RunPythonInput = Field(default_factory=RunPythonInput)
    params: RunPythonParams

    @model_check(mode="before")
    @classmethod
    def _small_request(cls, data: Any) -> Any:
        params = data.get("params") if isinstance(data, dict) else None
        if isinstance(params, dict) and params.get("files") is not None:
            whole = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            size = len(whole.encode("utf-8", "surrogatepass"))  # vars and all
            if size > RUN_PYTHON_MAX_REQUEST_BYTES:
                raise InvalidRequest(
                    f"The request has {size} bytes (files, vars and all); at most "
                    f"{RUN_PYTHON_MAX_REQUEST_BYTES} (96 KiB) are allowed with `files`.",
                    field="params.files",
                )
        return data


class RunPythonAnswer(Answer):
    result: Any = Field(
        description=(
            "the value of `result` (else `output`) after a successful run, when "
            "JSON-serialisable; null otherwise"
        )
    )
    stdout: str = Field(description=f"the first {RUN_PYTHON_STREAM_BYTES // 1024} KiB")
    stderr: str = Field(
        description=(
            f"the first {RUN_PYTHON_STREAM_BYTES // 1024} KiB, then the traceback of an "
            "uncaught error and a line saying why the gateway ended the run (timeout, "
            "memory), if it did"
        )
    )
    stdout_truncated: Literal[True] | None = Field(None, description="present only when cut")
    stderr_truncated: Literal[True] | None = Field(None, description="present only when cut")


# --- code_exec (reference/code_exec-manual.txt) -------------------------------------------

CODE_EXEC_TIMEOUT = (1.0, 300.0, 30.0)  # clamped to min..max; default
CODE_EXEC_BACKGROUND_TIMEOUT = 300.0
CODE_EXEC_STDERR_PREFIX = "[stderr] "
CODE_EXEC_NO_OUTPUT = "(no output)"


def clamped_timeout(value: Any) -> Any:
    """The manual's clamp: 0 -> 1, 10000 -> 300, a non-number -> the default."""
    if value is None:
        return None
    if isinstance(value, bool):
        return CODE_EXEC_TIMEOUT[2]
    if isinstance(value, int):  # any size: compared as an integer, never made a float
        return float(min(max(value, int(CODE_EXEC_TIMEOUT[0])), int(CODE_EXEC_TIMEOUT[1])))
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return CODE_EXEC_TIMEOUT[2]
    if math.isnan(seconds):
        return CODE_EXEC_TIMEOUT[2]
    return min(max(seconds, CODE_EXEC_TIMEOUT[0]), CODE_EXEC_TIMEOUT[1])


class CodeExecBody(Body):
    """Unknown fields are 400 invalid_request. The code is Python."""

    code: str
    working_dir: str | None = Field(
        None, description="as a run's `working_dir` (the caller's persistent workspace)"
    )
    timeout: Annotated[Any, AfterValidator(clamped_timeout)] = Field(
        None,
        description=(
            f"seconds, clamped, never refused: below {CODE_EXEC_TIMEOUT[0]:g} becomes "
            f"{CODE_EXEC_TIMEOUT[0]:g}, above {CODE_EXEC_TIMEOUT[1]:g} becomes "
            f"{CODE_EXEC_TIMEOUT[1]:g}, a non-number falls back to {CODE_EXEC_TIMEOUT[2]:g}; "
            f"with `background` and none, {CODE_EXEC_BACKGROUND_TIMEOUT:g}"
        ),
    )
    background: bool | None = None


class CodeExecResult(Answer):
    success: bool = Field(description="exit code 0")
    exit_code: int | None = Field(
        description="null when a limit (memory, processes, output) killed the run"
    )
    output: str = Field(
        description=(
            f"stdout and stderr as they arrived, each stderr line prefixed "
            f"`{CODE_EXEC_STDERR_PREFIX}`; `{CODE_EXEC_NO_OUTPUT}` when empty"
        )
    )


class CodeExecTimeout(Answer):
    success: Literal[False]
    error: Literal["timeout"]
    output: str = Field(description="`Code execution timed out after Ns`: nothing of the run")


class CodeExecAnswer(RootModel[CodeExecResult | CodeExecTimeout]):
    pass


class CodeExecStarted(Answer):
    task_id: str = Field(description="a run id: its record is at GET /v1/runs/{task_id}")
