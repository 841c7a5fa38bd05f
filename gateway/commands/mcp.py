"""`gateway mcp`: an MCP server with two tools, `run_code` and `list_runs`, over stdio or
streamable HTTP.

The tool runs code through `gateway.client.AsyncGatewayClient` on a gateway: a running one
(`--url URL [--token T]`), or one started in this process for the life of the MCP server
(`gateway.server.private_gateway`, which the `gateway mcp` command hands in as
`start_gateway`: this package imports nothing of the server). It answers a text with the
output, status and returned files, plus one image per PNG/JPEG chart. `list_runs` answers
the caller's recent runs, a line each, newest first (`GET /v1/runs`).

The MCP SDK is imported only when the server starts: it costs the `gateway serve`
process nothing (the module has no `from __future__ import annotations`, so that the SDK
reads the tool's parameter annotations as objects).
"""

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Annotated, Any, Literal

from gateway.client import (
    AsyncGatewayClient,
    GatewayError,
    RunOptions,
    returned_files,
    run_charts,
    run_error,
)
from gateway.commands.progress import duration
from gateway.models.common import FINAL_STATUSES, Language, Status
from gateway.models.environment import Environment
from gateway.models.listing import RunList
from gateway.models.record import Chart, ReturnedFileContent, ReturnedFileError, RunRecord
from gateway.terminal import strip_colors
from gateway.version import __version__

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from mcp_types import ContentBlock

__all__ = [
    "MCPOptions",
    "StartGateway",
    "add_arguments",
    "build_server",
    "distinct_charts",
    "format_record",
    "format_runs",
    "main",
    "serve",
    "tool_description",
]

log = logging.getLogger("gateway.mcp")

Transport = Literal["stdio", "http"]
# Starts a gateway for this process alone and stops it on exit: `(url, token)` inside.
StartGateway = Callable[[], AbstractAsyncContextManager[tuple[str, str]]]
OUTPUT_HEAD, OUTPUT_TAIL = 10_000, 40_000  # characters of output shown (like code_run)
FILE_CHARS = 20_000  # characters of one returned text file shown
RESULT_CHARS = 10_000
IMAGE_MIMES = ("image/png", "image/jpeg")

TOOL_DESCRIPTION = """\
Run {languages} code in a fresh, isolated sandbox and return what it printed{notes}.

Every call starts a new Jupyter kernel that is destroyed afterwards: no variable, file or
installed package survives between calls, so import and compute everything in one call.
There is no network: nothing can be installed (no pip install, no install.packages), so
use what is there. {packages}

A chart shown with plt.show() (or saved with savefig), a plotly figure or an R plot comes
back as an image or a chart's data. Put input files in `files`; name files to read back in
`return_files`. A failing program is still an answer: the text says `failed` and shows the
traceback."""
# What the description names of each language's packages, when installed: the ones an
# agent reaches for first (the environment endpoint lists them all).
MAIN_PACKAGES: dict[Language, tuple[str, ...]] = {
    "python": (
        "numpy",
        "pandas",
        "matplotlib",
        "scipy",
        "scikit-learn",
        "statsmodels",
        "seaborn",
        "plotly",
        "sympy",
        "networkx",
        "polars",
        "pyarrow",
        "duckdb",
        "pillow",
        "scikit-image",
        "openpyxl",
        "beautifulsoup4",
        "lxml",
    ),
    "r": ("ggplot2", "jsonlite", "MASS", "Matrix", "lattice", "mgcv", "nlme"),
}
LANGUAGE_NAMES: dict[Language, str] = {
    "python": "Python",
    "bash": "bash",
    "javascript": "JavaScript",
    "typescript": "TypeScript",
    "r": "R",
}


LIST_DESCRIPTION = """\
List your recent runs on the gateway, newest first: id, status, exit code, language,
when, and the first line of code. Filter by status (e.g. failed) or language; pass the
`next cursor` of an answer to see older runs."""


@dataclasses.dataclass(frozen=True)
class MCPOptions:
    transport: Transport = "stdio"
    port: int = 8765  # streamable HTTP, on 127.0.0.1
    url: str | None = None  # a running gateway; None: start one in this process
    token: str | None = None


