"""POST /v1/notebooks/run: the golden notebooks of notebooks/ replayed and compared, cell by
cell, with what nbclient (the reference executor) makes of them in this session
(notebook_compare.py); and the endpoint's behaviour: state between cells, allow_errors,
timeouts, files, caps, 400s. What reaches a sandbox (state, timeouts, files, a cancel) runs
on every backend; what is the gateway's alone (the comparison, tags, caps, 400s) on one
(conftest.OneBackend).

The outputs stored in notebooks/ are nbclient's too (`python -m tests.regenerate_notebooks`);
a test checks that they still are.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from PIL import Image

from gateway.models.languages import notebook_metadata
from tests.api import assert_error
from tests.conftest import start_gateway
from tests.notebook_compare import (
    assert_same_execution,
    assert_same_image,
    decode_image,
    execute_reference,
)
from tests.support import REPO, Client, GatewayThread, serving, wait_for, wrote

NOTEBOOKS = REPO / "notebooks"

# How each golden notebook is replayed, and the status its replay ends with.
GOLDEN: dict[str, tuple[dict[str, Any], str]] = {
    "chart.ipynb": ({}, "succeeded"),
    "pandas_table.ipynb": ({}, "succeeded"),
    "error.ipynb": ({"allow_errors": False}, "failed"),
}

# Golden notebooks whose stored outputs were written (or checked) by hand instead, with the
# language their replay runs in. Deno's: nbclient cannot run it as a reference, because
# Deno's kernel publishes a cell's output after the cell's `idle` status (nbclient stops
# reading there), so its outputs would be a race. Bash's: the only reference executor for
# it would run the gateway's own bash kernel (kernels/bash), the code under test; what bash
# prints is known without it.
HAND_CHECKED: dict[str, tuple[dict[str, Any], str, str]] = {
    "deno.ipynb": ({"allow_errors": False}, "failed", "typescript"),
    "bash.ipynb": ({"allow_errors": True}, "failed", "bash"),
}

# --- helpers -------------------------------------------------------------------------------


def notebook(
    *sources: str, language: str = "python", tags: dict[int, list[str]] | None = None
) -> dict[str, Any]:
    """A notebook of code cells, as JSON; `tags` maps a cell's index to its tags."""
    nb = new_notebook(metadata=notebook_metadata(language))
    nb.cells = [new_code_cell(source) for source in sources]
    for index, cell_tags in (tags or {}).items():
        nb.cells[index].metadata["tags"] = cell_tags
    notebook: dict[str, Any] = json.loads(nbformat.writes(nb))
    return notebook


def replay(client: Client, nb: dict[str, Any], **options: Any) -> dict[str, Any]:
    response = client.request("POST", "/v1/notebooks/run", {"notebook": nb, **options})
    assert response.status == 200, response.body[:2000]
    answer: dict[str, Any] = response.json()
    assert set(answer) == {"notebook", "run"}
    nbformat.validate(nbformat.from_dict(answer["notebook"]))
    return answer


def code_cells(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in answer["notebook"]["cells"] if c["cell_type"] == "code"]


def stdout_of(cell: dict[str, Any]) -> str:
    return "".join(
        o["text"] for o in cell["outputs"] if o["output_type"] == "stream" and o["name"] == "stdout"
    )


# --- golden notebooks ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def references() -> dict[str, tuple[dict[str, Any], dict[str, bytes]]]:
    """Each golden notebook as nbclient, the reference executor, runs it (once a session)."""
    return {
        name: execute_reference(read(name), allow_errors=bool(options.get("allow_errors")))
        for name, (options, _) in GOLDEN.items()
    }


def read(name: str) -> dict[str, Any]:
    stored: dict[str, Any] = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    nbformat.validate(nbformat.from_dict(stored))
    return stored


def test_every_stored_notebook_is_a_golden_test() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted({**GOLDEN, **HAND_CHECKED})


@pytest.mark.one_backend
@pytest.mark.parametrize("name", sorted(HAND_CHECKED))
def test_hand_checked_notebook_replays_as_stored(client: Client, name: str) -> None:
    options, status, language = HAND_CHECKED[name]
    stored = read(name)
    answer = replay(client, stored, **options)
    got = answer["notebook"]
    assert_same_execution(got, stored)
    assert got["metadata"]["kernelspec"] == stored["metadata"]["kernelspec"]
    assert answer["run"]["status"] == status
    assert answer["run"]["language"] == language


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_stored_outputs_are_the_reference_executors(
    name: str, references: dict[str, tuple[dict[str, Any], dict[str, bytes]]]
) -> None:
    """The outputs kept in notebooks/ are nbclient's (tests/regenerate_notebooks.py), still."""
    assert_same_execution(read(name), references[name][0])


