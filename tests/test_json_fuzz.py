"""The request parsers, fuzzed at the JSON level (issue 8): whatever JSON a client sends, the
answer is a run or the API's 4xx error shape, never a 500.

Bodies are built by hypothesis from JSON values whose object keys are mostly the fields the
endpoints know, so that the fuzzing gets past "unknown field" into every field's checks.
The parsers are called directly (many cases, no kernel) and through the real gateway on
one backend (conftest.OneBackend) (fewer cases: a valid body really runs, with its timeouts cut to 1 s)."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.auth import Principal
from gateway.errors import GatewayError
from gateway.jsoncodec import JsonLimits, parse_json
from gateway.models.notebook import NotebookBody
from gateway.models.run import RunBody
from gateway.models.tools import CodeExecBody, CodeRunArguments, RunPythonInput, RunPythonParams
from gateway.runs.config import RequestPolicy
from gateway.runs.requests import parse_notebook_request, parse_run_request
from gateway.tools.code_exec import parse_code_exec
from gateway.tools.code_run import parse_code_run
from gateway.tools.run_python import parse_run_python
from tests.support import Client, GatewayThread, part_config
from tests.ws_client import open_stream, receive

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = [pytest.mark.attack, pytest.mark.one_backend]

RUN_FIELDS = frozenset(RunBody.model_fields)
CODE_EXEC_FIELDS = frozenset(CodeExecBody.model_fields)
ARGUMENTS = frozenset(CodeRunArguments.model_fields)
KEYS = sorted(
    RUN_FIELDS
    | set(NotebookBody.model_fields)
    | CODE_EXEC_FIELDS
    | ARGUMENTS
    | set(RunPythonInput.model_fields)
    | set(RunPythonParams.model_fields)
    | {"path", "content", "encoding", "arguments", "input", "params", "type", "ref", "id"}
    | {"nbformat", "nbformat_minor", "cells", "cell_type", "source", "outputs", "metadata"}
    | {"execution_count", "kernelspec", "language_info", "name", "tags", "\udfff"}
)
TEXTS = [
    "",
    ".",
    "..",
    "../x",
    "/etc/passwd",
    "a/b.py",
    "*",
    "**/*",
    "x\x00y",
    "python",
    "bash",
    "base64",
    "utf-8",
    "code.run_python",
    "print(1)",
    "echo hi",
    "main.py",
    "upl_" + "0" * 32,
    "raises-exception",
    "\u2603",
    "\ud800",
    "a" * 300,
]
# A string that `encode` replaces by arrays nested this deep (json.dumps itself would
# recurse too deep to write them).
DEEP = st.sampled_from([2, 60, 63, 64, 65, 900, 990, 3000]).map(lambda d: f"\x00deep{d}\x00")
_DEEP_TOKEN = re.compile(r'"\\u0000deep(\d+)\\u0000"')


def encode(body: Any) -> bytes:
    """The body as JSON text, with every DEEP placeholder replaced by nested arrays."""
    text = json.dumps(body)
    return _DEEP_TOKEN.sub(lambda m: "[" * int(m[1]) + "]" * int(m[1]), text).encode()


SCALARS = (
    st.none()
    | DEEP
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, 1, 4, 5, 300, 1e308, -1, 0.5])
    | st.text(max_size=20)
    | st.sampled_from(TEXTS)
)
KEY = st.sampled_from(KEYS) | st.text(max_size=8)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEY, inner, max_size=6),
    max_leaves=25,
)
CODE = st.sampled_from(["print(1)", "1/0", "result = 2", "echo hi", "import sys; sys.exit(3)"])
VALUE = JSON | SCALARS


def near_valid(required: dict[str, Any], optional: frozenset[str]) -> st.SearchStrategy[Any]:
    """Objects with the required fields and any of the optional ones, of any value."""
    return st.fixed_dictionaries(required, optional={k: VALUE for k in sorted(optional)})


CELL = st.fixed_dictionaries(
    {"cell_type": st.sampled_from(["code", "markdown", "raw"]), "source": CODE},
    optional={"metadata": VALUE, "outputs": VALUE, "execution_count": VALUE, "id": VALUE},
)
NEAR_VALID = {
    "/v1/runs": near_valid({"code": CODE}, RUN_FIELDS - {"code"}),
    "/v1/tools/code_exec": near_valid({"code": CODE}, CODE_EXEC_FIELDS - {"code"}),
    "/v1/tools/code_run": st.fixed_dictionaries(
        {"arguments": near_valid({"code": CODE}, ARGUMENTS - {"code"})}
    ),
    "/v1/tools/run_python": st.fixed_dictionaries(
        {
            "params": near_valid(
                {"source": CODE}, frozenset(RunPythonParams.model_fields) - {"source"}
            )
        },
        optional={"input": near_valid({}, frozenset(RunPythonInput.model_fields)), "type": VALUE},
    ),
    "/v1/notebooks/run": st.fixed_dictionaries(
        {
            "nbformat": st.sampled_from([4, 3, 5, "4"]),
            "nbformat_minor": st.sampled_from([0, 4, 5, -1]),
            "metadata": st.just({}) | VALUE,
            "cells": st.lists(CELL, max_size=3),
        }
    ),
}
BODIES = st.dictionaries(KEY, JSON, max_size=8) | JSON | st.one_of(*NEAR_VALID.values())


@pytest.fixture(scope="module")
def workspaces() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fuzzws-") as root:
        yield Path(root)


def parsers(root: Path) -> list[Callable[[Any], Any]]:
    plain = part_config(RequestPolicy, max_code_bytes=4096)
    open_ = part_config(
        RequestPolicy, max_code_bytes=4096, allow_uploads=True, allow_network=True, workspaces=root
    )
    result: list[Callable[[Any], Any]] = []
    for s in (plain, open_):
        for caller in (Principal("u", "user"), Principal("u", "admin")):
            result += [
                lambda b, s=s, c=caller: parse_run_request(b, s, c),
                lambda b, s=s, c=caller: parse_code_run(b, s, c),
                lambda b, s=s, c=caller: parse_run_python(b, s, c, archives=True),
                lambda b, s=s, c=caller: parse_code_exec(b, s, c),
                lambda b, s=s, c=caller: parse_notebook_request(b, s, c),
            ]
    return result


def assert_client_error(call: Callable[[], Any]) -> None:
    try:
        call()
    except GatewayError as exc:
        assert 400 <= exc.status < 500, (exc.status, exc.code, exc.message)
        assert exc.code and exc.message


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(body=BODIES)
def test_the_parsers_answer_any_json_with_a_request_or_a_4xx(workspaces: Path, body: Any) -> None:
    for parse in parsers(workspaces):
        assert_client_error(lambda parse=parse: parse(body))


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(body=BODIES, wrap=st.sampled_from(["arguments", "params", "notebook", "input", None]))
def test_the_parsers_answer_nested_envelopes_with_a_4xx(
    workspaces: Path, body: Any, wrap: str | None
) -> None:
    """The tools and notebooks nest their fields one level down."""
    wrapped = body if wrap is None else {wrap: body, "type": "code.run_python"}
    for parse in parsers(workspaces):
        assert_client_error(lambda parse=parse: parse(wrapped))


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(
    text=st.one_of(
        st.binary(max_size=64),
        st.text(max_size=64),
        BODIES.map(json.dumps),
        st.integers(0, 5000).map(lambda d: "[" * d + "]" * d),
        st.integers(0, 5000).map(lambda d: '{"a":' * d + "1" + "}" * d),
        st.integers(0, 5000).map(lambda d: "[" * d),
        st.sampled_from(["NaN", "-Infinity", "1" * 5000, '"\\ud800"', '{"\\udfff": 1}']),
    )
)
def test_the_body_parser_answers_any_bytes_with_a_value_a_400_or_a_413(text: bytes | str) -> None:
    try:
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
        parse_json(data, JsonLimits(depth=64, values=1000))
    except GatewayError as exc:
        assert (exc.status, exc.code) in (
            (400, "invalid_request"),
            (413, "payload_too_large"),
        ), exc.message


def tame(body: Any) -> Any:
    """Every timeout of a body that may really run becomes 1 s."""
    if isinstance(body, dict):
        return {
            key: 1 if key in ("timeout", "cell_timeout", "timeout_seconds") else tame(value)
            for key, value in body.items()
        }
    if isinstance(body, list):
        return [tame(item) for item in body]
    return body


# against a live gateway: the same examples every time, no time limit per example, and its
# fixtures (the gateway, a client) shared by the examples
LIVE = settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ENDPOINTS = ["/v1/runs", "/v1/notebooks/run", "/v1/tools/code_run", "/v1/tools/run_python"]
ENDPOINTS += ["/v1/tools/code_exec"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(LIVE, max_examples=60)
@given(data=st.data(), path=st.sampled_from(ENDPOINTS))
def test_the_gateway_answers_any_json_body_without_a_5xx(
    client: Client, data: st.DataObject, path: str
) -> None:
    body = data.draw(NEAR_VALID[path] | BODIES)
    response = client.request("POST", path, raw=encode(tame(body)), timeout=120)
    assert response.status < 500, response.body[:1000]
    if response.status >= 400:
        error = response.json()["error"]
        assert set(error) <= {"code", "message", "field"} and error["code"] != "internal"


MESSAGES = NEAR_VALID["/v1/runs"].map(lambda d: {"type": "run", **d}) | st.dictionaries(
    KEY, JSON, max_size=8
).map(lambda d: {"type": "run", **d} if len(d) % 2 else d)


@pytest.mark.slow
@pytest.mark.timeout(600)
@settings(LIVE, max_examples=1)
@given(bodies=st.lists(MESSAGES, min_size=30, max_size=30))
def test_the_websocket_answers_any_json_message_without_an_internal_error(
    gateway: GatewayThread, bodies: list[dict[str, Any]]
) -> None:
    messages = [encode(tame(body)).decode() for body in bodies]

    async def main() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with open_stream(gateway.port) as ws:
            for message in messages:
                await ws.write_message(message)
            # each message gets an `error` or an `accepted`, and each accepted run a `done`
            while sum(e["type"] in ("error", "done") for e in events) < len(messages):
                event = await receive(ws, 120)
                assert event is not None, events
                events.append(event)
        return events

    for event in asyncio.run(main()):
        if event["type"] == "error":
            assert event["error"]["code"] != "internal", event