# --- the tool ------------------------------------------------------------------------------


def tool_description(environment: Environment | None) -> str:
    """The tool's description, naming the languages and main packages the gateway's kernels
    have (`GET /v1/environment`), so that a model does not try to install what is there or
    import what is not. Without an environment: the languages every image has."""
    languages: list[Language] = (
        [name for name in LANGUAGE_NAMES if name in environment.languages]
        if environment is not None and environment.source != "unknown"
        else ["python", "bash", "javascript", "typescript"]
    )
    notes = []
    if "javascript" in languages or "typescript" in languages:
        notes.append("JavaScript and TypeScript run in Deno")
    if "bash" in languages:
        notes.append("bash has python3, deno and git")
    packages = []
    for language, names in MAIN_PACKAGES.items():
        entry = environment.languages.get(language) if environment is not None else None
        if entry is None or language not in languages:
            continue
        have = {p.name.lower(): p for p in entry.packages}
        found = [
            f"{have[n.lower()].name} {have[n.lower()].version}" for n in names if n.lower() in have
        ]
        if found:
            version = f" {entry.version}" if entry.version else ""
            packages.append(f"{LANGUAGE_NAMES[language]}{version} has {', '.join(found)}")
    if not packages:
        packages.append("Python has numpy, pandas and matplotlib.")
    listed = ", ".join(LANGUAGE_NAMES[name] for name in languages[:-1])
    return TOOL_DESCRIPTION.format(
        languages=f"{listed} or {LANGUAGE_NAMES[languages[-1]]}" if listed else "Python",
        notes=f" ({'; '.join(notes)})" if notes else "",
        packages="; ".join(packages).rstrip(".") + ".",
    )


def build_server(
    client: AsyncGatewayClient, environment: Environment | None = None
) -> "MCPServer[Any]":
    """An MCP server whose `run_code` tool runs code on the gateway behind `client`;
    `environment` (the gateway's, if known) shapes the tool's description."""
    from mcp.server import MCPServer
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import BaseModel, Field

    class File(BaseModel):
        path: Annotated[str, Field(description="relative path, e.g. data/input.csv")]
        content: Annotated[str, Field(description="the file's text")]

    async def run_code(
        code: Annotated[str, Field(description="the source to run")],
        language: Annotated[
            Language,
            Field(description="python (default), bash, javascript or typescript (Deno), or r"),
        ] = "python",
        files: Annotated[
            list[File] | None, Field(description="text files written before the code runs")
        ] = None,
        return_files: Annotated[
            list[str] | None,
            Field(description="paths or glob patterns of files to read back after the run"),
        ] = None,
        timeout: Annotated[
            float, Field(description="wall-clock limit in seconds (the gateway clamps it)")
        ] = 30,
        keep: Annotated[
            bool,
            Field(
                description=(
                    "keep the final state (variables, imports, files) so that a later call "
                    "can continue from it: the answer names a snapshot id (Python and bash)"
                )
            ),
        ] = False,
        continue_from: Annotated[
            str | None,
            Field(
                description=(
                    "a snapshot id an earlier call kept: this code runs with that state "
                    "(variables, imports, files), in a fresh sandbox; the snapshot is unchanged"
                )
            ),
        ] = None,
    ) -> CallToolResult:
        options: RunOptions = {"language": language, "timeout": timeout}
        if keep:
            options["keep"] = True
        if continue_from:
            options["continue_from"] = continue_from
        if files:
            options["files"] = [{"path": f.path, "content": f.content} for f in files]
        if return_files:
            options["return_files"] = return_files
        try:
            record = await run_on_gateway(client, code, options)
            content = format_record(record, timeout)
        except GatewayError as exc:
            return CallToolResult(content=[TextContent(text=refusal_text(exc))], is_error=True)
        return CallToolResult(content=content)

    async def list_runs(
        limit: Annotated[
            int, Field(ge=1, le=100, description="how many runs to list (1 to 100)")
        ] = 10,
        status: Annotated[
            Status | None,
            Field(description="only runs of this status, e.g. failed or succeeded"),
        ] = None,
        language: Annotated[Language | None, Field(description="only runs of this language")] = (
            None
        ),
        cursor: Annotated[
            str | None, Field(description="the `next cursor` of a previous answer, for more")
        ] = None,
    ) -> CallToolResult:
        try:
            page = await client.list_runs(
                limit=limit, status=status, language=language, cursor=cursor
            )
        except GatewayError as exc:
            return CallToolResult(content=[TextContent(text=refusal_text(exc))], is_error=True)
        return CallToolResult(content=[TextContent(text=format_runs(page))])

    server: MCPServer[Any] = MCPServer(
        "kernel-gateway",
        version=__version__,
        instructions=(
            "Use run_code to run code in a fresh sandbox per call; its description says "
            "which languages and packages the sandbox has. To carry state from one call to "
            "the next, ask run_code to keep it and pass the snapshot id it names as "
            "continue_from."
        ),
    )
    # run_code changes nothing outside its own sandbox, list_runs only reads; neither
    # reaches the world beyond the gateway
    tools: list[tuple[Callable[..., Any], str, str, str, bool]] = [
        (run_code, "run_code", "Run code", tool_description(environment), False),
        (list_runs, "list_runs", "List recent runs", LIST_DESCRIPTION, True),
    ]
    for tool, name, title, description, reads_only in tools:
        server.add_tool(
            tool,
            name=name,
            title=title,
            description=description,
            annotations=ToolAnnotations(
                read_only_hint=reads_only,
                destructive_hint=False,
                idempotent_hint=reads_only,
                open_world_hint=False,
            ),
            structured_output=False,
        )
    return server


