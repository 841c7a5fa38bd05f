"""`gateway run FILE`: run a notebook or a script on a running gateway, from a shell.

A `.ipynb` is replayed (`POST /v1/notebooks/run`): the executed notebook is written next to
it as `<stem>.executed.ipynb` (or to `--out`) and a short report is printed. A `.py` or
`.sh` file is run (`POST /v1/runs`): its stdout and stderr go to ours, and every chart is
saved as `<stem>-chart-N.png|jpg|svg` in the current folder. The exit status is the run's
exit code; 1 when the run ended without one (timeout, limit, cancel) or the gateway could
not be reached or failed; 2 for a usage error (a bad flag or file, a request the gateway
refused as invalid).

What the run printed is shown without terminal escape sequences and control characters
(`gateway.terminal.terminal_safe`): a run must not be able to drive the terminal of whoever
looks at its output. `--raw` shows it as it came.

The gateway is called through the typed client of this package (`GatewayClient`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gateway.client import (
    GatewayClient,
    GatewayError,
    NotebookOptions,
    RateLimited,
    RunOptions,
    UnexpectedAnswer,
    Unreachable,
    run_charts,
    run_error,
)
from gateway.models.common import Language
from gateway.models.record import Chart, RunError, RunRecord
from gateway.terminal import terminal_safe

DEFAULT_URL = "http://127.0.0.1:8888"
SCRIPT_LANGUAGES: dict[str, Language] = {
    ".py": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".js": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".r": "r",  # `.R` too: suffixes are compared in lower case
}
CHART_SUFFIXES = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/svg+xml": ".svg",
    "application/vnd.plotly.v1+json": ".plotly.json",  # opens with plotly.io.read_json
}
ANSWER_MARGIN = 120.0  # seconds to wait for an answer beyond the run's own timeout
USAGE, FAILED = 2, 1


class CommandError(Exception):
    """Ends the command with a message on stderr and the exit status `status`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_parser(commands: Any) -> None:
    """Add the `run` subcommand to the `gateway` command's subparsers."""
    run = commands.add_parser(
        "run",
        help="run a notebook or a script on a running gateway",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    run.add_argument("file", type=Path, help="a .ipynb notebook, or a .py, .sh, .js or .ts file")
    run.add_argument("--out", type=Path, help="where to write the executed notebook")
    run.add_argument("--url", default=DEFAULT_URL, help=f"the gateway (default {DEFAULT_URL})")
    run.add_argument("--token", help="bearer token (default: $GATEWAY_TOKEN)")
    run.add_argument("--timeout", type=float, help="seconds for the run (the whole notebook)")
    run.add_argument("--cell-timeout", type=float, help="seconds for each notebook cell")
    run.add_argument(
        "--allow-errors", action="store_true", help="run every notebook cell despite errors"
    )
    run.add_argument(
        "--raw",
        action="store_true",
        help="print the run's output as it came, terminal escape sequences included",
    )
    run.add_argument(
        "--language",
        choices=sorted(set(SCRIPT_LANGUAGES.values())),
        help="language of a script (default: from its suffix)",
    )


def main(args: argparse.Namespace) -> int:
    """Run `gateway run` with parsed arguments; the process's exit status."""
    try:
        if args.file.suffix == ".ipynb":
            return run_notebook(args)
        return run_script(args)
    except CommandError as exc:
        print(f"gateway run: {exc}", file=sys.stderr)
        return exc.status


# --- the gateway ----------------------------------------------------------------------------


def gateway_client(args: argparse.Namespace) -> GatewayClient:
    """The client for `--url` and `--token` (or $GATEWAY_TOKEN), waiting for an answer as
    long as the run may take and then some."""
    token = args.token or os.environ.get("GATEWAY_TOKEN") or None
    wait = (args.timeout or 300.0) + ANSWER_MARGIN
    try:
        return GatewayClient(args.url, token=token, timeout=wait)
    except ValueError as exc:
        message = f"--url must be an http:// or https:// address, not {args.url!r}"
        raise CommandError(message, USAGE) from exc


def refusal(exc: GatewayError) -> CommandError:
    """The command's error for the client's: a request the gateway refused as the caller's
    fault (4xx but 429) is a usage error, the rest (no answer, busy, broken) a failure."""
    if isinstance(exc, Unreachable):
        return CommandError(f"cannot reach the gateway: {exc.message}", FAILED)
    if isinstance(exc, UnexpectedAnswer):
        return CommandError(exc.message, FAILED)
    status = USAGE if 400 <= exc.status < 500 and not isinstance(exc, RateLimited) else FAILED
    return CommandError(f"the gateway refused the request ({exc.code}: {exc.message})", status)


# --- notebooks ----------------------------------------------------------------------------


class Output(BaseModel):
    """What the report reads of a cell's output (nbformat v4)."""

    output_type: str


class Cell(BaseModel):
    """What the report reads of a cell (nbformat v4)."""

    cell_type: str
    execution_count: int | None = None
    outputs: list[Output] = []


class Notebook(BaseModel):
    cells: list[Cell] = []


def run_notebook(args: argparse.Namespace) -> int:
    path: Path = args.file
    if args.language is not None:
        raise CommandError("--language is for scripts: a notebook names its kernel", USAGE)
    try:
        notebook = json.loads(_read(path))
    except ValueError as exc:
        raise CommandError(f"{path} is not a JSON notebook: {exc}", USAGE) from exc
    if not isinstance(notebook, dict):
        raise CommandError(f"{path} is not a JSON notebook: not an object", USAGE)
    options: NotebookOptions = {"allow_errors": bool(args.allow_errors)}
    if args.timeout is not None:
        options["timeout"] = args.timeout
    if args.cell_timeout is not None:
        options["cell_timeout"] = args.cell_timeout
    with gateway_client(args) as client:
        try:
            answer = client.run_notebook(notebook, **options)
        except GatewayError as exc:
            raise refusal(exc) from exc
    out: Path = args.out or path.with_name(f"{path.stem}.executed.ipynb")
    try:
        text = json.dumps(answer.notebook, indent=1, sort_keys=True, ensure_ascii=False)
        out.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc}", FAILED) from exc
    try:
        executed = Notebook.model_validate(answer.notebook)
        error = run_error(answer.run)
    except (ValidationError, GatewayError) as exc:
        raise CommandError(f"the gateway's answer is not the API's: {exc}", FAILED) from exc
    show = _shower(args)
    lines = notebook_report(path, executed, answer.run, error)
    print("\n".join(show(line) for line in lines))
    print(f"executed notebook: {out}")
    return exit_status(answer.run)


