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

Every HTTP call goes through `post_json`, which uses the typed client of this package.
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

from gateway.client import GatewayClient, GatewayClientError
from gateway.terminal import terminal_safe

DEFAULT_URL = "http://127.0.0.1:8888"
SCRIPT_LANGUAGES = {
    ".py": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".js": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
}
CHART_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}
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


# --- HTTP ---------------------------------------------------------------------------------


def post_json(
    url: str, path: str, body: dict[str, Any], token: str | None, timeout: float
) -> dict[str, Any]:
    """POST a JSON body through `gateway.client`; its JSON answer, or a CommandError."""
    try:
        client = GatewayClient(url, token=token, timeout=timeout)
    except ValueError as exc:
        message = f"--url must be an http:// or https:// address, not {url!r}"
        raise CommandError(message, USAGE) from exc
    try:
        answer = client.request("POST", path, body)
    except GatewayClientError as exc:
        raise _refusal(exc) from exc
    if not isinstance(answer, dict):
        raise CommandError("the gateway's answer is not a JSON object", FAILED)
    return answer


def _refusal(exc: GatewayClientError) -> CommandError:
    if exc.status == 0:
        return CommandError(f"cannot reach the gateway: {exc.message}", FAILED)
    status = USAGE if 400 <= exc.status < 500 and exc.status != 429 else FAILED
    return CommandError(f"the gateway refused the request ({exc.code}: {exc.message})", status)


def _options(args: argparse.Namespace) -> tuple[str, str | None, float]:
    token = args.token or os.environ.get("GATEWAY_TOKEN") or None
    wait = (args.timeout or 300.0) + ANSWER_MARGIN
    return args.url, token, wait


# --- notebooks ----------------------------------------------------------------------------


def run_notebook(args: argparse.Namespace) -> int:
    path: Path = args.file
    if args.language is not None:
        raise CommandError("--language is for scripts: a notebook names its kernel", USAGE)
    try:
        notebook = json.loads(_read(path))
    except ValueError as exc:
        raise CommandError(f"{path} is not a JSON notebook: {exc}", USAGE) from exc
    body: dict[str, Any] = {"notebook": notebook, "allow_errors": bool(args.allow_errors)}
    if args.timeout is not None:
        body["timeout"] = args.timeout
    if args.cell_timeout is not None:
        body["cell_timeout"] = args.cell_timeout
    url, token, wait = _options(args)
    answer = post_json(url, "/v1/notebooks/run", body, token, wait)
    out: Path = args.out or path.with_name(f"{path.stem}.executed.ipynb")
    try:
        text = json.dumps(answer["notebook"], indent=1, sort_keys=True, ensure_ascii=False)
        out.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc}", FAILED) from exc
    run = answer["run"]
    show = _shower(args)
    print("\n".join(show(line) for line in notebook_report(path, answer["notebook"], run)))
    print(f"executed notebook: {out}")
    return exit_status(run)


def notebook_report(path: Path, notebook: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """A few lines: how it ended, how many cells ran, the first error, the notes."""
    cells = [c for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
    ran = sum(1 for c in cells if c.get("execution_count") is not None)
    seconds = (run.get("usage") or {}).get("wall_ms", 0) / 1000
    lines = [
        f"{path.name}: {run['status']} in {seconds:.2f} s, {ran} of {len(cells)} code cells "
        f"run (run {run['id']})"
    ]
    error = run.get("error")
    if error:
        where = _error_cell(notebook)
        if error.get("ename") == "ExitStatus":  # a bash cell's non-zero `$?`
            lines.append(f"first error{where}: exit status {error.get('evalue')}")
        else:
            lines.append(f"first error{where}: {error.get('ename')}: {error.get('evalue')}")
    lines += [f"note: {note}" for note in run.get("notes", [])]
    return lines


def _error_cell(notebook: dict[str, Any]) -> str:
    for position, cell in enumerate(notebook.get("cells", []), start=1):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if output.get("output_type") == "error":
                return f" in cell {position} (In [{cell.get('execution_count')}])"
    return ""


# --- scripts ------------------------------------------------------------------------------


def run_script(args: argparse.Namespace) -> int:
    path: Path = args.file
    language = args.language or SCRIPT_LANGUAGES.get(path.suffix.lower())
    if language is None:
        raise CommandError(
            f"cannot tell the language of {path.name}: use a .ipynb, .py, .sh, .js or .ts file, "
            "or --language",
            USAGE,
        )
    if args.out is not None or args.allow_errors or args.cell_timeout is not None:
        raise CommandError("--out, --allow-errors and --cell-timeout are for notebooks", USAGE)
    body: dict[str, Any] = {"code": _read(path), "language": language}
    if args.timeout is not None:
        body["timeout"] = args.timeout
    url, token, wait = _options(args)
    run = post_json(url, "/v1/runs", body, token, wait)
    show = _shower(args)
    sys.stdout.write(show(run.get("stdout", "")))
    sys.stdout.flush()
    sys.stderr.write(show(run.get("stderr", "")))
    error = run.get("error")
    if error and error.get("traceback") and run["status"] != "succeeded":
        traceback = "\n".join(error["traceback"])
        sys.stderr.write(show(traceback) + "\n")
    for saved in save_charts(run.get("charts", []), path.stem):
        print(f"gateway run: saved a chart to {saved}", file=sys.stderr)
    for note in run.get("notes", []):
        print(f"gateway run: note: {show(note)}", file=sys.stderr)
    if run["status"] not in ("succeeded", "failed"):
        reason = f" ({run['kill_reason']})" if run.get("kill_reason") else ""
        print(f"gateway run: the run was {run['status']}{reason}", file=sys.stderr)
    return exit_status(run)


def save_charts(charts: list[dict[str, Any]], stem: str) -> list[Path]:
    """Write each chart to `<stem>-chart-N.<ext>` in the current folder."""
    saved = []
    for number, chart in enumerate(charts, start=1):
        suffix = CHART_SUFFIXES.get(chart.get("mime", ""), ".bin")
        target = Path(f"{stem}-chart-{number}{suffix}")
        data = chart.get("data", "")
        try:
            if chart.get("mime") == "image/svg+xml":
                target.write_text(data, encoding="utf-8")
            else:
                target.write_bytes(base64.b64decode(data))
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


def exit_status(run: dict[str, Any]) -> int:
    """The run's exit code when it has one a process can return, else 1 (0 only on success)."""
    code = run.get("exit_code")
    if run.get("status") == "succeeded":
        return 0
    if isinstance(code, int) and 0 < code < 256:
        return code
    return FAILED