def _rfc3339(when: dt.datetime | str) -> str:
    """As the API writes a time: `2026-01-05T10:00:00.000Z` (a typed listing's datetime)."""
    if isinstance(when, str):
        return when
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_runs(page: RunList) -> str:
    """A page of runs, a line each, newest first; the cursor for more when there is more."""
    if not page.runs:
        return "No runs."
    lines = []
    for run in page.runs:
        exit_code = "" if run.exit_code is None else f", exit code {run.exit_code}"
        line = strip_colors(run.first_line)
        lines.append(
            f"{run.id}  {run.status}{exit_code}  {run.language} {run.kind}  "
            f"{_rfc3339(run.created_at)}  {line!r}"
        )
    if page.next is not None:
        lines.append(f"next cursor: {page.next}")
    return "\n".join(lines)


async def run_on_gateway(client: AsyncGatewayClient, code: str, options: RunOptions) -> RunRecord:
    """Start the run in the background and poll for its record, so that a cancelled tool
    call (the MCP client gave up) cancels the run on the gateway too."""
    import anyio

    accepted = await client.start(code, **options)
    try:
        delay = 0.05
        while True:
            record = await client.get_run(accepted.id)
            if record.status in FINAL_STATUSES:
                return record
            await anyio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True), contextlib.suppress(GatewayError):
            await client.cancel(accepted.id)
        raise


def refusal_text(exc: GatewayError) -> str:
    where = f" (field `{exc.field}`)" if exc.field else ""
    text = f"The gateway did not run the code: {exc.message}{where} [{exc.status} {exc.code}]"
    if exc.retry_after is not None:
        text += f"; try again in {exc.retry_after:g} s"
    return text + "."


# --- the answer ----------------------------------------------------------------------------


