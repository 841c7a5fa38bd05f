"""`POST /v1/notebooks/run`: replay a notebook's code cells in one fresh kernel."""

from __future__ import annotations

from gateway.openapi.common import Schema, errors, json_body, json_request, ref

SCHEMAS: dict[str, Schema] = {
    "NotebookRunRequest": {
        "type": "object",
        "description": (
            "The notebook with run options. Unknown fields are 400 invalid_request. The "
            "kernel is chosen from `metadata.kernelspec` / `language_info` (python, bash, "
            "typescript or javascript, Deno's kernel `deno` too; python when absent; "
            "anything else 400 unsupported_language)."
        ),
        "required": ["notebook"],
        "additionalProperties": False,
        "properties": {
            "notebook": ref("Notebook"),
            "timeout": {
                "type": "number",
                "default": 30,
                "description": (
                    "wall-clock limit for all cells together, seconds, from the first cell's "
                    "start; clamped to [1, max_timeout] exactly like a run's `timeout`"
                ),
            },
            "cell_timeout": {
                "type": "number",
                "description": (
                    "limit for each cell, seconds (clamped the same way; default: `timeout`); "
                    "a cell runs for at most min(cell_timeout, what is left of timeout), and "
                    "a cell that times out stops the replay (`timed_out`)"
                ),
            },
            "allow_errors": {
                "type": "boolean",
                "default": False,
                "description": (
                    "false: the first cell that raises stops the replay (later cells keep no "
                    "outputs and no execution count; the run is `failed`) unless it is tagged "
                    "`raises-exception`, as in nbclient; true: every cell runs, errors are "
                    "recorded in their cells. Cells tagged `skip-execution` are not run"
                ),
            },
            "files": {"type": "array", "items": ref("StagedFile")},
            "return_files": {"type": "array", "items": {"type": "string", "minLength": 1}},
        },
    },
    "NotebookRunAnswer": {
        "type": "object",
        "required": ["notebook", "run"],
        "properties": {
            "notebook": {
                **ref("Notebook"),
                "description": (
                    "the executed notebook (valid nbformat v4): each code cell with its "
                    "outputs and execution_count"
                ),
            },
            "run": {
                **ref("RunRecord"),
                "description": (
                    "one record for the whole notebook: status, exit_code, timing, usage, "
                    "charts and returned files of all cells; stdout/stderr/output/outputs of "
                    "all cells in order"
                ),
            },
        },
    },
}

PATHS: dict[str, Schema] = {
    "/v1/notebooks/run": {
        "post": {
            "operationId": "runNotebook",
            "tags": ["notebooks"],
            "summary": "Run every code cell of a notebook in one fresh kernel",
            "description": (
                "The body is an nbformat notebook (v4, or older and converted to v4), or "
                "`{notebook, timeout, cell_timeout, allow_errors, files, return_files}`. All "
                "code cells run in order in one fresh "
                "kernel: state flows between the cells of this notebook, never between "
                "requests. An invalid notebook is 400 invalid_request (field `notebook`) with "
                "nbformat's reason in the message. A cell that fails is not an HTTP error: the "
                "answer is a 200 with `run.status: failed`."
            ),
            "requestBody": json_request(
                {"oneOf": [ref("Notebook"), ref("NotebookRunRequest")]},
                "A notebook, or a notebook with options.",
            ),
            "responses": {
                "200": json_body(ref("NotebookRunAnswer"), "The executed notebook and its record."),
                **errors(400, 401, 403, 413, 415, 429, 503),
            },
        }
    },
}
