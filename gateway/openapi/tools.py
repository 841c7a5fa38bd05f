"""The seed-compatible tool endpoints, thin adapters over a run (manuals in reference/):
`/v1/tools/code_run`, `/v1/tools/run_python`, `/v1/tools/code_exec`. Each section below
holds one endpoint's request and answer shapes."""

from __future__ import annotations

from gateway.openapi.common import Schema, errors, json_body, json_request, ref

_TOOL_ERRORS = errors(400, 401, 403, 413, 415, 429, 503)

# --- code_run -----------------------------------------------------------------------------

CODE_RUN: dict[str, Schema] = {
    "CodeRunRequest": {
        "type": "object",
        "description": "Other top-level keys (the caller's envelope) are ignored.",
        "required": ["arguments"],
        "properties": {"arguments": ref("CodeRunArguments")},
    },
    "CodeRunArguments": {
        "type": "object",
        "description": (
            "Unknown arguments are 400 invalid_request (`field` e.g. `arguments.timeout`). "
            "Paths may be relative or under `/home/daytona` (the original tool's working "
            "directory, an alias of the run's)."
        ),
        "required": ["code"],
        "additionalProperties": False,
        "properties": {
            "code": {"type": "string", "description": "the code to run; print what you want back"},
            "language": {
                "enum": ["python", "bash", "javascript", "typescript"],
                "default": "python",
                "description": (
                    "`bash` runs the code as a bash script (python3, deno and git on its "
                    "PATH); `javascript` and `typescript` run in Deno"
                ),
            },
            "timeout_seconds": {
                "type": "integer",
                "minimum": 1,
                "maximum": 120,
                "default": 30,
                "description": "whole seconds; outside 1-120 (or not whole): 400",
            },
            "files": {
                "type": "array",
                "maxItems": 10,
                "items": {
                    "type": "object",
                    "required": ["path", "content"],
                    "additionalProperties": False,
                    "properties": {
                        "path": {"type": "string", "minLength": 1},
                        "content": {"type": "string", "maxLength": 1000000},
                    },
                },
                "description": (
                    "text files written before the run (folders made); more than 10, or a "
                    "content over 1,000,000 characters: 400"
                ),
            },
            "return_files": {
                "type": "array",
                "maxItems": 10,
                "items": {"type": "string", "minLength": 1},
                "description": (
                    "file paths (not patterns) read back after the run, also after a timeout; "
                    "1 MB each, 2 MB in all (past that the entry has `error`)"
                ),
            },
        },
    },
    "CodeRunAnswer": {
        "type": "object",
        "required": ["id", "tool", "result"],
        "properties": {
            "id": {"type": "string", "description": "the run id (GET /v1/runs/{id})"},
            "tool": {"const": "code_run"},
            "result": {
                "type": "object",
                "required": ["language", "exit_code", "output", "truncated", "timed_out"],
                "properties": {
                    "language": {"enum": ["python", "bash", "javascript", "typescript"]},
                    "exit_code": {
                        "type": ["integer", "null"],
                        "description": "null when the run hit `timeout_seconds`",
                    },
                    "output": {
                        "type": "string",
                        "description": (
                            "stdout and stderr together; over 50,000 characters the first "
                            "10,000 and the last 40,000 are kept; empty after a timeout (the "
                            "output is lost, as with the original tool)"
                        ),
                    },
                    "truncated": {"type": "boolean"},
                    "timed_out": {"type": "boolean"},
                    "files": {
                        "type": "array",
                        "items": ref("ReturnedFile"),
                        "description": "present when `return_files` was given, in that order",
                    },
                    "notes": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": (
                            "present when something was not returned (e.g. charts: save them "
                            "and name the file in `return_files`)"
                        ),
                    },
                },
            },
        },
    },
}

# --- run_python ---------------------------------------------------------------------------

RUN_PYTHON: dict[str, Schema] = {
    "RunPythonRequest": {
        "type": "object",
        "description": "Unknown fields (at any level) are 400 invalid_request.",
        "required": ["params"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "code.run_python", "description": "optional"},
            "input": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "vars": {
                        "type": "object",
                        "description": (
                            "each key that is a valid identifier and not input/result/output "
                            "becomes a variable; every key is in the dict `input`"
                        ),
                    }
                },
            },
            "params": ref("RunPythonParams"),
        },
    },
    "RunPythonParams": {
        "type": "object",
        "description": (
            "Exactly one of `source`, `files` and `archive_file_id` (none: 400 "
            "invalid_request; two: 400 conflicting_fields); `entrypoint` is required with "
            "`files` or `archive_file_id` and refused with `source`. Runs get no network and "
            "512 MB of memory. Limits: source 1-50,000 characters, at most 64 files of 64 "
            "KiB, 96 KiB for the whole request with `files`; over them: 400."
        ),
        "additionalProperties": False,
        "properties": {
            "source": {"type": "string", "minLength": 1, "maxLength": 50000},
            "files": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": {"type": "string"},
                "description": "path -> content",
            },
            "archive_file_id": {
                "type": "string",
                "description": (
                    "an id from POST /v1/uploads (403 archive_mode_disabled when uploads are "
                    "off; 404 not_found for an unknown or expired id)"
                ),
            },
            "entrypoint": {"type": "string"},
            "timeout_seconds": {
                "type": "number",
                "minimum": 1,
                "maximum": 30,
                "default": 5,
                "description": "seconds; outside 1-30: 400",
            },
        },
    },
    "RunPythonAnswer": {
        "type": "object",
        "required": ["result", "stdout", "stderr"],
        "additionalProperties": False,
        "properties": {
            "result": {
                "description": (
                    "the value of `result` (else `output`) after a successful run, when "
                    "JSON-serialisable; null otherwise"
                ),
            },
            "stdout": {"type": "string", "description": "the first 64 KiB"},
            "stderr": {
                "type": "string",
                "description": (
                    "the first 64 KiB, then the traceback of an uncaught error and a line "
                    "saying why the gateway ended the run (timeout, memory), if it did"
                ),
            },
            "stdout_truncated": {"const": True, "description": "present only when cut"},
            "stderr_truncated": {"const": True, "description": "present only when cut"},
        },
    },
}

