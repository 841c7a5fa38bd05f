"""The OpenAPI document (`GET /openapi.json`) against the code: it is valid OpenAPI 3.1, its
paths and methods are exactly the app's routes, and real answers of the real app validate
against its schemas. The schemathesis fuzz run is in test_openapi_fuzz.py."""

from __future__ import annotations

import asyncio
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
import tornado.web
import tornado.websocket
from openapi_spec_validator import validate as validate_spec

from gateway.app import routes
from gateway.openapi import build_document
from tests.api import code_cell_json, notebook_json
from tests.invalid_requests import RUN_FIELD_ERRORS, status_of
from tests.openapi_support import (
    DOC,
    DOCUMENTED_ERRORS,
    METHODS,
    assert_error_answer,
    assert_valid,
)
from tests.openapi_support import FUZZ_TOKEN as TOKEN
from tests.support import Client, GatewayThread

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend

# --- the document itself --------------------------------------------------------------------


def test_document_is_valid_openapi_3_1() -> None:
    assert DOC["openapi"].startswith("3.1")
    validate_spec(DOC)


def test_the_documents_error_codes_are_those_of_the_api_contract() -> None:
    listed = DOC["components"]["schemas"]["Error"]["x-error-codes"]
    assert {int(status): set(codes) for status, codes in listed.items()} == DOCUMENTED_ERRORS


def test_validation_catches_a_broken_document() -> None:
    broken = build_document()
    broken["paths"]["/v1/runs"]["post"]["responses"]["200"] = {"content": {}}  # no description
    with pytest.raises(Exception, match="description"):
        validate_spec(broken)


def test_health_is_public_and_everything_else_needs_the_token() -> None:
    assert DOC["security"] == [{"bearer": []}]
    public = {
        (path, method)
        for path, item in DOC["paths"].items()
        for method, operation in item.items()
        if method in METHODS and operation.get("security") == []
    }
    assert public == {
        ("/v1/health", "get"),
        ("/openapi.json", "get"),
        ("/", "get"),
        ("/static/{name}", "get"),
    }


def test_an_explicit_null_is_documented_as_allowed() -> None:
    """The document says null is the same as leaving a field out: every optional field of
    every body accepts it (the hand-written document once refused null `timeout`, `files`,
    `vars` that the gateway accepted)."""
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}
    given = {
        "RunRequest": {"code": "1"},
        "StagedFile": {"path": "a.txt"},
        "StreamRunMessage": {"type": "run", "code": "1"},
        "StreamCancelMessage": {"type": "cancel", "id": "run_00"},
        "NotebookRunRequest": {"notebook": notebook},
        "CodeExecRequest": {"code": "1"},
        "CodeRunArguments": {"code": "1"},
        "RunPythonInput": {},
        "RunPythonParams": {"source": "1"},
    }
    for name, required in given.items():
        properties = DOC["components"]["schemas"][name]["properties"]
        optional = {key: None for key in properties if key not in required}
        assert len(optional) >= 1, name
        assert_valid(name, {**required, **optional})


API_MD = Path(__file__).resolve().parent.parent / "docs" / "API.md"
EXAMPLE = re.compile(r"(?:<!-- schema: (\w+) -->\n)?```json\n(.*?)```", re.DOTALL)
# ```json blocks of docs/API.md that are not a body or an answer (by their first line)
NOT_BODIES: set[str] = set()


def api_examples() -> list[tuple[str | None, str]]:
    return [(m.group(1), m.group(2)) for m in EXAMPLE.finditer(API_MD.read_text("utf-8"))]


def test_every_example_in_the_api_contract_validates() -> None:
    """Each ```json block of docs/API.md follows a `<!-- schema: Name -->` line naming the
    component it is an example of, and validates against it (or is listed in NOT_BODIES)."""
    examples = api_examples()
    named = {name for name, _ in examples if name is not None}
    assert len(named) >= 10, f"only {sorted(named)} have examples"
    for name, text in examples:
        if name is None:
            assert text.split("\n", 1)[0] in NOT_BODIES, f"an example names no schema: {text}"
            continue
        assert name in DOC["components"]["schemas"], name
        assert_valid(name, json.loads(text))


def test_a_wrong_example_fails() -> None:
    text = '<!-- schema: RunRequest -->\n```json\n{"code": 1}\n```'
    [(name, body)] = [(m.group(1), m.group(2)) for m in EXAMPLE.finditer(text)]
    with pytest.raises(AssertionError, match="RunRequest"):
        assert_valid(str(name), json.loads(body))


# --- routes <-> paths -----------------------------------------------------------------------


