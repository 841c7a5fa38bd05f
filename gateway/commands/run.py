"""`gateway run FILE`: run a notebook or a script on a running gateway, from a shell, and
watch it as it runs (over the WebSocket, through the async client's stream).

A `.ipynb` is replayed cell by cell: a progress line per cell (`[12/40] In [12] · 812 ms`,
redrawn in place on a terminal; plain lines otherwise), the first error's traceback as
soon as it happens, then the executed notebook is written next to it as
`<stem>.executed.ipynb` (or to `--out`), every chart beside it as
`<stem>-chart-N.png|jpg|svg`, and a short report is printed. A `.py`, `.sh`, `.js` or
`.ts` file is run: its stdout and stderr go to ours as they come, and every chart is saved
as `<stem>-chart-N.png|jpg|svg` in the current folder. `--files PATH ...` stages
files and folders (relative paths kept: `--files data/`), `--return GLOB ...` saves the
files the run wrote that match, next to the executed notebook (or the script). The exit
status is the run's exit code; 1 when the run ended without one (timeout, limit, cancel)
or the gateway could not be reached or failed; 2 for a usage error (a bad flag or file, a
request the gateway refused as invalid); 130 when interrupted (the run is cancelled).

What the run printed is shown without terminal escape sequences and control characters
(`gateway.terminal.terminal_safe`): a run must not be able to drive the terminal of whoever
looks at its output. `--raw` shows it as it came.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from pydantic import BaseModel, ValidationError

from gateway.client import (
    AsyncGatewayClient,
    AsyncRunStream,
    GatewayError,
    NotebookOptions,
    PayloadTooLarge,
    RateLimited,
    RunOptions,
    UnexpectedAnswer,
    Unreachable,
)
from gateway.commands.progress import CellProgress, cell_name, cell_progress, duration, spent
from gateway.commands.staging import Staged, StagingError, file_specs, save_returned, stage
from gateway.models.common import Language
from gateway.models.record import Chart, RunError
from gateway.models.stream import (
    CellFinishedEvent,
    CellStartedEvent,
    OutputDroppedEvent,
    OutputEvent,
)
from gateway.models.typed import TypedRunRecord
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
USAGE, FAILED, INTERRUPTED = 2, 1, 130
# a note of a `done` event cut to the gateway's `max_event_bytes`: the whole is fetched
CUT_EVENT = "This `done` event was over its limit"


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
    run.add_argument(
        "--files",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATH",
        help="files or folders to stage in the run's folder (relative paths kept: "
        "`--files data/` gives the run data/...)",
    )
    run.add_argument(
        "--return",
        dest="return_files",
        nargs="+",
        action="extend",
        default=[],
        metavar="GLOB",
        help="files the run wrote to save next to the executed notebook (or the script), "
        "e.g. `--return out.csv 'figures/*.png'`",
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
    except KeyboardInterrupt:  # leaving the stream closed it: the gateway cancels the run
        print("gateway run: interrupted; the run was cancelled", file=sys.stderr)
        return INTERRUPTED


# --- the gateway ----------------------------------------------------------------------------


def gateway_client(args: argparse.Namespace) -> AsyncGatewayClient:
    """The client for `--url` and `--token` (or $GATEWAY_TOKEN), waiting for an answer as
    long as the run may take and then some."""
    token = args.token or os.environ.get("GATEWAY_TOKEN") or None
    wait = (args.timeout or 300.0) + ANSWER_MARGIN
    try:
        return AsyncGatewayClient(args.url, token=token, timeout=wait)
    except ValueError as exc:
        message = f"--url must be an http:// or https:// address, not {args.url!r}"
        raise CommandError(message, USAGE) from exc


def refusal(exc: GatewayError, staged: Sequence[Staged] = ()) -> CommandError:
    """The command's error for the client's: a request the gateway refused as the caller's
    fault (4xx but 429) is a usage error, the rest (no answer, busy, broken) a failure."""
    if isinstance(exc, Unreachable):
        return CommandError(f"cannot reach the gateway: {exc.message}", FAILED)
    if isinstance(exc, UnexpectedAnswer):
        return CommandError(exc.message, FAILED)
    status = USAGE if 400 <= exc.status < 500 and not isinstance(exc, RateLimited) else FAILED
    message = f"the gateway refused the request ({exc.code}: {exc.message})"
    if staged and (isinstance(exc, PayloadTooLarge) or (exc.field or "").startswith("files")):
        sent = ", ".join(item.describe() for item in staged)
        message += f"; --files sent {sent}: stage fewer or smaller files"
    return CommandError(message, status)


def staged_files(args: argparse.Namespace) -> list[Staged]:
    try:
        return stage(list(args.files))
    except StagingError as exc:
        raise CommandError(str(exc), USAGE) from exc


def with_files(options: Any, args: argparse.Namespace, staged: list[Staged]) -> None:
    """Add `--files` (read now) and `--return` to a run's or a replay's options."""
    if staged:
        try:
            options["files"] = file_specs(staged)
        except StagingError as exc:
            raise CommandError(str(exc), USAGE) from exc
    if args.return_files:
        options["return_files"] = list(args.return_files)


def error_text(output: dict[str, Any], where: str) -> str:
    """An `error` output as the lines a terminal shows."""
    traceback = output.get("traceback") or []
    if isinstance(traceback, list) and traceback:
        body = "\n".join(str(line) for line in traceback)
    else:
        body = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
    return f"error{where}:\n{body}"


# --- notebooks ----------------------------------------------------------------------------


class ReportOutput(BaseModel):
    """What the report reads of a cell's output (nbformat v4)."""

    output_type: str