# --- code_exec ----------------------------------------------------------------------------

CODE_EXEC: dict[str, Schema] = {
    "CodeExecRequest": {
        "type": "object",
        "description": "Unknown fields are 400 invalid_request. The code is Python.",
        "required": ["code"],
        "additionalProperties": False,
        "properties": {
            "code": {"type": "string"},
            "working_dir": {
                "type": "string",
                "description": "as a run's `working_dir` (the caller's persistent workspace)",
            },
            "timeout": {
                "description": (
                    "seconds, clamped, never refused: below 1 becomes 1, above 300 becomes "
                    "300, a non-number falls back to 30; with `background` and none, 300"
                ),
            },
            "background": {"type": "boolean", "default": False},
        },
    },
    "CodeExecAnswer": {"anyOf": [ref("CodeExecResult"), ref("CodeExecTimeout")]},
    "CodeExecResult": {
        "type": "object",
        "required": ["success", "exit_code", "output"],
        "additionalProperties": False,
        "properties": {
            "success": {"type": "boolean", "description": "exit code 0"},
            "exit_code": {
                "type": ["integer", "null"],
                "description": "null when a limit (memory, processes, output) killed the run",
            },
            "output": {
                "type": "string",
                "description": (
                    "stdout and stderr as they arrived, each stderr line prefixed "
                    "`[stderr] `; `(no output)` when empty"
                ),
            },
        },
    },
    "CodeExecTimeout": {
        "type": "object",
        "required": ["success", "error", "output"],
        "additionalProperties": False,
        "properties": {
            "success": {"const": False},
            "error": {"const": "timeout"},
            "output": {
                "type": "string",
                "description": "`Code execution timed out after Ns`: nothing of the run",
            },
        },
    },
    "CodeExecStarted": {
        "type": "object",
        "required": ["task_id"],
        "additionalProperties": False,
        "properties": {
            "task_id": {
                "type": "string",
                "description": "a run id: its record is at GET /v1/runs/{task_id}",
            }
        },
    },
}

SCHEMAS: dict[str, Schema] = {**CODE_RUN, **RUN_PYTHON, **CODE_EXEC}

_LOCATION = {"Location": {"description": "/v1/runs/{id}", "schema": {"type": "string"}}}

PATHS: dict[str, Schema] = {
    "/v1/tools/code_run": {
        "post": {
            "operationId": "toolCodeRun",
            "tags": ["tools"],
            "summary": "code_run: run Python or bash, get output, exit code and files",
            "requestBody": json_request(ref("CodeRunRequest"), "The tool call."),
            "responses": {
                "200": json_body(ref("CodeRunAnswer"), "The tool's result."),
                **_TOOL_ERRORS,
            },
        }
    },
    "/v1/tools/run_python": {
        "post": {
            "operationId": "toolRunPython",
            "tags": ["tools"],
            "summary": "run_python: run a Python snippet and return the value of `result`",
            "requestBody": json_request(ref("RunPythonRequest"), "The tool call."),
            "responses": {
                "200": json_body(ref("RunPythonAnswer"), "The tool's result."),
                **errors(400, 401, 403, 404, 413, 415, 429, 503),
            },
        }
    },
    "/v1/tools/code_exec": {
        "post": {
            "operationId": "toolCodeExec",
            "tags": ["tools"],
            "summary": "code_exec: run Python, get `{success, exit_code, output}`",
            "description": (
                "A non-zero exit is a 200 with `success: false` and the output (usually the "
                "traceback). `background: true` answers 202 `{task_id}` at once."
            ),
            "requestBody": json_request(ref("CodeExecRequest"), "The tool call."),
            "responses": {
                "200": json_body(ref("CodeExecAnswer"), "The tool's result."),
                "202": {
                    **json_body(ref("CodeExecStarted"), "`background: true`: the run is queued."),
                    "headers": _LOCATION,
                },
                **_TOOL_ERRORS,
            },
        }
    },
}
