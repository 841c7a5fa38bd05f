"""The contract's parts agree with each other (issue 9): an explicit `null` means "omitted"
in every body, as docs/API.md says; every error code the code can answer is documented, in
docs/API.md and in the OpenAPI document alike."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway import errors
from gateway.openapi import ERROR_CODES
from tests.api import assert_error, code_cell_json, notebook_json
from tests.support import REPO, Client

API_MD = (REPO / "docs" / "API.md").read_text()


@pytest.mark.parametrize(
    "nulls",
    [
        {"background": None},
        {"timeout": None, "files": None, "vars": None, "env": None},
        {"return_files": None, "network": None, "working_dir": None, "archive": None},
        {"language": None, "entrypoint": None},
        {"files": [{"path": "a.txt", "content": "x", "encoding": None}]},
    ],
)
def test_null_is_omitted_in_a_run(local_client: Client, nulls: dict[str, Any]) -> None:
    response = local_client.request("POST", "/v1/runs", {"code": "print(1)", **nulls})
    assert response.status == 200, response.body[:500]
    assert response.json()["stdout"] == "1\n"


def test_null_is_omitted_in_a_notebook_replay(local_client: Client) -> None:
    notebook = notebook_json(code_cell_json("c1", "print(2)"))
    nulls = dict.fromkeys(("timeout", "cell_timeout", "files", "vars", "env", "network"))
    response = local_client.request("POST", "/v1/notebooks/run", {"notebook": notebook, **nulls})
    assert response.status == 200, response.body[:500]
    assert response.json()["run"]["stdout"] == "2\n"


def _codes_of_the_code() -> set[str]:
    """Every error code the gateway can answer: its exception classes' own (but those the
    server never answers: the client's, a never-sent ClientGone), and those passed as
    `code=` where one is raised."""
    codes = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.GatewayError) and cls.answered
    }
    assert "unreachable" not in codes and "not_found" in codes
    client_side = (REPO / "gateway" / "client", REPO / "gateway" / "commands")
    for path in (REPO / "gateway").rglob("*.py"):
        if any(path.is_relative_to(side) for side in client_side):
            continue  # the client's own codes for no answer at all: never the gateway's
        if path == REPO / "gateway" / "errors.py":
            continue  # its classes' codes: above, those the server answers
        code_lines = (line for line in path.read_text().splitlines() if not line.startswith("#"))
        codes |= set(re.findall(r'\bcode="([a-z_]+)"', "\n".join(code_lines)))
    # and the codes Tornado's own HTTP errors are answered with (gateway.handlers.base)
    base = (REPO / "gateway" / "handlers" / "base.py").read_text()
    codes |= set(re.findall(r'^\s+\d{3}: "([a-z_]+)",$', base, re.M))
    return codes


def test_every_error_code_is_documented() -> None:
    documented = {code for codes in ERROR_CODES.values() for code in codes}
    answered = _codes_of_the_code()
    assert answered <= documented, answered - documented
    missing_in_api_md = {code for code in answered if f"`{code}`" not in API_MD}
    assert not missing_in_api_md, missing_in_api_md


def test_sandbox_unavailable_is_a_503_in_both_places() -> None:
    assert errors.SandboxError.status == 503
    assert "sandbox_unavailable" in ERROR_CODES[503]
    assert re.search(r"503 `capacity`[^.]*`sandbox_unavailable`", API_MD.replace("\n  ", " "))


# --- what an independent review of the parsing found (old behaviour kept or fixed) ---------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/runs", {"code": "1", "tiemout": None}, "tiemout"),
        ("/v1/tools/code_exec", {"code": "1", "bogus": None}, "bogus"),
        ("/v1/tools/code_run", {"arguments": {"code": "1", "bogus": None}}, "arguments.bogus"),
    ],
)
def test_a_null_under_an_unknown_name_is_still_unknown(
    local_client: Client, path: str, body: dict[str, Any], field: str
) -> None:
    assert_error(local_client.request("POST", path, body), 400, "invalid_request", field=field)


def test_a_websocket_run_message_posted_to_runs_is_accepted(local_client: Client) -> None:
    body = {"type": "run", "ref": "r1", "code": "print(3)"}
    response = local_client.request("POST", "/v1/runs", body)
    assert response.status == 200, response.body[:500]
    assert response.json()["stdout"] == "3\n"


def test_code_run_ignores_other_keys_of_its_envelope(local_client: Client) -> None:
    body = {"name": "code_run", "arguments": {"code": "print(4)"}}
    response = local_client.request("POST", "/v1/tools/code_run", body)
    assert response.status == 200, response.body[:500]
    assert response.json()["result"]["output"] == "4\n"


def test_a_timeout_of_400_digits_is_clamped_or_refused_never_a_500(local_client: Client) -> None:
    huge = 10**400
    answer = local_client.request(
        "POST", "/v1/tools/code_exec", {"code": "print(5)", "timeout": huge}
    )
    assert answer.status == 200 and answer.json()["output"] == "5\n", answer.body[:500]
    for path, body, field in [
        ("/v1/runs", {"code": "1", "timeout": huge}, "timeout"),
        (
            "/v1/tools/run_python",
            {"params": {"source": "1", "timeout_seconds": huge}},
            "params.timeout_seconds",
        ),
        (
            "/v1/tools/code_run",
            {"arguments": {"code": "1", "timeout_seconds": huge}},
            "arguments.timeout_seconds",
        ),
    ]:
        assert_error(local_client.request("POST", path, body), 400, "invalid_request", field=field)


def test_a_notebook_sent_as_text_is_held_to_the_body_rules(local_client: Client) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for text, mention in [(deep, "nested"), ('{"nbformat": NaN}', "JSON")]:
        response = local_client.request("POST", "/v1/notebooks/run", {"notebook": text})
        assert_error(response, 400, "invalid_request", mention, field="notebook")
    response = local_client.request("POST", "/v1/notebooks/run", {"notebook": 5})
    assert_error(response, 400, "invalid_request", field="notebook")


@pytest.mark.parametrize(
    ("files", "field"),
    [
        ({"[key]": 5}, 'params.files["[key]"]'),  # a key named like pydantic's marker
        ({'a"b.py': "#" * (64 * 1024 + 1)}, 'params.files["a\\"b.py"]'),
        ({"ok.py": "", "../x.py": ""}, 'params.files["../x.py"]'),
        ({"é/../../x": ""}, 'params.files["é/../../x"]'),
    ],
)
def test_run_python_names_a_bad_file_by_its_key(
    local_client: Client, files: dict[str, Any], field: str
) -> None:
    """run_python's files are an object of path -> content: an error names the key as
    JSON inside brackets, whether the key or its content is wrong."""
    body = {"params": {"files": files, "entrypoint": "ok.py"}}
    response = local_client.request("POST", "/v1/tools/run_python", body)
    assert response.status == 400
    assert response.json()["error"]["field"] == field


def test_an_answer_leaves_out_optional_nulls_and_keeps_required_ones() -> None:
    """What the document says of answers holds for every model the handlers send: a
    field the schema does not require is absent when null, a required one is sent null."""
    from gateway.models.base import sent
    from gateway.models.tools import CodeRunAnswer, CodeRunFileResult, CodeRunResult

    result = CodeRunResult(
        language="python",
        exit_code=None,
        output="",
        truncated=False,
        timed_out=True,
        files=[CodeRunFileResult(path="a", size=None, error="not found")],
    )
    assert sent(CodeRunAnswer(id="r", result=result)) == {
        "id": "r",
        "tool": "code_run",
        "result": {
            "language": "python",
            "exit_code": None,
            "output": "",
            "truncated": False,
            "timed_out": True,
            "files": [{"path": "a", "size": None, "error": "not found"}],
        },
    }