class ReportCell(BaseModel):
    """What the report reads of a cell (nbformat v4)."""

    cell_type: str
    execution_count: int | None = None
    outputs: list[ReportOutput] = []


class ReportNotebook(BaseModel):
    cells: list[ReportCell] = []


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
    # `name`: the record and the listing say which notebook this replay was
    options: NotebookOptions = {"allow_errors": bool(args.allow_errors), "name": path.name}
    if args.timeout is not None:
        options["timeout"] = args.timeout
    if args.cell_timeout is not None:
        options["cell_timeout"] = args.cell_timeout
    staged = staged_files(args)
    with_files(options, args, staged)
    show = _shower(args)
    record, executed = asyncio.run(_replay(args, notebook, options, staged, show))
    out: Path = args.out or path.with_name(f"{path.stem}.executed.ipynb")
    try:
        text = json.dumps(executed, indent=1, sort_keys=True, ensure_ascii=False)
        out.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc}", FAILED) from exc
    try:
        cells = ReportNotebook.model_validate(executed)
    except ValidationError as exc:
        raise CommandError(f"the gateway's answer is not the API's: {exc}", FAILED) from exc
    lines = notebook_report(path, cells, record, record.error)
    print("\n".join(show(line) for line in lines))
    for saved in save_charts(record.charts, path.stem, out.parent):
        print(f"saved a chart to {_relative(saved)}")
    _save_returned(record.files, out.parent, show)
    print(f"executed notebook: {out}")
    return exit_status(record)


async def _replay(
    args: argparse.Namespace,
    notebook: dict[str, Any],
    options: NotebookOptions,
    staged: list[Staged],
    show: Show,
) -> tuple[TypedRunRecord, NotebookNode]:
    """Replay over the WebSocket, showing it as it goes; the whole record and notebook."""
    async with gateway_client(args) as client:
        progress = cell_progress(_code_cells(notebook))
        try:
            async with client.stream_notebook(notebook, **options) as stream:
                await _watch_notebook(stream, progress, show)
            progress.close()
            return await _replayed(client, stream)
        except GatewayError as exc:
            progress.close()
            raise refusal(exc, staged) from exc


