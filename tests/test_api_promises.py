"""Promises of docs/API.md that need a run, a gateway with small limits, or a broken gateway
to be seen kept: the 500 `internal` answer, the 413s for `files`, the `max_timeout` clamp
in practice, the `return_files` limits, the caps on the WebSocket's live output, `vars`
keys `input` and `output`, RFC 3339 times, and `unsupported_language` naming every
language. The sandbox defaults are in test_sandbox_defaults.py."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import re
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api import assert_error, poll_run, submit
from tests.conftest import BACKENDS, start_gateway
from tests.stream_client import connect, outputs_of, stream_text
from tests.support import Client, GatewayThread

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend

# API.md: "language": "python" | "bash"; an unsupported one is refused naming them all.
SUPPORTED = ("python", "bash", "javascript", "typescript", "r")  # docs/API.md's languages

CAP = 10_000  # stream_cap_bytes: stdout, stderr and output are each cut to this
DISPLAY_CAP = 60_000  # display_cap_bytes: rich outputs kept per run
LIMITS: dict[str, Any] = {
    "max_timeout": 3.0,
    "stream_cap_bytes": CAP,
    "display_cap_bytes": DISPLAY_CAP,
    "max_files": 3,
    "max_file_bytes": 100,
    "max_files_bytes": 250,
    "max_return_files": 4,
    "max_return_file_bytes": 100,
    "max_return_files_bytes": 250,
}


@pytest.fixture(scope="module")
def limited_gateways() -> Iterator[dict[str, GatewayThread]]:
    """The module's gateways with LIMITS, one per backend, started on first use."""
    started: dict[str, GatewayThread] = {}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


def _limited(gateways: dict[str, GatewayThread], backend: str) -> GatewayThread:
    if backend not in gateways:
        gateways[backend] = start_gateway(backend, **LIMITS)
    return gateways[backend]


@pytest.fixture(params=BACKENDS)
def limited(request: pytest.FixtureRequest, limited_gateways: dict[str, GatewayThread]) -> Client:
    """A client of the gateway with LIMITS, on each backend."""
    return _limited(limited_gateways, str(request.param)).client()


@pytest.fixture
def limited_local(limited_gateways: dict[str, GatewayThread]) -> Client:
    """The same on the local backend only, for checks that never reach a sandbox."""
    return _limited(limited_gateways, "local").client()


# --- 500 internal -------------------------------------------------------------------------

LEAKS = (b"Traceback", b'File "', b"sqlite", b"OperationalError", b"no such table")


def _assert_internal(response: Any) -> None:
    assert_error(response, 500, "internal")
    for leak in LEAKS:
        assert leak not in response.body, response.body