def notebook_report(
    path: Path, notebook: Notebook, run: RunRecord, error: RunError | None
) -> list[str]:
    """A few lines: how it ended, how many cells ran, the first error, the notes."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    ran = sum(1 for cell in cells if cell.execution_count is not None)
    seconds = run.usage.wall_ms / 1000
    lines = [
        f"{path.name}: {run.status} in {seconds:.2f} s, {ran} of {len(cells)} code cells "
        f"run (run {run.id})"
    ]
    if error is not None:
        where = _error_cell(notebook)
        if error.ename == "ExitStatus":  # a bash cell's non-zero `$?`
            lines.append(f"first error{where}: exit status {error.evalue}")
        else:
            lines.append(f"first error{where}: {error.ename}: {error.evalue}")
    lines += [f"note: {note}" for note in run.notes]
    return lines


def _error_cell(notebook: Notebook) -> str:
    for position, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type == "code" and any(o.output_type == "error" for o in cell.outputs):
            return f" in cell {position} (In [{cell.execution_count}])"
    return ""


# --- scripts ------------------------------------------------------------------------------


def run_script(args: argparse.Namespace) -> int:
    path: Path = args.file
    language: Language | None = args.language or SCRIPT_LANGUAGES.get(path.suffix.lower())
    if language is None:
        raise CommandError(
            f"cannot tell the language of {path.name}: use a .ipynb, .py, .sh, .js or .ts file, "
            "or --language",
            USAGE,
        )
    if args.out is not None or args.allow_errors or args.cell_timeout is not None:
        raise CommandError("--out, --allow-errors and --cell-timeout are for notebooks", USAGE)
    options: RunOptions = {"language": language}
    if args.timeout is not None:
        options["timeout"] = args.timeout
    code = _read(path)
    with gateway_client(args) as client:
        try:
            run = client.run(code, **options)
            error, charts = run_error(run), run_charts(run)
        except GatewayError as exc:
            raise refusal(exc) from exc
    show = _shower(args)
    sys.stdout.write(show(run.stdout))
    sys.stdout.flush()
    sys.stderr.write(show(run.stderr))
    if error is not None and error.traceback and run.status != "succeeded":
        sys.stderr.write(show("\n".join(error.traceback)) + "\n")
    for saved in save_charts(charts, path.stem):
        print(f"gateway run: saved a chart to {saved}", file=sys.stderr)
    for note in run.notes:
        print(f"gateway run: note: {show(note)}", file=sys.stderr)
    if run.status not in ("succeeded", "failed"):
        reason = f" ({run.kill_reason})" if run.kill_reason else ""
        print(f"gateway run: the run was {run.status}{reason}", file=sys.stderr)
    return exit_status(run)


def save_charts(charts: list[Chart], stem: str) -> list[Path]:
    """Write each chart to `<stem>-chart-N.<ext>` in the current folder."""
    saved = []
    for number, chart in enumerate(charts, start=1):
        target = Path(f"{stem}-chart-{number}{CHART_SUFFIXES[chart.mime]}")
        try:
            if chart.mime in ("image/svg+xml", "application/vnd.plotly.v1+json"):
                target.write_text(chart.data, encoding="utf-8")
            else:
                target.write_bytes(base64.b64decode(chart.data))
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot save a chart to {target}: {exc}", FAILED) from exc
        saved.append(target)
    return saved


# --- shared -------------------------------------------------------------------------------


def _shower(args: argparse.Namespace) -> Callable[[str], str]:
    """How the run's text is shown: as it came with --raw, else made terminal-safe."""
    if getattr(args, "raw", False):
        return str
    return terminal_safe


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read {path}: {exc}", USAGE) from exc


def exit_status(run: RunRecord) -> int:
    """The run's exit code when it has one a process can return, else 1 (0 only on success)."""
    if run.status == "succeeded":
        return 0
    if run.exit_code is not None and 0 < run.exit_code < 256:
        return run.exit_code
    return FAILED
