"""`python -m gateway run FILE`, run as a subprocess against a real gateway (local backend:
the command line only speaks HTTP, so one backend is enough). A notebook's cells are named
as Jupyter names them, `In [n]` (markdown cells are not counted), durations in ms under a
second, and a replay tells the gateway the notebook's file name."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.conftest import start_gateway
from tests.support import REPO, GatewayThread, free_port, serving

TOKEN = "cli-test-token-0123456789"


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local", users={TOKEN: ("cli", "user")}))


def gateway_run(
    cwd: Path, *args: str, url: str | None = None, token: str | None = TOKEN
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    if token is not None:
        env["GATEWAY_TOKEN"] = token
    command = [sys.executable, "-m", "gateway", "run", *args]
    if url is not None:
        command += ["--url", url]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def url_of(server: GatewayThread) -> str:
    return f"http://127.0.0.1:{server.port}"


# --- scripts -------------------------------------------------------------------------------


def test_script_prints_its_streams_and_saves_its_charts(
    server: GatewayThread, tmp_path: Path
) -> None:
    (tmp_path / "plot.py").write_text(
        "import sys\n"
        "import matplotlib.pyplot as plt\n"
        "print('to stdout')\n"
        "print('to stderr', file=sys.stderr)\n"
        "plt.plot([1, 3, 2])\n"
        "plt.savefig('line.svg')\n"
    )
    done = gateway_run(tmp_path, "plot.py", url=url_of(server))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "to stdout\n"
    assert done.stderr.startswith("to stderr\n")
    svg, png = tmp_path / "plot-chart-1.svg", tmp_path / "plot-chart-2.png"
    assert "<svg" in svg.read_text()
    assert png.read_bytes().startswith(b"\x89PNG")
    assert f"saved a chart to {svg.name}" in done.stderr
    assert f"saved a chart to {png.name}" in done.stderr
    # the last line says how it ended and what it used (issue 34)
    last = done.stderr.splitlines()[-1]
    assert re.fullmatch(
        rf"gateway run: succeeded in {DURATION}, CPU {DURATION}, peak memory \d+ MiB "
        rf"\(run run_\w+\)",
        last,
    ), last


@pytest.mark.parametrize(
    ("name", "code", "status", "in_stderr"),
    [
        ("exits.py", "import sys\nsys.exit(3)", 3, ""),
        ("raises.py", "print('before')\nraise KeyError('k')", 1, "KeyError"),
        ("fails.sh", "echo from bash\n(exit 7)", 7, ""),
        ("exits.js", "console.log('from js');\nDeno.exit(4);", 4, ""),
        ("throws.ts", "const n: number = 1;\nthrow new TypeError(`bad ${n}`);", 1, "bad 1"),
    ],
)
def test_the_exit_status_is_the_runs_exit_code(
    server: GatewayThread, tmp_path: Path, name: str, code: str, status: int, in_stderr: str
) -> None:
    (tmp_path / name).write_text(code)
    done = gateway_run(tmp_path, name, url=url_of(server))
    assert done.returncode == status, done.stderr
    assert in_stderr in done.stderr
    assert "\x1b[" not in done.stderr  # tracebacks lose their colours when not on a terminal


def test_a_timed_out_run_exits_1_and_says_so(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("print('started', flush=True)\nimport time\ntime.sleep(60)")
    done = gateway_run(tmp_path, "slow.py", "--timeout", "1", url=url_of(server))
    assert done.returncode == 1
    assert done.stdout == "started\n"
    assert "timed_out (timeout)" in done.stderr


def test_language_flag_runs_any_file_as_bash(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "job.txt").write_text("echo $((6 * 7))")
    done = gateway_run(tmp_path, "job.txt", "--language", "bash", url=url_of(server))
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr


# --- notebooks -----------------------------------------------------------------------------


# a duration: milliseconds under a second, then seconds to a tenth
DURATION = r"(\d{1,3} ms|[1-9]\d*\.\d s)"


def split_progress(stdout: str) -> tuple[list[str], list[str]]:
    """A replay's plain progress lines (`[k/n] In [n] · t`), then the report's lines."""
    lines = stdout.splitlines()
    count = next((i for i, line in enumerate(lines) if not line.startswith("[")), len(lines))
    return lines[:count], lines[count:]


def test_notebook_is_replayed_and_written_next_to_it(server: GatewayThread, tmp_path: Path) -> None:
    shutil.copy(REPO / "notebooks" / "error.ipynb", tmp_path / "error.ipynb")
    done = gateway_run(tmp_path, "error.ipynb", url=url_of(server))
    assert done.returncode == 1, done.stderr
    progress, lines = split_progress(done.stdout)
    assert [line.split(" · ")[0] for line in progress] == [  # the markdown cell not counted
        "[1/4] In [1]",
        "[2/4] In [2]",
        "[3/4] In [3]",
    ]
    for line in progress:
        assert re.fullmatch(rf"\[\d/4\] In \[\d\] · {DURATION}( · error)?", line), line
    assert progress[-1].endswith(" · error")  # the failing cell says so
    assert "error at In [3]:" in done.stderr  # its traceback, as soon as it came
    assert "ZeroDivisionError" in done.stderr
    assert re.fullmatch(
        rf"error\.ipynb: failed in {DURATION}, 3 of 4 code cells run, CPU {DURATION}, "
        rf"peak memory \d+ MiB \(run run_\w+\)",
        lines[0],
    )  # what it used, as its record says (issue 34)
    assert "first error at In [3]: ZeroDivisionError: division by zero" in lines
    executed = tmp_path / "error.executed.ipynb"
    assert lines[-1] == "executed notebook: error.executed.ipynb"
    nb = nbformat.read(executed, as_version=4)
    nbformat.validate(nb)
    assert [c.execution_count for c in nb.cells if c.cell_type == "code"] == [1, 2, 3, None]


def test_notebook_options_and_out(server: GatewayThread, tmp_path: Path) -> None:
    shutil.copy(REPO / "notebooks" / "error.ipynb", tmp_path / "error.ipynb")
    out = tmp_path / "results" / "done.ipynb"
    out.parent.mkdir()
    done = gateway_run(
        tmp_path, "error.ipynb", "--allow-errors", "--out", str(out), url=url_of(server)
    )
    assert done.returncode == 1, done.stderr
    assert "4 of 4 code cells run" in done.stdout
    cells = nbformat.read(out, as_version=4).cells
    assert cells[-1].outputs[0]["text"].startswith("not printed")
    assert not (tmp_path / "error.executed.ipynb").exists()


def test_a_notebooks_charts_are_saved_beside_it_as_a_scripts_are(
    server: GatewayThread, tmp_path: Path
) -> None:
    cells = [
        nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()"),
        nbformat.v4.new_code_cell("plt.bar(['a'], [1]); plt.savefig('bar.svg')"),
    ]
    (tmp_path / "charts.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(cells=cells)))
    out = tmp_path / "results" / "charts-done.ipynb"
    out.parent.mkdir()
    done = gateway_run(tmp_path, "charts.ipynb", "--out", str(out), url=url_of(server))
    assert done.returncode == 0, done.stderr
    png, svg = out.parent / "charts-chart-1.png", out.parent / "charts-chart-2.svg"
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "<svg" in svg.read_text()
    assert "saved a chart to results/charts-chart-1.png" in done.stdout


def test_a_succeeding_notebook_exits_0(server: GatewayThread, tmp_path: Path) -> None:
    shutil.copy(REPO / "notebooks" / "pandas_table.ipynb", tmp_path / "table.ipynb")
    done = gateway_run(tmp_path, "table.ipynb", url=url_of(server))
    assert done.returncode == 0, done.stderr
    progress, lines = split_progress(done.stdout)
    assert len(progress) == 3 and progress[-1].startswith("[3/3] In [3] · ")
    assert lines[0].startswith("table.ipynb: succeeded in ")
    assert "3 of 3 code cells run" in lines[0]


def test_durations_read_in_ms_under_a_second_and_in_seconds_from_one(
    server: GatewayThread, tmp_path: Path
) -> None:
    cells = [
        nbformat.v4.new_markdown_cell("# Timing"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(1.3)"),
    ]
    (tmp_path / "timing.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(cells=cells)))
    done = gateway_run(tmp_path, "timing.ipynb", url=url_of(server))
    assert done.returncode == 0, done.stderr
    quick, slow = split_progress(done.stdout)[0]
    assert re.fullmatch(r"\[1/2\] In \[1\] · \d{1,3} ms", quick), quick
    assert re.fullmatch(r"\[2/2\] In \[2\] · 1\.\d s", slow), slow


def test_a_replay_tells_the_gateway_the_notebooks_name(
    server: GatewayThread, tmp_path: Path
) -> None:
    """The record and the listing say which notebook a replay was (`name`)."""
    shutil.copy(REPO / "notebooks" / "pandas_table.ipynb", tmp_path / "cities table.ipynb")
    done = gateway_run(tmp_path, "cities table.ipynb", url=url_of(server))
    assert done.returncode == 0, done.stderr
    [run_id] = re.findall(r"\(run (run_\w+)\)", done.stdout)
    client = server.client(TOKEN)
    assert client.request("GET", f"/v1/runs/{run_id}").json()["name"] == "cities table.ipynb"
    [summary] = client.request("GET", "/v1/runs?limit=1").json()["runs"]
    assert (summary["id"], summary["name"]) == (run_id, "cities table.ipynb")


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "args", "in_stderr"),
    [
        ({}, ["missing.py"], "cannot read missing.py"),
        ({"prog.rb": "puts 1"}, ["prog.rb"], "cannot tell the language"),
        ({"nb.ipynb": "{"}, ["nb.ipynb"], "not a JSON notebook"),
        ({"nb.ipynb": "{}"}, ["nb.ipynb", "--language", "bash"], "--language is for scripts"),
        ({"a.py": "1"}, ["a.py", "--allow-errors"], "are for notebooks"),
        ({"a.py": "1"}, ["a.py", "--url", "file:///etc/passwd"], "http:// or https://"),
        ({"a.py": "1"}, ["a.py", "--timeout", "soon"], "invalid float value"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, files: dict[str, str], args: list[str], in_stderr: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    done = gateway_run(tmp_path, *args, url=None if "--url" in args else "http://127.0.0.1:9")
    assert done.returncode == 2, done.stderr
    assert in_stderr in done.stderr


def test_requests_the_gateway_refuses_exit_2(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "bad.ipynb").write_text(
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": []})
    )
    done = gateway_run(tmp_path, "bad.ipynb", url=url_of(server))
    assert done.returncode == 2
    assert "invalid_request" in done.stderr and "'metadata' is a required property" in done.stderr
    (tmp_path / "a.py").write_text("print(1)")
    done = gateway_run(tmp_path, "a.py", url=url_of(server), token=None)
    assert done.returncode == 2 and "unauthorized" in done.stderr
    done = gateway_run(tmp_path, "a.py", "--token", TOKEN, url=url_of(server), token="wrong")
    assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr


def test_an_unreachable_gateway_exits_1(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("print(1)")
    done = gateway_run(tmp_path, "a.py", url=f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "cannot reach the gateway" in done.stderr