def format_record(record: RunRecord, timeout: float | None = None) -> "list[ContentBlock]":
    """A run record as MCP content: one text, then one image per PNG/JPEG chart (and per
    returned PNG/JPEG file that is not already one of the charts)."""
    from mcp_types import ImageContent, TextContent

    sections = [_status_line(record, timeout)]
    output = record.output.rstrip("\n")
    sections.append("--- output ---\n" + (_cut(output) if output else "(no output)"))
    error = run_error(record)
    if error is not None and record.status != "succeeded":
        traceback = "\n".join(strip_colors(line) for line in error.traceback)
        summary = f"{error.ename}: {error.evalue}"
        sections.append(f"--- error ---\n{summary}\n{traceback}".rstrip())
    if record.result is not None:
        result = json.dumps(record.result, ensure_ascii=False, indent=1)
        sections.append("--- result ---\n" + _cut(result, RESULT_CHARS, 0))
    charts = distinct_charts(run_charts(record))
    images: list[ContentBlock] = []
    notes = list(record.notes)
    for index, chart in enumerate(charts, start=1):
        description = _chart_description(chart) or chart.mime
        sections.append(f"chart {index}: {description}")
        if chart.mime in IMAGE_MIMES:
            images.append(ImageContent(data=chart.data, mime_type=chart.mime))
        elif chart.mime == "image/svg+xml":
            notes.append(f"Chart {index} is an SVG image; it is not shown here.")
        else:
            notes.append(f"Chart {index} is a plotly figure; its data is described above.")
    chart_paths = {_normal(chart.path) for chart in charts if chart.path}
    for entry in returned_files(record):
        text, image = _file_section(entry, chart_paths)
        sections.append(text)
        if image is not None:
            images.append(image)
    if record.snapshot is not None:
        sections.append(
            f"--- state kept ---\n{record.snapshot.id} (give it as continue_from to go on "
            "from this state)"
        )
    if notes:
        sections.append("--- notes ---\n" + "\n".join(f"- {note}" for note in notes))
    return [TextContent(text="\n\n".join(sections)), *images]


def distinct_charts(charts: list[Chart]) -> list[Chart]:
    """The charts without repeats: a figure saved with `savefig` and also left open shows
    up twice in the record, with the same data read back (`spec`); keep the first."""
    seen: set[str] = set()
    kept = []
    for chart in charts:
        key = chart.spec.model_dump_json() if chart.spec is not None else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        kept.append(chart)
    return kept


def _status_line(record: RunRecord, timeout: float | None) -> str:
    """`[status: succeeded, exit code 0, 120 ms]`: the run's wall time written as `gateway
    run` and the page write a duration (`42 ms` under a second, `1.3 s` from one on)."""
    parts = [f"status: {record.status}"]
    if record.exit_code is not None:
        parts.append(f"exit code {record.exit_code}")
    if record.status == "timed_out":
        limit = f" of {timeout:g} s" if timeout is not None else ""
        parts.append(f"stopped at the timeout{limit}; output until then is shown")
    elif record.kill_reason and record.status == "killed":
        parts.append(f"killed by the {record.kill_reason} limit")
    parts.append(duration(record.usage.wall_ms))
    return "[" + ", ".join(parts) + "]"


def _file_section(
    entry: ReturnedFileContent | ReturnedFileError, chart_paths: set[str]
) -> "tuple[str, ContentBlock | None]":
    from mcp_types import ImageContent

    if isinstance(entry, ReturnedFileError):
        return f"--- file {entry.path}: not returned ({entry.error}) ---", None
    path, size = entry.path, entry.size
    if entry.encoding == "utf-8":
        return f"--- file {path} ({size} bytes) ---\n" + _cut(entry.content, FILE_CHARS, 0), None
    mime = _image_mime(path)
    if mime is not None and _normal(path) in chart_paths:
        return f"--- file {path} ({size} bytes): the image of a chart above ---", None
    if mime is not None:
        image = ImageContent(data=entry.content, mime_type=mime)
        return f"--- file {path} ({size} bytes): an image, attached ---", image
    return f"--- file {path} ({size} bytes of binary data, not shown) ---", None


def _chart_description(chart: Chart) -> str:
    spec = chart.spec
    if spec is None:
        return ""
    words = [spec.type or "chart"]
    if spec.title:
        words.append(f"titled {spec.title!r}")
    labels = [
        f"{axis}: {label}" for axis, label in (("x", spec.x_label), ("y", spec.y_label)) if label
    ]
    if labels:
        words.append("(" + ", ".join(labels) + ")")
    words.append(f"with {len(spec.series)} series")
    return " ".join(words)