def route_template(pattern: str) -> str:
    """`/v1/runs/(run_[0-9a-f]{1,64}|...)/notebook` -> `/v1/runs/{}/notebook`."""
    out, depth = [], 0
    for char in pattern.rstrip("$"):
        if char == "(":
            if depth == 0:
                out.append("{}")
            depth += 1
        elif char == ")":
            depth -= 1
        elif depth == 0:
            out.append(char)
    return "".join(out)


def handler_methods(handler: type[tornado.web.RequestHandler]) -> set[str]:
    return {m for m in METHODS if getattr(handler, m) is not getattr(tornado.web.RequestHandler, m)}


def routed_operations(route_table: list[Any]) -> set[tuple[str, str]]:
    return {
        (route_template(pattern), method)
        for pattern, handler, *_ in route_table
        for method in handler_methods(handler)
    }


def documented_operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (re.sub(r"\{[^}]+\}", "{}", path), method)
        for path, item in doc["paths"].items()
        for method in item
        if method in METHODS
    }


def test_route_template_and_methods() -> None:
    assert route_template(r"/v1/runs/(run_[0-9a-f]{1,64}|[a-z]{1,9})/notebook") == (
        "/v1/runs/{}/notebook"
    )

    class Handler(tornado.web.RequestHandler):
        def get(self) -> None: ...

        def delete(self) -> None: ...

    assert routed_operations([("/x/(.*)", Handler, {})]) == {("/x/{}", "get"), ("/x/{}", "delete")}


def test_every_route_is_documented_and_every_documented_path_is_routed(
    local_gateway: GatewayThread,
) -> None:
    assert local_gateway.gateway.services is not None
    routed = routed_operations(routes(local_gateway.gateway.services))
    documented = documented_operations(DOC)
    assert routed - documented == set(), "routes missing from the OpenAPI document"
    assert documented - routed == set(), "documented operations that no route serves"


def test_served_document_is_the_built_one(local_client: Client) -> None:
    response = local_client.request("GET", "/openapi.json")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == build_document()


# --- real answers validate --------------------------------------------------------------------

CHART_CODE = """
import sys
import matplotlib.pyplot as plt
import numpy as np
print('out'); print('err', file=sys.stderr)
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [4, 5, 6], label='a')
ax.bar(['x', 'y'], [1, 2])
ax.set_title('T')
fig.savefig('chart.png')
plt.show()
fig2, axes = plt.subplots(1, 2)
axes[0].scatter([1, 2], [3, 4]); axes[1].pie([1, 2])
open('data.bin', 'wb').write(bytes(range(256)))
open('note.txt', 'w').write('hello')
import os; os.mkdir('folder')
result = {'arr': np.arange(3), 'n': np.float64(1.5)}
display(3)
"""


def test_run_records_of_real_runs_validate(client: Client) -> None:
    record = client.run(
        code=CHART_CODE,
        return_files=["note.txt", "data.bin", "missing.txt", "folder", "*.png", "nomatch*", "/etc"],
    )
    assert record["status"] == "succeeded", record
    assert {c["source"] for c in record["charts"]} == {"display", "savefig"}
    assert any("spec" in c for c in record["charts"])
    assert {f.get("error") for f in record["files"]} >= {None, "not found", "is a folder"}
    assert_valid("RunRecord", record)
    records = [
        record,
        client.run(code="print('x')\n1/0"),
        client.run(code="import sys; sys.exit(3)"),
        client.run(code="echo hi; echo err >&2; exit 4", language="bash"),
        client.run(code="import time\nprint('a', flush=True)\ntime.sleep(30)", timeout=1),
        client.run(code="print('x' * 3000)", timeout=9999),
    ]
    for each in records:
        assert_valid("RunRecord", each)
    assert records[4]["status"] == "timed_out" and records[5]["notes"]

    notebook = client.request("GET", f"/v1/runs/{record['id']}/notebook")
    assert notebook.status == 200
    assert notebook.headers["Content-Type"].startswith("application/x-ipynb+json")
    assert_valid("Notebook", notebook.json())


def test_background_poll_and_cancel_answers_validate(client: Client) -> None:
    response = client.request(
        "POST", "/v1/runs", {"code": "import time\ntime.sleep(30)", "background": True}
    )
    assert response.status == 202
    accepted = response.json()
    assert_valid("RunAccepted", accepted)
    assert response.headers["Location"] == f"/v1/runs/{accepted['id']}"
    polled = client.request("GET", f"/v1/runs/{accepted['id']}").json()
    assert polled["status"] in ("queued", "running")
    assert_valid("RunRecord", polled)
    cancelled = client.request("DELETE", f"/v1/runs/{accepted['id']}")
    assert cancelled.status == 200
    assert cancelled.json()["status"] == "cancelled"
    assert_valid("RunRecord", cancelled.json())