class FirstError:
    """The replay's first error, shown as soon as its cell's number is known: an error ends
    its cell, whose `cell_finished` (with its execution count) follows at once. Should that
    event be skipped (a slow reader), the error is shown unnumbered when the replay moves
    on."""

    def __init__(self, progress: CellProgress, show: Show) -> None:
        self.progress = progress
        self.show = show
        self.pending: OutputEvent | None = None
        self.shown = False

    def output(self, event: OutputEvent) -> None:
        if not self.shown and self.pending is None and event.output.get("output_type") == "error":
            self.pending = event

    def cell_finished(self, event: CellFinishedEvent) -> None:
        if self.pending is not None and self.pending.index == event.index:
            self.flush(f" at {cell_name(event.execution_count)}")

    def flush(self, where: str = "") -> None:
        if self.pending is not None:
            output, self.pending, self.shown = self.pending.output, None, True
            self.progress.write(self.show(error_text(output, where)), sys.stderr)


async def _watch_notebook(stream: AsyncRunStream, progress: CellProgress, show: Show) -> None:
    """Show the replay's cells as they finish, and its first error at once."""
    first_error = FirstError(progress, show)
    dropped = 0
    async for event in stream:
        if isinstance(event, CellStartedEvent):
            first_error.flush()
            progress.started(event)
        elif isinstance(event, CellFinishedEvent):
            first_error.cell_finished(event)
            progress.finished(event)
        elif isinstance(event, OutputEvent):
            first_error.output(event)
        elif isinstance(event, OutputDroppedEvent):
            dropped += event.dropped
    first_error.flush()
    if dropped:
        progress.write(
            f"gateway run: {dropped} live events were skipped (this terminal read too slowly); "
            "the executed notebook has everything",
            sys.stderr,
        )


async def _replayed(
    client: AsyncGatewayClient, stream: AsyncRunStream
) -> tuple[TypedRunRecord, NotebookNode]:
    """The replay's whole record and executed notebook: from `done`, or from the gateway
    when `done` had to be cut to its limit."""
    record, executed = stream.record, stream.notebook
    if record is None:
        raise CommandError("the stream ended without the run's record", FAILED)
    if executed is None or any(note.startswith(CUT_EVENT) for note in record.notes):
        record, executed = await client.get_run(record.id), await client.notebook(record.id)
    return record, executed


def _code_cells(notebook: dict[str, Any]) -> int:
    """How many cells a replay runs: its code cells not tagged `skip-execution`."""
    cells = notebook.get("cells")
    count = 0
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        tags = (cell.get("metadata") or {}).get("tags") or []
        if not (isinstance(tags, list) and "skip-execution" in tags):
            count += 1
    return count


def _save_returned(entries: list[Any], folder: Path, show: Show) -> None:
    saved, problems = save_returned(entries, folder)
    for target in saved:
        print(f"saved {show(_relative(target))}")
    for problem in problems:
        print(f"gateway run: {show(problem)}", file=sys.stderr)


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def notebook_report(
    path: Path, notebook: ReportNotebook, run: TypedRunRecord, error: RunError | None
) -> list[str]:
    """A few lines: how it ended, how many cells ran, the first error, the notes."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    ran = sum(1 for cell in cells if cell.execution_count is not None)
    used = spent(run.usage)
    lines = [
        f"{path.name}: {run.status} in {duration(run.usage.wall_ms)}, {ran} of {len(cells)} "
        f"code cells run{', ' + used if used else ''} (run {run.id})"
    ]
    if error is not None:
        where = _error_cell(notebook)
        if error.ename == "ExitStatus":  # a bash cell's non-zero `$?`
            lines.append(f"first error{where}: exit status {error.evalue}")
        else:
            lines.append(f"first error{where}: {error.ename}: {error.evalue}")
    lines += [f"note: {note}" for note in run.notes]
    return lines


def _error_cell(notebook: ReportNotebook) -> str:
    for cell in notebook.cells:
        if cell.cell_type == "code" and any(o.output_type == "error" for o in cell.outputs):
            return f" at {cell_name(cell.execution_count)}"
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
    staged = staged_files(args)
    with_files(options, args, staged)
    show = _shower(args)
    run, watched = asyncio.run(_run(args, code, options, staged, show))
    error, charts, entries = run.error, run.charts, run.files
    if watched.dropped:
        print(
            f"gateway run: {watched.dropped} live outputs were skipped (this terminal read too "
            f"slowly); the whole output is at GET /v1/runs/{run.id}",
            file=sys.stderr,
        )
    if error is not None and error.traceback and run.status != "succeeded" and not watched.error:
        sys.stderr.write(show("\n".join(error.traceback)) + "\n")
    for saved in save_charts(charts, path.stem):
        print(f"gateway run: saved a chart to {saved}", file=sys.stderr)
    saved_files, problems = save_returned(entries, path.parent)
    for target in saved_files:
        print(f"gateway run: saved {show(_relative(target))}", file=sys.stderr)
    for problem in problems:
        print(f"gateway run: {show(problem)}", file=sys.stderr)
    for note in run.notes:
        print(f"gateway run: note: {show(note)}", file=sys.stderr)
    if run.status not in ("succeeded", "failed"):
        reason = f" ({run.kill_reason})" if run.kill_reason else ""
        print(f"gateway run: the run was {run.status}{reason}", file=sys.stderr)
    used = spent(run.usage)
    print(
        f"gateway run: {run.status} in {duration(run.usage.wall_ms)}"
        f"{', ' + used if used else ''} (run {run.id})",
        file=sys.stderr,
    )
    return exit_status(run)


@dataclasses.dataclass
class Watched:
    """What a script's live stream showed: its error (yes or no), outputs skipped."""

    error: bool = False
    dropped: int = 0