@pytest.mark.one_backend
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_notebook_replays_like_the_reference_executor(
    client: Client, name: str, references: dict[str, tuple[dict[str, Any], dict[str, bytes]]]
) -> None:
    options, status = GOLDEN[name]
    want, files = references[name]
    answer = replay(client, read(name), **options)
    got = answer["notebook"]
    # cell by cell what Jupyter shows: a savefig call adds no output (issue 12)
    assert_same_execution(got, want)
    assert got["metadata"]["kernelspec"] == want["metadata"]["kernelspec"]
    assert answer["run"]["status"] == status
    assert answer["run"]["outputs"] == [o for c in code_cells(answer) for o in c["outputs"]]
    # each chart saved with savefig is in the record's charts: the file the reference wrote
    saved = [c for c in answer["run"]["charts"] if c["source"] == "savefig"]
    assert len(saved) == len([f for f in files if f.endswith(".png")])
    for chart in saved:
        assert_same_image(
            decode_image(chart["mime"], chart["data"]),
            Image.open(io.BytesIO(files[chart["path"]])),
            f"savefig {chart['path']}",
        )


# --- the endpoint --------------------------------------------------------------------------


def test_state_flows_between_cells_but_not_between_requests(client: Client) -> None:
    first = replay(
        client,
        notebook("secret = 41\nopen('left.txt', 'w').write('x')", "print(secret + 1)"),
    )
    assert first["run"]["status"] == "succeeded" and first["run"]["stdout"] == "42\n"
    assert [c["execution_count"] for c in code_cells(first)] == [1, 2]
    second = replay(
        client, notebook("import os\nprint('secret' in globals(), os.path.exists('left.txt'))")
    )
    assert second["run"]["stdout"] == "False False\n"


