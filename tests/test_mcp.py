"""`gateway mcp`: the MCP server driven by the MCP SDK's own client, over stdio (spawning
`python -m gateway mcp`) and over streamable HTTP, with a gateway in the server's process on
the local backend, or a running gateway behind `--url`."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ImageContent, TextContent

from gateway.commands.mcp import format_record
from gateway.models.record import RunRecord, Usage
from tests import census
from tests.support import REPO, GatewayThread, new_instance_id, wait_for

pytestmark = pytest.mark.slow

CHART = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title('squares')
plt.show()
print('drawn')
"""


def server_args(*extra: str) -> list[str]:
    return [
        "-m",
        "gateway",
        "mcp",
        "--backend",
        "local",
        "--instance-id",
        new_instance_id(),
        *extra,
    ]


def environment() -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", "/root")}


@contextlib.asynccontextmanager
async def stdio_session(*extra: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=server_args(*extra), env=environment(), cwd=str(REPO)
    )
    with tempfile.TemporaryFile("w+") as log:
        async with (
            stdio_client(params, errlog=log) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def texts(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def images(result: CallToolResult) -> list[ImageContent]:
    return [c for c in result.content if isinstance(c, ImageContent)]


def status_line(result: CallToolResult) -> str:
    """The first line of the answer: `[status: ..., <wall time>]`."""
    return texts(result).splitlines()[0]


def wall_time_as_promised(line: str) -> float:
    """The wall time at the end of a status line, in seconds, after checking it is written
    as every duration is (issue 33): whole milliseconds under a second, seconds to a
    tenth from one on."""
    found = re.search(r", (\d+) ms\]$|, (\d+\.\d) s\]$", line)
    assert found is not None, line
    milliseconds, seconds = found.groups()
    if milliseconds is not None:
        assert int(milliseconds) < 1000, line
        return int(milliseconds) / 1000
    assert float(seconds) >= 1.0, line
    return float(seconds)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("wall_ms", "written"),
    [(120, "120 ms"), (999, "999 ms"), (1000, "1.0 s"), (1340, "1.3 s")],
)
def test_the_status_line_writes_the_wall_time_as_every_duration(wall_ms: int, written: str) -> None:
    """Milliseconds under a second, seconds to a tenth from one on, as `gateway run` and
    the page write it: a 120 ms run is `120 ms`, not `0.1 s`."""
    record = RunRecord(
        id="run_x", language="python", status="succeeded", exit_code=0, usage=Usage(wall_ms=wall_ms)
    )
    [text, *_] = format_record(record)
    assert isinstance(text, TextContent)
    assert text.text.splitlines()[0] == f"[status: succeeded, exit code 0, {written}]"


def test_stdio_lists_the_tool_and_runs_code_with_charts_and_failures() -> None:
    async def scenario() -> None:
        async with stdio_session() as session:
            tools = (await session.list_tools()).tools
            assert [t.name for t in tools] == ["run_code", "list_runs"]
            schema = tools[0].input_schema
            assert schema["required"] == ["code"]
            assert set(schema["properties"]) == {
                "code",
                "language",
                "files",
                "return_files",
                "timeout",
                "keep",
                "continue_from",
            }

            charted = await session.call_tool("run_code", {"code": CHART})
            assert not charted.is_error
            assert "status: succeeded" in texts(charted) and "drawn" in texts(charted)
            assert "titled 'squares'" in texts(charted)
            [image] = images(charted)
            assert image.mime_type == "image/png"
            assert base64.b64decode(image.data).startswith(b"\x89PNG")

            saved = await session.call_tool(
                "run_code",
                {
                    "code": "import matplotlib.pyplot as plt\nplt.bar(['a'], [1])\n"
                    "plt.savefig('c.png')",
                    "return_files": ["c.png"],
                },
            )
            assert len(images(saved)) == 1  # saved and left open: one figure, one image
            assert "c.png (" in texts(saved) and "the image of a chart above" in texts(saved)

            svg = await session.call_tool(
                "run_code",
                {
                    "code": "%config InlineBackend.figure_formats = ['svg']\n"
                    "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
                },
            )
            assert images(svg) == [] and "Chart 1 is an SVG image" in texts(svg)

            failed = await session.call_tool("run_code", {"code": "print('before')\n1/0"})
            text = texts(failed)
            assert "status: failed" in text and "exit code 1" in text and "before" in text
            assert "ZeroDivisionError" in text and "Traceback" in text
            assert "\x1b[" not in text  # no ANSI colours in what a model reads
            assert images(failed) == []

            with_files = await session.call_tool(
                "run_code",
                {
                    "code": "wc -c < in.txt > out.txt; cat in.txt",
                    "language": "bash",
                    "files": [{"path": "in.txt", "content": "hello"}],
                    "return_files": ["out.txt", "missing.txt"],
                },
            )
            text = texts(with_files)
            assert "status: succeeded" in text and "hello" in text
            assert "--- file out.txt (2 bytes) ---\n5" in text
            assert "missing.txt: not returned (not found)" in text

            typed = await session.call_tool(
                "run_code",
                {"code": "const n: number = 6 * 7;\nconsole.log(n);", "language": "typescript"},
            )
            assert "status: succeeded" in texts(typed) and "42" in texts(typed), texts(typed)

            slow = await session.call_tool(
                "run_code",
                {"code": "import time\nprint('started', flush=True)\ntime.sleep(30)", "timeout": 1},
            )
            assert "status: timed_out" in texts(slow) and "started" in texts(slow)
            assert wall_time_as_promised(status_line(slow)) >= 1.0  # ran to its 1 s timeout

            refused = await session.call_tool(
                "run_code", {"code": "1", "files": [{"path": "../x", "content": ""}]}
            )
            assert refused.is_error and "invalid_path" in texts(refused)

    anyio.run(scenario)
    assert wait_for(lambda: not census.census(), timeout=30), census.census()


def test_stdio_against_a_running_gateway() -> None:
    # one backend is enough: the MCP server only talks HTTP to the gateway
    gateway = GatewayThread(backend="local").start()

    async def scenario() -> None:
        url = f"http://127.0.0.1:{gateway.port}"
        async with stdio_session("--url", url) as session:
            result = await session.call_tool("run_code", {"code": "result = 6 * 7"})
            assert "--- result ---\n42" in texts(result)
            wall_time_as_promised(status_line(result))  # a quick run: `734 ms`, not `0.7 s`
            failed = await session.call_tool("run_code", {"code": "# second\n1/0"})
            assert "status: failed" in texts(failed)
            listed = texts(await session.call_tool("list_runs", {"limit": 1}))
            first, more = listed.splitlines()
            assert "failed, exit code 1  python run" in first and "'# second'" in first
            # the time as the API writes it
            assert re.search(r"  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  ", first), first
            assert more.startswith("next cursor: ")
            older = await session.call_tool(
                "list_runs", {"limit": 1, "cursor": more.removeprefix("next cursor: ")}
            )
            assert "succeeded, exit code 0" in texts(older) and "'result = 6 * 7'" in texts(older)
            assert "next cursor" not in texts(older)
            succeeded = texts(await session.call_tool("list_runs", {"status": "succeeded"}))
            assert len(succeeded.splitlines()) == 1 and "result = 6 * 7" in succeeded
            refused = await session.call_tool("list_runs", {"cursor": "forged"})
            assert refused.is_error and "invalid_request" in texts(refused)

    try:
        anyio.run(scenario)
    finally:
        gateway.stop()


def test_an_agent_carries_state_from_one_call_to_the_next() -> None:
    """run_code's `keep` names a snapshot; `continue_from` runs the next code with that
    state (DESIGN decision 24: forkserver only)."""
    from tests.conftest import start_gateway

    gateway = start_gateway("forkserver")

    async def scenario() -> None:
        url = f"http://127.0.0.1:{gateway.port}"
        async with stdio_session("--url", url) as session:
            kept = texts(await session.call_tool("run_code", {"code": "x = 41", "keep": True}))
            found = re.search(r"--- state kept ---\n(snap_\S+) ", kept)
            assert found is not None, kept
            later = await session.call_tool(
                "run_code", {"code": "print(x + 1)", "continue_from": found.group(1)}
            )
            assert "--- output ---\n42" in texts(later)
            gone = await session.call_tool(
                "run_code", {"code": "print(x)", "continue_from": "snap_" + "0" * 20}
            )
            assert gone.is_error and "not_found" in texts(gone)

    try:
        anyio.run(scenario)
    finally:
        gateway.stop()


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    log = tmp_path / "mcp.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                *server_args("--transport", "http", "--port", "0", "--log-level", "INFO"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=REPO,
            env={**os.environ, **environment()},
        )
    try:
        assert wait_for(
            lambda: process.poll() is not None or "/mcp" in log.read_text(), timeout=60
        ), log.read_text()
        found = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", log.read_text())
        assert found is not None, log.read_text()
        yield process, found.group(1)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def test_streamable_http_runs_code_and_stops_cleanly_on_sigterm(
    http_server: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = http_server

    async def scenario() -> None:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = [t.name for t in (await session.list_tools()).tools]
            assert tools == ["run_code", "list_runs"]
            result = await session.call_tool("run_code", {"code": CHART})
            assert "status: succeeded" in texts(result)
            assert len(images(result)) == 1

    anyio.run(scenario)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert wait_for(lambda: not census.census(), timeout=30), census.census()


def test_sigterm_during_a_run_destroys_its_sandbox() -> None:
    """A stdio server stopped mid-run (stdin still open) cancels the run and cleans up."""
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "run_code",
                "arguments": {"code": "import time\ntime.sleep(60)", "timeout": 60},
            },
        },
    ]
    with subprocess.Popen(
        [sys.executable, *server_args()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env={**os.environ, **environment()},
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        census.own(process.pid, "the MCP server")  # its sandboxes count once it is gone
        try:
            for message in messages:
                process.stdin.write((json.dumps(message) + "\n").encode())
            process.stdin.flush()
            assert b'"id":1' in process.stdout.readline().replace(b" ", b"")
            assert wait_for(census.sandboxes_exist, timeout=30), "the run started no sandbox"
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert process.wait(15) == 0
            assert time.monotonic() - started < 5  # an MCP client kills after 2 s + 2 s
            assert wait_for(lambda: not census.census(), timeout=10), census.census()
        finally:
            if process.poll() is None:
                process.kill()
