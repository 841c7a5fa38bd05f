"""A run keeps its identity and its files for a later run (issue 33, item 1): a replay is
listed under its notebook's `name`; `keep_files` keeps the files a run was given with its
user's uploads (within their quota), and `files_from` stages them again, or says plainly
that they are gone (410 files_gone), never runs without them. The files are kept by the
gateway, not the sandbox, so one backend (local) covers it; a real gateway on SQLite."""

from __future__ import annotations

import base64
import io
import os
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, serving

TOKENS = {
    "alice-token-0123456789": ("alice", "user"),
    "bob-token-0123456789ab": ("bob", "user"),
}
KEPT_UPLOADS = 2  # each user keeps at most two uploads: the third pushes out the first

READS = "print(open('data/births.csv').read(), end='')"


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    yield from serving(
        start_gateway("local", users=TOKENS, allow_uploads=True, max_uploads_per_user=KEPT_UPLOADS)
    )


def client_of(server: GatewayThread, user: str) -> Client:
    return server.client(next(t for t, (name, _) in TOKENS.items() if name == user))


@pytest.fixture
def alice(server: GatewayThread) -> Client:
    return client_of(server, "alice")


def post(client: Client, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = client.request("POST", path, body)
    return answer.status, answer.json()


def a_file(path: str, text: str) -> dict[str, str]:
    return {"path": path, "content": text}


def notebook(*sources: str) -> dict[str, Any]:
    cells = [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": s, "outputs": []}
        for i, s in enumerate(sources)
    ]
    cells.insert(0, {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "# Births"})
    for cell in cells[1:]:
        cell["execution_count"] = None
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}


def test_a_replay_is_listed_under_its_notebooks_name(alice: Client) -> None:
    status, answer = post(
        alice,
        "/v1/notebooks/run",
        {"notebook": notebook("import sys", "print(1)"), "name": "03.07-Births.ipynb"},
    )
    assert status == 200, answer
    record = answer["run"]
    assert record["name"] == "03.07-Births.ipynb"
    listed = alice.request("GET", "/v1/runs?limit=5").json()["runs"]
    mine = next(r for r in listed if r["id"] == record["id"])
    assert mine["kind"] == "notebook" and mine["name"] == "03.07-Births.ipynb"
    # a code run has no name
    status, run = post(alice, "/v1/runs", {"code": "1"})
    assert status == 200 and run["name"] is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        " ",
        "a/b.ipynb",
        "..\\x.ipynb",
        "x" * 256,
        "bell\x07.ipynb",
        "evil\u202egnp.ipynb",  # a bidi override: shown as "evilbnpi.png"
        "\u200b",  # only a zero-width space
        "two\u2028lines.ipynb",
        "next\x85line.ipynb",
        42,
    ],
)
def test_a_name_that_is_not_a_file_name_is_refused(alice: Client, name: Any) -> None:
    status, answer = post(alice, "/v1/notebooks/run", {"notebook": notebook("1"), "name": name})
    assert status == 400, answer
    assert answer["error"]["field"] == "name"