def _logged(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    """An error was logged with the run store's exception attached, its message naming
    `what`."""
    return any(
        r.levelno >= logging.ERROR
        and r.exc_info is not None
        and r.exc_info[0] is not None
        and issubclass(r.exc_info[0], sqlite3.OperationalError)
        and what in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.logs_errors
def test_a_bug_is_a_logged_500_internal_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real fault, not a mocked handler: the run store's table is dropped under the
    running gateway, so every request that touches a record fails inside the gateway."""
    server = start_gateway("local")
    try:
        client = server.client()
        run_id = client.run(code="print(1)")["id"]
        with sqlite3.connect(server.settings.data_dir / "runs.sqlite3") as db:
            db.execute("DROP TABLE runs")
        caplog.clear()

        _assert_internal(client.request("POST", "/v1/runs", {"code": "print(2)"}))
        assert _logged(caplog, "POST /v1/runs"), caplog.text
        _assert_internal(client.request("GET", f"/v1/runs/{run_id}"))
        assert _logged(caplog, f"GET /v1/runs/{run_id}"), caplog.text
        _assert_internal(client.request("GET", f"/v1/runs/{run_id}/notebook"))

        async def over_the_stream() -> dict[str, Any]:
            async with connect(server.port) as stream:
                stream.send({"type": "run", "ref": "r", "code": "print(3)"})
                return await stream.until(lambda e: e["type"] == "error")

        event = asyncio.run(over_the_stream())
        assert event["ref"] == "r" and event["error"]["code"] == "internal", event
        assert set(event["error"]) == {"code", "message"}, event
        assert not any(leak.decode() in event["error"]["message"] for leak in LEAKS), event
        assert _logged(caplog, "stream message failed"), caplog.text
    finally:
        server.stop()


# --- files: 413 for count and size ---------------------------------------------------------


def _file(path: str, size: int) -> dict[str, str]:
    return {"path": path, "content": "x" * size}


def _b64(path: str, data: bytes) -> dict[str, str]:
    return {"path": path, "content": base64.b64encode(data).decode(), "encoding": "base64"}


@pytest.mark.parametrize(
    ("files", "field", "mention"),
    [
        ([_file(f"f{i}", 1) for i in range(4)], "files", "3"),  # count
        ([_file("big", 101)], "files[0]", "100"),  # one file
        ([_file("ok", 1), {"path": "wide", "content": "é" * 51}], "files[1]", "100"),  # bytes
        ([_b64("b64", b"\0" * 101)], "files[0]", "100"),  # decoded size
        ([_file("a", 100), _file("b", 100), _file("c", 51)], "files", "250"),  # the total
    ],
    ids=["count", "one-file", "utf8-bytes", "base64-decoded", "total"],
)
def test_files_over_the_operators_limits_are_413_naming_the_limit(
    limited_local: Client, files: list[dict[str, str]], field: str, mention: str
) -> None:
    response = limited_local.request("POST", "/v1/runs", {"code": "1", "files": files})
    assert_error(response, 413, "payload_too_large", mention, field=field)


def test_files_at_the_limits_are_staged(limited_local: Client) -> None:
    files = [
        _file("a", 100),
        _b64("b", b"\xff" * 100),  # 136 characters, 100 bytes
        _file("c", 50),
    ]
    code = "import os\nresult = sorted((n, os.path.getsize(n)) for n in os.listdir('.'))"
    record = limited_local.run(code=code, files=files)
    assert record["result"] == [["a", 100], ["b", 100], ["c", 50]], record


# --- the timeout clamp, in practice ---------------------------------------------------------


def test_a_timeout_over_max_timeout_ends_the_run_at_max_timeout(limited: Client) -> None:
    """`timeout: 100` on a gateway whose max_timeout is 3 s: code that never ends on its own
    is ended by the clamped deadline, and the record says so. (Without the clamp it would
    run 100 s: wall_ms tells, with room to spare for a busy machine.)"""
    record = limited.run(code="while True:\n    pass", timeout=100)
    assert record["status"] == "timed_out" and record["timed_out"] is True, record
    assert record["kill_reason"] == "timeout" and record["exit_code"] is None, record
    assert any("100 s was clamped to 3 s" in note for note in record["notes"]), record["notes"]
    assert record["usage"]["wall_ms"] < 60_000, record["usage"]


# --- return_files limits ------------------------------------------------------------------


def test_more_return_files_than_allowed_is_413(limited_local: Client) -> None:
    body = {"code": "1", "return_files": [f"f{i}" for i in range(5)]}
    response = limited_local.request("POST", "/v1/runs", body)
    assert_error(response, 413, "payload_too_large", "4", field="return_files")


def test_a_glob_returns_at_most_max_return_files_with_a_note(limited: Client) -> None:
    code = "import os\nos.mkdir('many')\nfor i in range(6):\n    open(f'many/f{i}.txt', 'w').write(str(i))"
    record = limited.run(code=code, return_files=["many/*.txt"])
    assert [(f["path"], f["content"]) for f in record["files"]] == [
        (f"many/f{i}.txt", str(i)) for i in range(4)
    ], record["files"]
    assert any("first 4" in note for note in record["notes"]), record["notes"]


def test_return_files_over_the_size_limits_are_errors_not_content(limited: Client) -> None:
    code = (
        "open('big.txt', 'w').write('b' * 101)\n"
        "for name in ('t1.txt', 't2.txt', 't3.txt'):\n"
        "    open(name, 'w').write('t' * 100)\n"
    )
    record = limited.run(code=code, return_files=["big.txt", "t1.txt", "t2.txt", "t3.txt"])
    big, t1, t2, t3 = record["files"]
    assert big["path"] == "big.txt" and "content" not in big, big
    assert big["size"] == 101 and "100 bytes" in big["error"], big
    assert (t1["content"], t2["content"]) == ("t" * 100, "t" * 100)
    # 250 bytes in all: the third 100-byte file would pass it
    assert t3["path"] == "t3.txt" and "content" not in t3, t3
    assert "total" in t3["error"], t3


# --- the WebSocket's live output is capped as the record is ---------------------------------

FLOOD = (
    "from IPython.display import display, HTML\n"
    "print('first', flush=True)\n"
    "for i in range(3000):\n"
    "    print(f'line {i:05d}')\n"  # 33 kB of stdout, over the 10 kB cap
    "for i in range(5):\n"
    "    display(HTML(f'<p>{i}</p>' + 'x' * 20_000))\n"  # 100 kB of rich output, cap 60 kB
)


def test_live_output_over_the_websocket_stops_at_the_caps(limited: Client) -> None:
    async def main() -> list[dict[str, Any]]:
        async with connect(limited.port) as stream:
            return await stream.run("flood", code=FLOOD)

    events = asyncio.run(main())
    record = events[-1]["run"]
    assert record["status"] == "succeeded", record
    live = stream_text(events)
    assert live.startswith("first\n"), live[:100]
    assert len(live.encode()) <= CAP, len(live.encode())
    assert record["stdout_truncated"] and record["stdout"].rstrip().endswith("line 02999")
    # what was sent live is the start of what the record keeps as the head, or holds it
    head = record["stdout"][: record["stdout"].index("\n[...")]
    assert head.startswith(live) or live.startswith(head), (live[-100:], head[-100:])
    live_displays = [o for o in outputs_of(events) if o["output_type"] == "display_data"]
    kept = [o for o in record["outputs"] if o["output_type"] == "display_data"]
    assert 0 < len(kept) < 5 and live_displays == kept, (len(live_displays), len(kept))
    assert any("rich output" in note for note in record["notes"]), record["notes"]


# --- vars: `input` and `output` are reserved -----------------------------------------------


def test_vars_input_and_output_are_only_keys_of_input(client: Client) -> None:
    code = (
        "result = [type(input).__name__, sorted(input), input['input'], input['output'],"
        " x, 'output' in globals()]"
    )
    record = client.run(code=code, vars={"input": 1, "output": 2, "x": 3})
    assert record["result"] == ["dict", ["input", "output", "x"], 1, 2, 3, False], record
    # a var named `output` is not the run's result (the global `output` is)
    assert client.run(code="pass", vars={"output": "from vars"})["result"] is None


# --- times are RFC 3339 --------------------------------------------------------------------

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _instant(value: Any) -> dt.datetime:
    assert isinstance(value, str) and RFC3339.match(value), value
    parsed = dt.datetime.fromisoformat(value)
    assert parsed.tzinfo is not None, value
    return parsed


@pytest.fixture
def far_time_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process (gateway threads included) in UTC+14 for the test, so that local time
    written as UTC is caught even on a machine that runs in UTC."""
    monkeypatch.setenv("TZ", "FAR-14")
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.usefixtures("far_time_zone")
def test_started_and_finished_at_are_rfc3339_instants(local_client: Client) -> None:
    assert time.localtime().tm_gmtoff == 14 * 3600
    before = dt.datetime.now(dt.UTC)
    record = local_client.run(code="print(1)")
    after = dt.datetime.now(dt.UTC)
    started, finished = _instant(record["started_at"]), _instant(record["finished_at"])
    # the right instant, not local time labelled UTC (a minute's room for clock jitter)
    slack = dt.timedelta(minutes=1)
    assert before - slack <= started <= finished <= after + slack, (before, record, after)

    run_id = submit(local_client, {"code": "import time\ntime.sleep(120)"})
    try:
        running = poll_run(local_client, run_id, until=lambda r: r["status"] == "running")
        _instant(running["started_at"])
        assert running["finished_at"] is None, running
    finally:
        cancelled = local_client.request("DELETE", f"/v1/runs/{run_id}").json()
    assert _instant(cancelled["finished_at"]) >= _instant(cancelled["started_at"])


# --- unsupported_language names every language ---------------------------------------------


@pytest.mark.parametrize("language", ["ruby", "Python", "", 5, ["python"]])
def test_unsupported_language_names_every_supported_one(
    local_client: Client, language: Any
) -> None:
    response = local_client.request("POST", "/v1/runs", {"code": "1", "language": language})
    error = assert_error(response, 400, "unsupported_language", field="language")
    assert _listed(error["message"]) == set(SUPPORTED), error


def _listed(message: str) -> set[str]:
    """The languages a refusal lists after "use one of:", each a whole name."""
    assert "use one of:" in message, message
    return {name.strip(" .") for name in message.split("use one of:", 1)[1].split(",")}


def test_a_notebook_in_an_unsupported_language_names_every_supported_one(
    local_client: Client,
) -> None:
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "cells": [],
        "metadata": {
            "kernelspec": {"name": "julia-1.10", "language": "julia", "display_name": "Julia"}
        },
    }
    response = local_client.request("POST", "/v1/notebooks/run", notebook)
    error = assert_error(response, 400, "unsupported_language", "julia")
    assert _listed(error["message"]) == set(SUPPORTED), error