def test_health_and_metrics_answers_validate(client: Client) -> None:
    health = Client(client.port).request("GET", "/v1/health")
    assert health.status == 200
    assert_valid("Health", health.json())
    metrics = client.request("GET", "/metrics")
    assert metrics.status == 200 and metrics.headers["Content-Type"].startswith("text/plain")


ERROR_CASES: list[tuple[str, str, str | None, Any, dict[str, str], int]] = [
    # method, url, documented path, body (bytes: raw), headers, expected status
    ("POST", "/v1/runs", "/v1/runs", b"{not json", {}, 400),
    ("POST", "/v1/runs", "/v1/runs", b"", {}, 400),
    ("POST", "/v1/runs", "/v1/runs", {"code": "1", "files": [{"path": "../x"}]}, {}, 400),
    ("POST", "/v1/runs", "/v1/runs", {"code": "1", "entrypoint": "a.py"}, {}, 400),
    ("POST", "/v1/runs", "/v1/runs", {"code": "x" * (1024 * 1024 + 1)}, {}, 413),
    ("POST", "/v1/runs", "/v1/runs", b"code=1", {"Content-Type": "text/plain"}, 415),
    ("GET", "/v1/runs/run_00", "/v1/runs/{id}", None, {}, 404),
    ("DELETE", "/v1/runs/run_00", "/v1/runs/{id}", None, {}, 404),
    ("GET", "/v1/runs/run_00/notebook", "/v1/runs/{id}/notebook", None, {}, 404),
    ("POST", "/v1/notebooks/run", "/v1/notebooks/run", {"nbformat": 4, "cells": 3}, {}, 400),
    # found by the fuzz run: a v4 notebook without nbformat_minor
    (
        "POST",
        "/v1/notebooks/run",
        "/v1/notebooks/run",
        {"notebook": {"nbformat": 4, "metadata": {}, "cells": []}},
        {},
        400,
    ),
    ("POST", "/v1/tools/code_run", "/v1/tools/code_run", {"arguments": {}}, {}, 400),
    ("POST", "/v1/tools/run_python", "/v1/tools/run_python", {"params": {}}, {}, 400),
    ("POST", "/v1/tools/code_exec", "/v1/tools/code_exec", {"nope": 1}, {}, 400),
    ("GET", "/v1/nothing-here", None, None, {}, 404),
    ("PUT", "/v1/runs", None, {"code": "1"}, {}, 405),
]


@pytest.mark.parametrize(
    ("method", "url", "path", "body", "headers", "status"),
    ERROR_CASES,
    ids=[f"{c[0]} {c[1]} {c[5]}" for c in ERROR_CASES],
)
def test_error_answers_validate(
    local_client: Client,
    method: str,
    url: str,
    path: str | None,
    body: Any,
    headers: dict[str, str],
    status: int,
) -> None:
    raw = body if isinstance(body, bytes) else None
    response = local_client.request(
        method, url, None if raw is not None else body, raw=raw, headers=headers
    )
    assert response.status == status, response.body[:500]
    assert_error_answer(status, response.json(), path, method.lower() if path else None)


@pytest.mark.parametrize(("body", "code", "field"), RUN_FIELD_ERRORS)
def test_invalid_run_answers_validate(
    local_client: Client, body: dict[str, Any], code: str, field: str
) -> None:
    response = local_client.request("POST", "/v1/runs", body)
    assert response.status == status_of(code), response.body[:500]
    assert_error_answer(response.status, response.json(), "/v1/runs", "post")