def test_files_kept_by_one_run_are_staged_again_by_the_next(alice: Client) -> None:
    csv = "year,births\n1969,3600206\n"
    first = notebook(READS)
    status, answer = post(
        alice,
        "/v1/notebooks/run",
        {"notebook": first, "files": [a_file("data/births.csv", csv)], "keep_files": True},
    )
    assert status == 200, answer
    kept = answer["run"]
    assert kept["files_given"] == {"count": 1, "bytes": len(csv), "kept": True}
    assert kept["stdout"] == csv
    # a re-run with no files of its own: the same files, where the notebook expects them
    status, again = post(
        alice,
        "/v1/notebooks/run",
        {"notebook": first, "files_from": kept["id"], "keep_files": True},
    )
    assert status == 200, again
    assert again["run"]["stdout"] == csv and again["run"]["status"] == "succeeded"
    assert again["run"]["files_given"] == {"count": 1, "bytes": len(csv), "kept": True}
    # a run's own `files` replace those of the same path; the others stay
    status, run = post(
        alice,
        "/v1/runs",
        {
            "code": READS + "\nprint(open('extra.txt').read())",
            "files_from": kept["id"],
            "files": [a_file("extra.txt", "more")],
        },
    )
    assert status == 200 and run["stdout"] == csv + "more\n", run
    assert run["files_given"] == {"count": 2, "bytes": len(csv) + 4, "kept": False}
    # kept again with a file of its own: the next run gets both
    status, both = post(
        alice,
        "/v1/runs",
        {
            "code": "1",
            "files_from": kept["id"],
            "files": [a_file("extra.txt", "more")],
            "keep_files": True,
        },
    )
    assert status == 200 and both["files_given"]["kept"], both
    status, run = post(
        alice,
        "/v1/runs",
        {"code": READS + "\nprint(open('extra.txt').read())", "files_from": both["id"]},
    )
    assert status == 200 and run["stdout"] == csv + "more\n", run


def test_binary_files_come_back_byte_for_byte(alice: Client) -> None:
    blob = os.urandom(70_000)
    status, kept = post(
        alice,
        "/v1/runs",
        {
            "code": "1",
            "files": [
                {
                    "path": "a/b/blob.bin",
                    "content": base64.b64encode(blob).decode(),
                    "encoding": "base64",
                }
            ],
            "keep_files": True,
        },
    )
    assert status == 200 and kept["files_given"]["kept"], kept
    code = "import hashlib; print(hashlib.sha256(open('a/b/blob.bin','rb').read()).hexdigest())"
    status, run = post(alice, "/v1/runs", {"code": code, "files_from": kept["id"]})
    import hashlib

    assert status == 200 and run["stdout"].strip() == hashlib.sha256(blob).hexdigest(), run


def test_a_run_that_kept_no_files_says_so(alice: Client) -> None:
    status, plain = post(alice, "/v1/runs", {"code": "1", "files": [a_file("x.txt", "x")]})
    assert status == 200 and plain["files_given"] == {"count": 1, "bytes": 1, "kept": False}
    status, answer = post(alice, "/v1/runs", {"code": "1", "files_from": plain["id"]})
    assert status == 410 and answer["error"]["code"] == "files_gone", answer
    assert answer["error"]["field"] == "files_from"
    assert "add them again" in answer["error"]["message"]
    status, none = post(alice, "/v1/runs", {"code": "1"})
    assert none["files_given"] is None
    status, answer = post(alice, "/v1/runs", {"code": "1", "files_from": none["id"]})
    assert status == 410 and answer["error"]["code"] == "files_gone", answer


def test_kept_files_count_against_the_upload_quota_and_then_are_gone(
    server: GatewayThread,
) -> None:
    bob = client_of(server, "bob")
    runs = []
    for i in range(KEPT_UPLOADS + 1):
        status, run = post(
            bob,
            "/v1/runs",
            {"code": "1", "files": [a_file("f.txt", str(i))], "keep_files": True},
        )
        assert status == 200 and run["files_given"]["kept"], run
        runs.append(run["id"])
    # the oldest went to make room: said plainly, never a run without them
    status, answer = post(
        bob, "/v1/runs", {"code": "print(open('f.txt').read())", "files_from": runs[0]}
    )
    assert status == 410 and answer["error"]["code"] == "files_gone", answer
    assert "gone" in answer["error"]["message"]
    status, run = post(
        bob, "/v1/runs", {"code": "print(open('f.txt').read())", "files_from": runs[-1]}
    )
    assert status == 200 and run["stdout"] == f"{KEPT_UPLOADS}\n", run


