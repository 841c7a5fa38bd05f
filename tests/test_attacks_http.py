"""Attacks on the HTTP and WebSocket front door (issue 8): cross-site requests from any web
page (CSRF) and JSON that is nested too deep for Python's parser.

The front door is the same on every backend (nothing here reaches past the handlers but a
`print`): these run once, against the session's local gateway (issue 30: the real backends
for what only they can show)."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, Response, serving
from tests.ws_client import handshake_status, open_stream, receive

pytestmark = pytest.mark.attack

EVIL = "http://evil.example"
# What a page on another site makes the browser send with
# fetch("http://127.0.0.1:8888/v1/runs", {method: "POST", mode: "no-cors", body, headers:
# {"Content-Type": "application/x-www-form-urlencoded"}}).
NO_CORS_POST = {
    "Origin": EVIL,
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "no-cors",
    "Sec-Fetch-Dest": "empty",
}
MARK = "csrf-ran-" + "x" * 8


def raw_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """One HTTP request with exactly these headers (no Content-Type unless given)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Response(response.status, response.headers, response.read())
    finally:
        conn.close()


def error_of(response: Response, status: int, code: str) -> dict[str, Any]:
    assert response.status == status, (response.status, response.body[:500])
    assert response.headers["Content-Type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


# --- cross-site requests ------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain;charset=UTF-8", None],
)
def test_a_cross_site_no_cors_post_runs_nothing(
    local_gateway: GatewayThread, content_type: str | None
) -> None:
    """The verified attack: any web page could run code on a single-user gateway."""
    body = json.dumps({"code": f"print({MARK!r})"}).encode()
    headers = dict(NO_CORS_POST)
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = raw_request(local_gateway.port, "POST", "/v1/runs", body, headers)
    error_of(response, 403, "forbidden")
    assert MARK.encode() not in response.body


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "text/plain",
        "multipart/form-data; boundary=x",
        "text/json",
        None,
    ],
)
@pytest.mark.parametrize(
    "path",
    ["/v1/runs", "/v1/notebooks/run", "/v1/tools/code_run", "/v1/tools/run_python"],
)
def test_only_json_media_types_are_read_as_json(
    local_gateway: GatewayThread, path: str, content_type: str | None
) -> None:
    """A page can send the form types (and none) anywhere without a CORS preflight: even
    without an Origin (a plain client) they are not read as JSON any more."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = raw_request(local_gateway.port, "POST", path, b'{"code": "1"}', headers)
    error = error_of(response, 415, "unsupported_media_type")
    assert "application/json" in error["message"]


def test_json_media_types_still_work(local_client: Client) -> None:
    record = local_client.run(code="print(6 * 7)")
    assert record["stdout"] == "42\n"
    charset = local_client.request(
        "POST",
        "/v1/runs",
        {"code": "print(1)"},
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert charset.status == 200 and charset.json()["stdout"] == "1\n"


# Every route, by a method it answers, with a body where it takes one.
EVERY_ENDPOINT = [
    ("GET", "/v1/health", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("POST", "/v1/runs", {"code": "1"}),
    ("GET", "/v1/runs/run_00000000000000000000", None),
    ("DELETE", "/v1/runs/run_00000000000000000000", None),
    ("GET", "/v1/runs/run_00000000000000000000/notebook", None),
    ("POST", "/v1/notebooks/run", {"cells": []}),
    ("POST", "/v1/uploads", None),
    ("POST", "/v1/tools/code_run", {"arguments": {"code": "1"}}),
    ("POST", "/v1/tools/run_python", {"params": {"source": "1"}}),
    ("POST", "/v1/tools/code_exec", {"code": "1"}),
    ("GET", "/", None),
    ("GET", "/static/app.js", None),
]


@pytest.mark.parametrize(("method", "path", "body"), EVERY_ENDPOINT)
@pytest.mark.parametrize(
    "origin",
    [EVIL, "null", "http://127.0.0.1:1", "http://localhost", "file://"],
)
def test_every_endpoint_refuses_a_foreign_origin(
    local_gateway: GatewayThread, method: str, path: str, body: Any, origin: str
) -> None:
    """Another port of the same host is another origin (a dev server on localhost:3000 is
    'same-site', not 'same-origin'); `null` is a sandboxed frame or a file."""
    headers = {"Origin": origin, "Content-Type": "application/json"}
    data = None if body is None else json.dumps(body).encode()
    error_of(raw_request(local_gateway.port, method, path, data, headers), 403, "forbidden")


@pytest.mark.parametrize(("method", "path", "body"), EVERY_ENDPOINT)
def test_every_endpoint_refuses_sec_fetch_site_cross_site(
    local_gateway: GatewayThread, method: str, path: str, body: Any
) -> None:
    """A cross-site GET (an <img>, a no-cors fetch) carries no Origin, but says where it
    comes from in Sec-Fetch-Site."""
    headers = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    headers["Content-Type"] = "application/json"
    data = None if body is None else json.dumps(body).encode()
    error_of(raw_request(local_gateway.port, method, path, data, headers), 403, "forbidden")


def test_a_link_from_another_site_still_opens_the_page(local_gateway: GatewayThread) -> None:
    navigate = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    page = raw_request(local_gateway.port, "GET", "/", headers=navigate)
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    # ... but a navigation is only a way to open the page, never to post to the API
    posted = raw_request(
        local_gateway.port,
        "POST",
        "/v1/runs",
        b'{"code": "1"}',
        {**navigate, "Origin": EVIL, "Content-Type": "application/json"},
    )
    error_of(posted, 403, "forbidden")
    api = raw_request(local_gateway.port, "GET", "/v1/health", headers=navigate)
    error_of(api, 403, "forbidden")


def test_the_page_and_plain_clients_keep_working(local_gateway: GatewayThread) -> None:
    port = local_gateway.port
    same = {
        "Origin": f"http://127.0.0.1:{port}",
        "Sec-Fetch-Site": "same-origin",
        "Content-Type": "application/json",
    }
    ran = raw_request(port, "POST", "/v1/runs", b'{"code": "print(2)"}', same)
    assert ran.status == 200 and ran.json()["stdout"] == "2\n"
    localhost = {**same, "Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    assert raw_request(port, "GET", "/v1/health", headers=localhost).status == 200
    for site in ("same-origin", "none", "same-site"):  # "none": typed into the address bar
        assert raw_request(port, "GET", "/", headers={"Sec-Fetch-Site": site}).status == 200
    # a plain API client sends neither Origin nor Sec-Fetch-*
    plain = raw_request(port, "GET", "/v1/health")
    assert plain.status == 200


@pytest.fixture(scope="module")
def partner() -> Iterator[GatewayThread]:
    """A gateway whose operator allows one other web origin."""
    yield from serving(start_gateway("local", allowed_origins=("https://app.example",)))


def test_an_allowed_origin_may_call_the_api(partner: GatewayThread) -> None:
    headers = {
        "Origin": "https://app.example",
        "Sec-Fetch-Site": "cross-site",
        "Content-Type": "application/json",
    }
    ran = raw_request(partner.port, "POST", "/v1/runs", b'{"code": "print(3)"}', headers)
    assert ran.status == 200 and ran.json()["stdout"] == "3\n"
    other = {**headers, "Origin": "https://app.example.evil.example"}
    error_of(raw_request(partner.port, "GET", "/v1/health", headers=other), 403, "forbidden")


def test_the_websocket_refuses_cross_site_handshakes(local_gateway: GatewayThread) -> None:
    async def main() -> None:
        port = local_gateway.port
        assert await handshake_status(port, {"Origin": EVIL}) == 403
        assert await handshake_status(port, {"Origin": "http://localhost:3000"}) == 403
        assert await handshake_status(port, {"Sec-Fetch-Site": "cross-site"}) == 403
        own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        assert await handshake_status(port, own) == 101
        assert await handshake_status(port, {}) == 101

    asyncio.run(main())


# --- JSON nested too deep -----------------------------------------------------------------

LIMIT = 64  # the default max_json_depth


def nested(depth: int, leaf: Any = 0) -> Any:
    """A value of exactly `depth` levels: lists inside lists, with an object at the top."""
    value = leaf
    for _ in range(depth - 1):
        value = [value]
    return {"x": value}


def nested_text(depth: int) -> str:
    return '{"x":' + "[" * (depth - 1) + "0" + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("depth", [LIMIT + 1, 1000, 50_000])
@pytest.mark.parametrize(
    "path",
    ["/v1/runs", "/v1/notebooks/run", "/v1/tools/code_run", "/v1/tools/run_python"],
)
def test_json_nested_over_the_limit_is_a_400(local_client: Client, path: str, depth: int) -> None:
    """50,000 levels (100,000 raised RecursionError, a 500; at 100,000 values the body is now
    over `max_json_values` first); ~990 passed the parser and failed later."""
    response = local_client.request("POST", path, raw=nested_text(depth).encode())
    error = error_of(response, 400, "invalid_request")
    assert "nested" in error["message"]


def test_json_nested_at_the_limit_runs(local_client: Client) -> None:
    """Exactly at the limit: `vars` reach the kernel and come back as `result`."""
    # the body object and `vars` take two levels
    record = local_client.run(code="result = v", vars={"v": nested(LIMIT - 2)})
    assert record["status"] == "succeeded", record["notes"]
    assert record["result"] == nested(LIMIT - 2)
    over = local_client.request("POST", "/v1/runs", {"code": "1", "vars": {"v": nested(LIMIT - 1)}})
    assert "nested" in error_of(over, 400, "invalid_request")["message"]


def test_a_notebook_nested_at_and_over_the_limit(local_client: Client) -> None:
    cell = {
        "cell_type": "code",
        "source": "print('deep')",
        "metadata": {},
        "outputs": [],
        "execution_count": None,
    }
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]}
    # the notebook, its cells list and the cell take 3 levels; metadata fills the rest
    cell["metadata"] = {"deep": nested(LIMIT - 4)}
    ok = local_client.request("POST", "/v1/notebooks/run", notebook)
    assert ok.status == 200, ok.body[:500]
    assert ok.json()["run"]["stdout"] == "deep\n"
    cell["metadata"] = {"deep": nested(LIMIT - 3)}
    error = error_of(
        local_client.request("POST", "/v1/notebooks/run", notebook), 400, "invalid_request"
    )
    assert "nested" in error["message"]


def test_websocket_messages_nested_at_and_over_the_limit(local_gateway: GatewayThread) -> None:
    async def main() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with open_stream(local_gateway.port) as ws:
            for depth in (50_000, LIMIT + 1):
                text = '{"type":"run","ref":"deep","vars":' + nested_text(depth - 1) + "}"
                await ws.write_message(text)
                events.append(await receive(ws))
            ok = {"type": "run", "ref": "ok", "code": "print(len(v))", "vars": {"v": nested(61)}}
            await ws.write_message(json.dumps(ok))
            while not events or events[-1]["type"] != "done":
                events.append(await receive(ws))
        return events

    events = asyncio.run(main())
    for event in events[:2]:
        assert event["type"] == "error", event
        assert event["error"]["code"] == "invalid_request"
        assert "nested" in event["error"]["message"]
    assert events[-1]["run"]["stdout"] == "1\n"


@pytest.mark.parametrize(
    "body",
    [
        b'{"code": "1", "timeout": NaN}',
        b'{"code": "1", "vars": {"x": Infinity}}',
        b'{"code": "1", "vars": {"x": 1e999}}',  # parsed as a float, it was infinity
        b'{"code": "1", "vars": {"x": [-1.5E+400]}}',
        b'{"code": "1", "vars": {"x": ' + b"9" * 5000 + b"}}",
        b'{"code": "1"' + b" " * 10 + b"\xff}",
        b"\xef\xbb\xbf{}",
    ],
)
def test_what_json_loads_raises_besides_decode_errors_is_a_400(
    local_client: Client, body: bytes
) -> None:
    """An integer of 5000 digits raised ValueError (a 500); NaN is not JSON."""
    error_of(local_client.request("POST", "/v1/runs", raw=body), 400, "invalid_request")


@pytest.mark.parametrize(
    "body",
    [
        b'{"code": "print(1)\\ud800"}',
        b'{"code": "print(1)", "vars": {"a": "\\udfff"}}',
        b'{"code": "print(1)", "env": {"A": "\\ud800"}}',
        b'{"code": "print(1)", "files": [{"path": "a\\ud800", "content": "x"}]}',
        b'{"code": "print(1)", "return_files": ["\\ud800"]}',
        b'{"code": "print(1)", "vars": {"\\ud800": 1}}',
    ],
)
def test_strings_with_lone_surrogates_are_a_400(local_client: Client, body: bytes) -> None:
    """Valid JSON, but not Unicode text: they made runs fail inside the gateway (staging,
    the kernel message, reading return files) and logged errors."""
    error = error_of(local_client.request("POST", "/v1/runs", raw=body), 400, "invalid_request")
    assert "surrogate" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"code": "1", "language": "x" * 1_000_000},
        {"code": "1", "files": [{"path": "/" + "a" * 1_000_000, "content": ""}]},
        {"code": "1", "y" * 1_000_000: 1},
    ],
)
def test_an_error_never_echoes_more_than_a_little_of_the_request(
    local_client: Client, body: dict[str, Any]
) -> None:
    response = local_client.request("POST", "/v1/runs", body)
    assert 400 <= response.status < 500
    assert len(response.body) < 3000, len(response.body)


def test_a_websocket_error_never_echoes_a_huge_id(local_gateway: GatewayThread) -> None:
    async def main() -> Any:
        async with open_stream(local_gateway.port) as ws:
            await ws.write_message(json.dumps({"type": "cancel", "id": "r" * 1_000_000}))
            message = await asyncio.wait_for(ws.read_message(), 60)
        assert isinstance(message, str)
        assert len(message) < 3000, len(message)
        return json.loads(message)

    event = asyncio.run(main())
    assert event["type"] == "error" and event["error"]["code"] == "not_found"
    assert "id" not in event


@pytest.fixture(scope="module")
def careless() -> Iterator[GatewayThread]:
    """A single-user gateway whose operator allowed every origin."""
    yield from serving(start_gateway("local", allowed_origins=("*",)))


def test_any_origin_is_not_allowed_without_tokens(careless: GatewayThread) -> None:
    """`*` would let every web page run code as the local user: ignored without tokens."""
    body = json.dumps({"code": f"print({MARK!r})"}).encode()
    headers = {**NO_CORS_POST, "Content-Type": "application/json"}
    error_of(raw_request(careless.port, "POST", "/v1/runs", body, headers), 403, "forbidden")
    assert asyncio.run(handshake_status(careless.port, {"Origin": EVIL})) == 403