def test_tool_and_notebook_answers_validate(client: Client) -> None:
    code_run = client.request(
        "POST",
        "/v1/tools/code_run",
        {
            "arguments": {
                "code": "print(1)",
                "files": [{"path": "a.txt", "content": "x"}],
                "return_files": ["a.txt", "nope.txt"],
            }
        },
    )
    assert code_run.status == 200, code_run.body
    assert_valid("CodeRunAnswer", code_run.json())
    run_python = client.request(
        "POST",
        "/v1/tools/run_python",
        {"input": {"vars": {"x": 1}}, "params": {"source": "print(2)\nresult = x + 1"}},
    )
    assert run_python.status == 200 and run_python.json()["result"] == 2
    assert_valid("RunPythonAnswer", run_python.json())
    code_exec = client.request("POST", "/v1/tools/code_exec", {"code": "import sys; sys.exit(2)"})
    assert code_exec.status == 200 and code_exec.json()["success"] is False
    assert_valid("CodeExecAnswer", code_exec.json())
    timed_out = client.request(
        "POST", "/v1/tools/code_exec", {"code": "while 1: pass", "timeout": 1}
    )
    assert timed_out.json().get("error") == "timeout"
    assert_valid("CodeExecTimeout", timed_out.json())
    background = client.request(
        "POST", "/v1/tools/code_exec", {"code": "print(1)", "background": True, "timeout": 5}
    )
    assert background.status == 202
    assert_valid("CodeExecStarted", background.json())

    notebook = notebook_json(
        code_cell_json("a", "x = 2"),
        {"id": "b", "cell_type": "markdown", "metadata": {}, "source": "# hi"},
        code_cell_json("c", "print(x)\nx"),
    )
    for body in (notebook, {"notebook": notebook, "timeout": 20, "allow_errors": True}):
        answer = client.request("POST", "/v1/notebooks/run", body)
        assert answer.status == 200, answer.body[:1000]
        assert_valid("NotebookRunAnswer", answer.json())
        assert answer.json()["run"]["status"] == "succeeded"


STREAM_SCHEMAS = {
    "accepted": "StreamAcceptedMessage",
    "output": "StreamOutputMessage",
    "output_dropped": "StreamOutputDroppedMessage",
    "done": "StreamDoneMessage",
    "error": "StreamErrorMessage",
}


def test_stream_messages_validate(client: Client) -> None:
    run_message = {
        "type": "run",
        "ref": "r1",
        "code": "from IPython.display import display, clear_output\nimport time\n"
        "print('a', flush=True)\nh = display('x', display_id=True)\nh.update('y')\n"
        "clear_output()\nprint('b')",
    }
    assert_valid("StreamRunMessage", run_message)
    assert_valid("StreamCancelMessage", {"type": "cancel", "id": "run_00"})

    async def converse() -> list[dict[str, Any]]:
        url = f"ws://127.0.0.1:{client.port}/v1/stream"
        connection = await tornado.websocket.websocket_connect(url)
        try:
            connection.write_message(json.dumps({"type": "nonsense"}))
            connection.write_message(json.dumps({"type": "cancel", "id": "run_00"}))
            connection.write_message(json.dumps(run_message))
            received: list[dict[str, Any]] = []
            while not received or received[-1].get("type") != "done":
                text = await asyncio.wait_for(connection.read_message(), 60)
                assert isinstance(text, str)
                received.append(json.loads(text))
            return received
        finally:
            connection.close()

    messages = asyncio.run(converse())
    kinds = [m["type"] for m in messages]
    assert kinds[:2] == ["error", "error"] and "accepted" in kinds and "output" in kinds
    for message in messages:
        assert_valid(STREAM_SCHEMAS[message["type"]], message)
    assert messages[-1]["run"]["status"] == "succeeded"


def small_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("pkg/main.py", "print('from the archive')\n")
    return buffer.getvalue()


def test_auth_upload_and_archive_answers_validate(fuzz_gateway: GatewayThread) -> None:
    anonymous = fuzz_gateway.client()
    for method, url, path in [
        ("POST", "/v1/runs", "/v1/runs"),
        ("GET", "/v1/runs/run_00", "/v1/runs/{id}"),
        ("GET", "/metrics", "/metrics"),
        ("POST", "/v1/uploads", "/v1/uploads"),
    ]:
        response = anonymous.request(method, url, {"code": "1"} if method == "POST" else None)
        assert response.status == 401, (url, response.body)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert_error_answer(401, response.json(), path, method.lower())

    client = fuzz_gateway.client(TOKEN)
    metrics = client.request("GET", "/metrics")  # every tenant's activity: not a user's
    assert metrics.status == 403, metrics.body
    assert_error_answer(403, metrics.json(), "/metrics", "get")
    uploaded = client.request(
        "POST", "/v1/uploads", raw=small_zip(), headers={"Content-Type": "application/zip"}
    )
    assert uploaded.status == 201, uploaded.body
    assert_valid("Upload", uploaded.json())
    record = client.run(archive=uploaded.json()["id"], entrypoint="pkg/main.py")
    assert record["stdout"] == "from the archive\n"
    assert_valid("RunRecord", record)
    bad = client.request(
        "POST", "/v1/uploads", raw=b"not an archive", headers={"Content-Type": "application/zip"}
    )
    assert_error_answer(bad.status, bad.json(), "/v1/uploads", "post")
    refused = client.request("POST", "/v1/runs", {"code": "1", "working_dir": "w"})
    assert_error_answer(403, refused.json(), "/v1/runs", "post")