def _image_mime(path: str) -> str | None:
    lower = path.lower()
    if lower.endswith(".png"):
        return "image/png"
    if lower.endswith((".jpg", ".jpeg")):
        return "image/jpeg"
    return None


def _normal(path: str) -> str:
    return os.path.normpath(path)


def _cut(text: str, head: int = OUTPUT_HEAD, tail: int = OUTPUT_TAIL) -> str:
    if len(text) <= head + tail:
        return text
    dropped = len(text) - head - tail
    end = text[len(text) - tail :] if tail else ""
    return f"{text[:head]}\n[... {dropped} characters not shown ...]\n{end}"


# --- backends and transports -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway_client(
    options: MCPOptions, start_gateway: StartGateway | None
) -> AsyncIterator[AsyncGatewayClient]:
    """The client for `--url`, or for a gateway `start_gateway` runs for the life of this
    server."""
    if options.url is not None:
        async with AsyncGatewayClient(options.url, token=options.token) as client:
            try:
                health = await client.health()
                # the backend is told only to an operator's token (and without tokens)
                seen = f"{health.backend} backend" if health.backend else health.status
                log.info("using the gateway at %s (%s)", options.url, seen)
            except GatewayError as exc:
                log.warning("the gateway at %s does not answer yet: %s", options.url, exc.message)
            yield client
        return
    if start_gateway is None:
        raise RuntimeError("no --url given and no gateway to start in this process")
    async with start_gateway() as (url, token), AsyncGatewayClient(url, token=token) as client:
        log.info("started a gateway in this process at %s", url)
        yield client
    log.info("the in-process gateway stopped; every sandbox is destroyed")


async def _serve_http(server: "MCPServer[Any]", port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    http = uvicorn.Server(config)
    address = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    print(f"gateway mcp: streamable HTTP at {address}", file=sys.stderr, flush=True)
    try:
        await http.serve(sockets=[listener])
    finally:
        listener.close()


async def serve(options: MCPOptions, start_gateway: StartGateway | None = None) -> bool:
    """Serve until the transport ends (stdin closed, HTTP server stopped) or SIGTERM/SIGINT.

    Returns True when a signal ended it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with gateway_client(options, start_gateway) as client:
        try:
            environment: Environment | None = await client.environment()
        except GatewayError as exc:
            log.warning("the gateway's environment is not known: %s", exc.message)
            environment = None
        server = build_server(client, environment)
        if options.transport == "stdio":
            serving = asyncio.ensure_future(server.run_stdio_async())
        else:
            serving = asyncio.ensure_future(_serve_http(server, options.port))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not serving.done():
            serving.cancel()
            # a stdio transport may be stuck reading stdin in a thread: do not wait for it
            await asyncio.wait({serving}, timeout=2)
        elif (failure := serving.exception()) is not None:
            raise failure
    return stop.is_set()


# --- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `gateway mcp` flags (added after the settings flags; `--port` replaces theirs)."""
    parser.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio", help="stdio (default) or http"
    )
    parser.add_argument(
        "--port",
        dest="mcp_port",
        type=int,
        default=8765,
        help="HTTP transport: port on 127.0.0.1 (0: any free one)",
    )
    parser.add_argument("--url", default=None, help="use the gateway at this URL")
    parser.add_argument("--token", default=None, help="bearer token for --url")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")


def main(args: argparse.Namespace, start_gateway: StartGateway | None = None) -> int:
    """Run `gateway mcp` with parsed arguments (logging already set up, to stderr: never
    to stdout, the stdio transport's channel); `start_gateway` serves when no `--url`."""
    options = MCPOptions(
        transport=args.transport, port=args.mcp_port, url=args.url, token=args.token
    )
    try:
        signalled = asyncio.run(serve(options, start_gateway))
    except (RuntimeError, OSError) as exc:
        print(f"gateway mcp: {exc}", file=sys.stderr)
        return 1
    if signalled and options.transport == "stdio":
        # Everything is cleaned up; only the SDK's thread blocked on reading stdin is left,
        # and it would hold the interpreter open until stdin closes.
        sys.stderr.flush()
        os._exit(0)
    return 0