@pytest.mark.one_backend
def test_a_failing_cell_stops_the_replay_by_default(client: Client) -> None:
    nb = notebook("print('a')", "raise ValueError('boom')", "print('b')")
    nb["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "stale\n"}]
    nb["cells"][2]["execution_count"] = 7
    answer = replay(client, nb)
    run, cells = answer["run"], code_cells(answer)
    assert (run["status"], run["exit_code"], run["error"]["ename"]) == ("failed", 1, "ValueError")
    assert [c["execution_count"] for c in cells] == [1, 2, None]
    assert cells[1]["outputs"][-1]["output_type"] == "error"
    assert cells[2]["outputs"] == []  # stale outputs of the input are gone
    assert run["stdout"] == "a\n"
    assert any("In [2] failed" in note for note in run["notes"])


@pytest.mark.one_backend
def test_allow_errors_runs_every_cell_and_reports_the_first_error(client: Client) -> None:
    nb = notebook("raise ValueError('first')", "print('b')", "{}['missing']", "print('c')")
    answer = replay(client, nb, allow_errors=True)
    run, cells = answer["run"], code_cells(answer)
    assert [c["execution_count"] for c in cells] == [1, 2, 3, 4]
    assert run["stdout"] == "b\nc\n"
    assert run["status"] == "failed" and run["exit_code"] == 1
    assert run["error"]["ename"] == "ValueError"
    assert [o["ename"] for o in run["outputs"] if o["output_type"] == "error"] == [
        "ValueError",
        "KeyError",
    ]


@pytest.mark.one_backend
def test_cells_tagged_raises_exception_or_skip_execution(client: Client) -> None:
    nb = notebook(
        "1/0",
        "print('skipped')",
        "",
        "print('ran')",
        tags={0: ["raises-exception"], 1: ["skip-execution"]},
    )
    answer = replay(client, nb)
    assert answer["run"]["status"] == "succeeded" and answer["run"]["error"] is None
    assert [c["execution_count"] for c in code_cells(answer)] == [1, None, None, 2]
    assert answer["run"]["stdout"] == "ran\n"


def test_bash_notebook_keeps_state_and_stops_at_a_non_zero_status(client: Client) -> None:
    nb = notebook("n=5\necho set", "echo $((n * 2)); (exit 4)", "echo never", language="bash")
    answer = replay(client, nb)
    run, cells = answer["run"], code_cells(answer)
    assert (run["language"], run["status"], run["exit_code"]) == ("bash", "failed", 4)
    assert stdout_of(cells[1]) == "10\n"
    assert cells[2]["execution_count"] is None


def test_cell_timeout_stops_the_cell_and_the_replay(client: Client) -> None:
    nb = notebook("print('start')", "import time\ntime.sleep(60)", "print('never')")
    answer = replay(client, nb, cell_timeout=1, timeout=60)
    run, cells = answer["run"], code_cells(answer)
    assert (run["status"], run["timed_out"], run["kill_reason"]) == ("timed_out", True, "timeout")
    assert run["exit_code"] is None
    assert stdout_of(cells[0]) == "start\n"
    assert [c["execution_count"] for c in cells] == [1, 2, None]
    assert any("cell_timeout (1 s)" in note for note in run["notes"])
    assert run["usage"]["wall_ms"] < 30_000


def test_total_timeout_spans_the_cells(client: Client) -> None:
    sources = [f"import time\ntime.sleep(0.6)\nprint({i})" for i in range(8)]
    answer = replay(client, notebook(*sources), timeout=2, cell_timeout=10)
    run, cells = answer["run"], code_cells(answer)
    assert run["status"] == "timed_out" and run["timed_out"] is True
    finished = [c for c in cells if stdout_of(c)]
    assert 1 <= len(finished) <= 4
    assert cells[-1]["execution_count"] is None and cells[-1]["outputs"] == []
    assert run["stdout"] == "".join(f"{i}\n" for i in range(len(finished)))
    assert any("its timeout (2 s)" in note for note in run["notes"])


def test_delete_cancels_a_running_notebook(gateway: GatewayThread, client: Client) -> None:
    """Cancel while the second cell sleeps (it has written `started`, which the host sees):
    the first cell's output stays, the third never runs."""
    nb = notebook(
        "print('first')",
        "open('started', 'w').close()\nimport time\ntime.sleep(120)",
        "print('never')",
    )
    answers: list[dict[str, Any]] = []
    poster = threading.Thread(target=lambda: answers.append(replay(client, nb)))
    poster.start()
    try:
        assert wait_for(lambda: wrote(gateway, "started"), timeout=90)
        [run_id] = running_ids(gateway)
        assert client.request("DELETE", f"/v1/runs/{run_id}").status == 200
    finally:
        poster.join(60)
    run, cells = answers[0]["run"], code_cells(answers[0])
    assert (run["status"], run["kill_reason"], run["exit_code"]) == ("cancelled", "cancelled", None)
    assert cells[0]["execution_count"] == 1 and stdout_of(cells[0]) == "first\n"
    assert cells[2]["execution_count"] is None


def running_ids(gateway: GatewayThread) -> list[str]:
    assert gateway.gateway.services is not None
    return list(gateway.gateway.services.runs.active)


def test_files_are_staged_and_returned(client: Client) -> None:
    nb = notebook(
        "text = open('data/in.txt').read()",
        "open('out.txt', 'w').write(text.upper())",
    )
    answer = replay(
        client,
        nb,
        files=[{"path": "data/in.txt", "content": "hello"}],
        return_files=["out.txt", "missing.txt"],
    )
    files = {f["path"]: f for f in answer["run"]["files"]}
    assert files["out.txt"]["content"] == "HELLO"
    assert "error" in files["missing.txt"]


@pytest.mark.one_backend
def test_the_body_may_be_the_notebook_itself(client: Client) -> None:
    nb = notebook("x = 2", "x * 21")
    response = client.request(
        "POST", "/v1/notebooks/run", nb, headers={"Content-Type": "application/x-ipynb+json"}
    )
    assert response.status == 200, response.body[:500]
    cells = code_cells(response.json())
    assert cells[1]["outputs"][0]["data"]["text/plain"] == "42"
    assert cells[1]["outputs"][0]["execution_count"] == 2


@pytest.mark.one_backend
def test_run_record_and_its_notebook_can_be_fetched_again(client: Client) -> None:
    nb = notebook("print('one')", "print('two')")
    nb["cells"].insert(1, json.loads(json.dumps(new_markdown_cell("# between"))))
    answer = replay(client, nb)
    run_id = answer["run"]["id"]
    record = client.request("GET", f"/v1/runs/{run_id}").json()
    assert record["status"] == "succeeded" and record["stdout"] == "one\ntwo\n"
    response = client.request("GET", f"/v1/runs/{run_id}/notebook")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("application/x-ipynb+json")
    again = nbformat.reads(response.body.decode(), as_version=4)
    nbformat.validate(again)  # built by the gateway's own code, not validated on export
    assert again == nbformat.from_dict(answer["notebook"])
    assert again["metadata"]["gateway"]["run_id"] == run_id
    assert [c["cell_type"] for c in again["cells"]] == ["code", "markdown", "code"]


@pytest.mark.one_backend
def test_old_and_loose_notebooks_are_accepted(client: Client) -> None:
    v3 = {
        "nbformat": 3,
        "nbformat_minor": 0,
        "metadata": {},
        "worksheets": [
            {
                "cells": [
                    {"cell_type": "code", "input": "print(3)", "outputs": [], "language": "python"}
                ]
            }
        ],
    }
    answer = replay(client, v3)
    assert answer["notebook"]["nbformat"] == 4 and answer["run"]["stdout"] == "3\n"
    assert answer["notebook"]["metadata"]["kernelspec"]["name"] == "python3"
    no_ids = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {"cell_type": "code", "source": ["a = 1\n", "print(a)"], "metadata": {},
             "outputs": [], "execution_count": None},
            {"id": "x", "cell_type": "code", "source": "print(2)", "metadata": {},
             "outputs": [], "execution_count": None},
            {"id": "x", "cell_type": "code", "source": "print(3)", "metadata": {},
             "outputs": [], "execution_count": None},
        ],
    }  # fmt: skip
    answer = replay(client, no_ids)
    assert answer["run"]["stdout"] == "1\n2\n3\n"
    assert len({c["id"] for c in answer["notebook"]["cells"]}) == 3
    assert any("cell id" in note for note in answer["run"]["notes"])


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        ({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"id": "a", "cell_type": "code", "source": "1", "metadata": {}}]},
         "invalid_request", "'outputs' is a required property"),
        ({"nbformat": 4, "nbformat_minor": 5, "cells": []},
         "invalid_request", "'metadata' is a required property"),
        ({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"id": "a b", "cell_type": "code", "source": "1", "metadata": {},
                     "outputs": [], "execution_count": None}]},
         "invalid_request", "does not match"),
        ({"notebook": {"nbformat": 5, "nbformat_minor": 0, "metadata": {}, "cells": []}},
         "invalid_request", "nbformat 4"),
        ({"notebook": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [1]}},
         "invalid_request", "cell objects"),
        ({"notebook": "{not json"}, "invalid_request", "not valid JSON"),
        ({"code": "print(1)"}, "invalid_request", "Send a notebook"),
        ({"notebook": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []},
          "language": "python"}, "invalid_request", "Unknown field"),
        ({"notebook": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []},
          "cell_timeout": "soon"}, "invalid_request", "`cell_timeout` must be a number"),
        ({"notebook": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []},
          "allow_errors": "yes"}, "invalid_request", "allow_errors"),
        ({"notebook": {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []},
          "files": [{"path": "../x", "content": ""}]}, "invalid_path", "inside"),
        ({"nbformat": 4, "nbformat_minor": 5, "cells": [],
          "metadata": {"kernelspec": {"name": "ir", "language": "Rust", "display_name": "R"}}},
         "unsupported_language", "'Rust' is not supported"),
        ({"nbformat": 4, "nbformat_minor": 5, "cells": [],
          "metadata": {"kernelspec": {"name": "julia-1.10", "display_name": "Julia"}}},
         "unsupported_language", "julia"),
    ],
)  # fmt: skip
@pytest.mark.one_backend
def test_bad_requests_are_400_with_the_reason(
    local_client: Client, body: dict[str, Any], code: str, reason: str
) -> None:
    assert_error(local_client.request("POST", "/v1/notebooks/run", body), 400, code, reason)