async def _run(
    args: argparse.Namespace, code: str, options: RunOptions, staged: list[Staged], show: Show
) -> tuple[TypedRunRecord, Watched]:
    """Run over the WebSocket, its output shown as it comes; the whole record."""
    async with gateway_client(args) as client:
        try:
            async with client.stream_run(code, **options) as stream:
                watched = await _watch_script(stream, show)
            run = stream.record
            if run is None:
                raise CommandError("the stream ended without the run's record", FAILED)
            if any(note.startswith(CUT_EVENT) for note in run.notes):
                run = await client.get_run(run.id)
        except GatewayError as exc:
            raise refusal(exc, staged) from exc
    return run, watched


async def _watch_script(stream: AsyncRunStream, show: Show) -> Watched:
    """Write the run's stdout and stderr to ours as they come, and its error's traceback
    when it comes."""
    watched = Watched()
    async for event in stream:
        if isinstance(event, OutputDroppedEvent):
            watched.dropped += event.dropped
        if not isinstance(event, OutputEvent):
            continue
        output = event.output
        kind = output.get("output_type")
        if kind == "stream":
            file = sys.stderr if output.get("name") == "stderr" else sys.stdout
            text = output.get("text", "")
            file.write(show("".join(text) if isinstance(text, list) else str(text)))
            file.flush()
        elif kind == "error" and output.get("traceback"):
            watched.error = True
            sys.stdout.flush()
            sys.stderr.write(show("\n".join(str(line) for line in output["traceback"])) + "\n")
            sys.stderr.flush()
    return watched


def save_charts(charts: list[Chart], stem: str, folder: Path | None = None) -> list[Path]:
    """Write each chart to `<stem>-chart-N.<ext>` in `folder` (the current folder)."""
    saved = []
    for number, chart in enumerate(charts, start=1):
        name = f"{stem}-chart-{number}{CHART_SUFFIXES[chart.mime]}"
        target = Path(name) if folder is None else folder / name
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


Show = Callable[[str], str]


def _shower(args: argparse.Namespace) -> Show:
    """How the run's text is shown: as it came with --raw, else made terminal-safe."""
    if getattr(args, "raw", False):
        return str
    return terminal_safe


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read {path}: {exc}", USAGE) from exc


def exit_status(run: TypedRunRecord) -> int:
    """The run's exit code when it has one a process can return, else 1 (0 only on success)."""
    if run.status == "succeeded":
        return 0
    if run.exit_code is not None and 0 < run.exit_code < 256:
        return run.exit_code
    return FAILED