def test_another_users_files_are_not_found(server: GatewayThread, alice: Client) -> None:
    status, kept = post(
        alice, "/v1/runs", {"code": "1", "files": [a_file("secret.txt", "s")], "keep_files": True}
    )
    assert status == 200 and kept["files_given"]["kept"]
    bob = client_of(server, "bob")
    for path, body in (
        ("/v1/runs", {"code": "print(open('secret.txt').read())", "files_from": kept["id"]}),
        ("/v1/notebooks/run", {"notebook": notebook("1"), "files_from": kept["id"]}),
    ):
        status, answer = post(bob, path, body)
        assert status == 404 and answer["error"]["code"] == "not_found", answer
        assert answer["error"]["field"] == "files_from"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"files_from": "run_0123456789abcdef0123"}, 404, "not_found"),
        ({"files_from": "../etc/passwd"}, 400, "invalid_request"),
        ({"files_from": 7}, 400, "invalid_request"),
        (
            {"files_from": "run_0123456789abcdef0123", "archive": "upl_" + "0" * 32},
            400,
            "conflicting_fields",
        ),
        ({"keep_files": "yes"}, 400, "invalid_request"),
    ],
)
def test_bad_files_from_gets_a_clear_error(
    alice: Client, body: dict[str, Any], status: int, code: str
) -> None:
    got, answer = post(alice, "/v1/runs", {"code": "1", **body})
    assert (got, answer["error"]["code"]) == (status, code), answer


def test_an_entrypoint_among_the_kept_files_runs(alice: Client) -> None:
    status, kept = post(
        alice,
        "/v1/runs",
        {
            "entrypoint": "main.py",
            "files": [a_file("main.py", "print('from main')")],
            "keep_files": True,
        },
    )
    assert status == 200 and kept["stdout"] == "from main\n", kept
    status, again = post(alice, "/v1/runs", {"entrypoint": "main.py", "files_from": kept["id"]})
    assert status == 200 and again["stdout"] == "from main\n", again


def test_an_archives_files_are_not_kept_again(alice: Client) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("from_archive.txt", "a")
    response = alice.request(
        "POST", "/v1/uploads", raw=buffer.getvalue(), headers={"Content-Type": "application/zip"}
    )
    assert response.status == 201, response.body[:300]
    upload = response.json()["id"]
    status, run = post(
        alice,
        "/v1/runs",
        {
            "code": "print(open('from_archive.txt').read() + open('own.txt').read())",
            "archive": upload,
            "files": [a_file("own.txt", "b")],
            "keep_files": True,
        },
    )
    assert status == 200 and run["stdout"] == "ab\n", run
    assert run["files_given"] == {"count": 1, "bytes": 1, "kept": True}
    code = "import os; print(sorted(os.listdir('.')))"
    status, again = post(alice, "/v1/runs", {"code": code, "files_from": run["id"]})
    assert status == 200 and again["stdout"] == "['own.txt']\n", again


def test_files_no_request_could_stage_again_are_not_kept() -> None:
    """A run given its own files and another run's may hold more than one request may
    stage: those are not kept (a note says why), so `files_from` never meets a set it
    cannot stage; nor is a path an archive may not hold."""
    server = start_gateway("local", max_files=3, max_files_bytes=1000)
    try:
        client = server.client()
        half = "x" * 500
        status, first = post(
            client,
            "/v1/runs",
            {"code": "1", "files": [a_file("a", half), a_file("b", half)], "keep_files": True},
        )
        assert status == 200 and first["files_given"]["kept"], first
        more = [a_file("c", half), a_file("d", half)]
        status, second = post(
            client,
            "/v1/runs",
            {"code": "1", "files_from": first["id"], "files": more, "keep_files": True},
        )
        assert status == 200, second
        assert second["files_given"] == {"count": 4, "bytes": 2000, "kept": False}
        assert any("not kept" in note for note in second["notes"]), second["notes"]
        status, drive = post(
            client,
            "/v1/runs",
            {"code": "1", "files": [a_file("C:/x.txt", "x")], "keep_files": True},
        )
        assert status == 200 and drive["files_given"]["kept"] is False, drive
        assert any("not kept" in note for note in drive["notes"]), drive["notes"]
    finally:
        server.stop()