# --- caps of the whole notebook ------------------------------------------------------------


@pytest.fixture
def capped(backend_name: str) -> Iterator[GatewayThread]:
    yield from serving(
        start_gateway(backend_name, stream_cap_bytes=10_000, display_cap_bytes=25_000)
    )


@pytest.mark.one_backend
def test_caps_apply_to_the_whole_notebook(capped: GatewayThread) -> None:
    show = "from IPython.display import HTML, display\ndisplay(HTML('<p>' + 'x' * 10000))"
    nb = notebook(*[f"print('{i}' * 4000)" for i in range(4)], show, show, show, "print('end')")
    answer = replay(capped.client(), nb)
    run, cells = answer["run"], code_cells(answer)
    assert run["status"] == "succeeded"
    for i in range(4):  # each cell's text is complete: under the per-cell cap
        assert stdout_of(cells[i]) == f"{i}" * 4000 + "\n"
    assert run["stdout_truncated"] and "bytes truncated" in run["stdout"]
    assert run["stdout"].startswith("0000") and run["stdout"].endswith("end\n")
    assert len(run["stdout"].encode()) < 10_200
    shown = [len(c["outputs"]) for c in cells[4:7]]
    assert shown == [1, 1, 0]  # the third HTML is past the notebook's rich-output budget
    assert any(
        note.startswith("In [7]: 1 rich output") and "25000 bytes" in note for note in run["notes"]
    )
