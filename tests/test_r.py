"""R through IRkernel (issue 23): the same run record as Python, on every backend whose kernels
have R (the Docker image's datascience profile; the local backend only where this machine has
R and IRkernel installed: otherwise skipped, with a reason)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests import kernel_environment
from tests.conftest import start_gateway
from tests.notebook_compare import assert_drawn, assert_same_execution, decode_image
from tests.support import REPO, Client, GatewayThread, wait_for
from tests.test_cli_run import gateway_run

R_NOTEBOOK = REPO / "notebooks" / "r" / "plots.ipynb"


@pytest.fixture
def r(gateway: GatewayThread) -> Client:
    """A client of the session's gateway, once its kernels are known to have R."""
    kernel_environment.require(gateway, "r", "IRkernel", "ggplot2", "jsonlite")
    return gateway.client()


def run_r(client: Client, code: str, **body: Any) -> dict[str, Any]:
    return client.run(language="r", code=code, **body)


# --- the record ----------------------------------------------------------------------------


def test_streams_apart_and_in_the_order_written(r: Client) -> None:
    code = "cat('out1\\n')\nmessage('err1')\ncat('out2\\n')\nwarning('careful')\nprint(1:3)\n"
    record = run_r(r, code)
    assert record["language"] == "r"
    assert (record["status"], record["exit_code"], record["error"]) == ("succeeded", 0, None)
    assert record["stdout"] == "out1\nout2\n[1] 1 2 3\n"
    assert record["stderr"].startswith("err1\nWarning message")
    assert "careful" in record["stderr"]
    # program order across the streams, one stream output per change (API.md)
    assert record["output"].index("out1") < record["output"].index("err1")
    assert record["output"].index("err1") < record["output"].index("out2")
    assert record["output"].index("careful") < record["output"].index("[1] 1 2 3")
    assert [o["name"] for o in record["outputs"]] == ["stdout", "stderr"] * 2 + ["stdout"]


def test_an_error_fails_the_run_with_its_traceback(r: Client) -> None:
    code = "cat('before\\n')\nf <- function() stop('boom')\nf()\ncat('after\\n')\n"
    record = run_r(r, code)
    assert (record["status"], record["exit_code"], record["success"]) == ("failed", 1, False)
    assert record["stdout"] == "before\n"  # nothing after the error runs
    error = record["error"]
    assert "boom" in error["evalue"]
    assert any("f()" in line for line in error["traceback"])
    assert record["outputs"][-1]["output_type"] == "error"


def test_quit_ends_the_program_with_its_status(r: Client) -> None:
    record = run_r(r, "cat('before\\n')\nquit(status = 3)\ncat('after\\n')\n")
    assert (record["status"], record["exit_code"]) == ("failed", 3)
    assert record["stdout"] == "before\n"
    record = run_r(r, "cat('before\\n')\nq()\ncat('after\\n')\n")
    assert (record["status"], record["exit_code"], record["error"]) == ("succeeded", 0, None)
    assert record["stdout"] == "before\n"


def test_rich_values_are_display_data(r: Client) -> None:
    record = run_r(r, "data.frame(k = c('a', 'b'), n = c(3L, 5L))")
    assert record["status"] == "succeeded"
    (output,) = record["outputs"]
    assert output["output_type"] == "display_data"
    data = output["data"]
    assert {"text/plain", "text/html", "text/markdown", "text/latex"} <= set(data)
    assert "<table" in data["text/html"] and "\\begin{tabular}" in data["text/latex"]


def test_base_and_ggplot2_plots_come_back_as_charts_with_their_data(r: Client) -> None:
    code = (
        "library(ggplot2)\n"
        "ggplot(data.frame(k = c('a', 'b', 'c'), n = c(3, 5, 2)), aes(k, n)) +\n"
        "  geom_col() + labs(title = 'votes', x = 'who', y = 'count')\n"
        "plot(1:4, c(2, 4, 3, 5), type = 'l', main = 'trend', xlab = 'day', ylab = 'n')\n"
    )
    record = run_r(r, code)
    assert record["status"] == "succeeded", record["error"]
    bars, line = record["charts"]
    for chart in (bars, line):
        assert (chart["mime"], chart["source"]) == ("image/png", "display")
        assert_drawn(decode_image("image/png", chart["data"]), "an R plot")
    assert (bars["spec"]["type"], bars["spec"]["title"]) == ("bar", "votes")
    assert (bars["spec"]["x_label"], bars["spec"]["y_label"]) == ("who", "count")
    (series,) = bars["spec"]["series"]
    assert series["y"] == [3, 5, 2] and series["tick_labels"] == ["a", "b", "c"]
    assert (line["spec"]["type"], line["spec"]["title"], line["spec"]["x_label"]) == (
        "line",
        "trend",
        "day",
    )
    assert line["spec"]["series"][0]["y"] == [2, 4, 3, 5]
    # each plot is also a display_data among the outputs, as Jupyter shows it
    shown = [o for o in record["outputs"] if o["output_type"] == "display_data"]
    assert [sorted(o["data"]) for o in shown] == [["image/png", "text/plain"]] * 2


def test_result_is_the_global_result_as_json(r: Client) -> None:
    code = (
        "result <- list(n = 42L, share = 0.125, names = c('a', 'b'), missing = NA,\n"
        "               rows = data.frame(x = 1:2, y = c('u', 'v')))\n"
    )
    record = run_r(r, code)
    assert record["result"] == {
        "n": 42,
        "share": 0.125,
        "names": ["a", "b"],
        "missing": None,
        "rows": [{"x": 1, "y": "u"}, {"x": 2, "y": "v"}],
    }
    assert run_r(r, "output <- 6 * 7")["result"] == 42
    refused = run_r(r, "result <- function(x) x")
    assert refused["result"] is None
    assert any("result" in note and "JSON" in note for note in refused["notes"])


def test_a_result_past_its_cap_is_not_returned(gateway: GatewayThread) -> None:
    kernel_environment.require(gateway, "r", "jsonlite")
    server = start_gateway(gateway.backend_name, result_cap_bytes=1000, pool_r=0)
    try:
        record = run_r(server.client(), "result <- rep('x', 1000)")
        assert record["status"] == "succeeded" and record["result"] is None
        assert any("over the limit of 1000 bytes" in note for note in record["notes"])
    finally:
        server.stop()


def test_vars_and_env(r: Client) -> None:
    record = run_r(
        r,
        "cat(x + 1, names, Sys.getenv('GREETING'), sort(names(input)), '\\n')\n"
        "result <- list(nested = cfg$k, has_bad = exists('bad name'))",
        vars={"x": 41, "names": ["a", "b"], "cfg": {"k": "v"}, "bad name": 1},
        env={"GREETING": "hello"},
    )
    assert record["stdout"] == "42 a b hello bad name cfg names x \n"
    assert record["result"] == {"nested": "v", "has_bad": False}


def test_timeout_keeps_what_was_printed(r: Client) -> None:
    record = run_r(r, "cat('started\\n')\nSys.sleep(60)\n", timeout=3)
    assert (record["status"], record["timed_out"], record["kill_reason"]) == (
        "timed_out",
        True,
        "timeout",
    )
    assert record["exit_code"] is None and record["stdout"] == "started\n"


def test_readline_fails_at_once_without_input(r: Client) -> None:
    record = run_r(r, "x <- readline('name? ')", timeout=20)
    assert record["status"] == "failed" and not record["timed_out"]
    assert "no standard input" in record["error"]["evalue"]


def test_files_in_and_out_and_an_entrypoint(r: Client) -> None:
    script = (
        "rows <- read.csv('data/in.csv')\n"
        "dir.create('out')\n"
        "write.csv(data.frame(total = sum(rows$n)), 'out/total.csv', row.names = FALSE)\n"
        "nrow(rows)\n"
        "png('out/plot.png'); barplot(rows$n); invisible(dev.off())\n"
    )
    record = r.run(
        language="r",
        entrypoint="main.R",
        files=[
            {"path": "main.R", "content": script},
            {"path": "data/in.csv", "content": "k,n\na,3\nb,5\n"},
        ],
        return_files=["out/total.csv", "out/plot.png"],
    )
    assert record["status"] == "succeeded", record["error"]
    assert record["stdout"] == "[1] 2\n"  # a visible value printed, as Rscript would
    total, image = record["files"]
    assert (total["path"], total["content"]) == ("out/total.csv", '"total"\n8\n')
    assert image["encoding"] == "base64"
    assert base64.b64decode(image["content"]).startswith(b"\x89PNG")


def test_the_runs_notebook_names_the_r_kernel(r: Client) -> None:
    record = run_r(r, "cat(1)")
    response = r.request("GET", f"/v1/runs/{record['id']}/notebook")
    nb = nbformat.reads(response.body.decode(), as_version=4)
    assert nb.metadata.kernelspec.name == "ir"
    assert nb.metadata.language_info.name == "R"


def test_the_code_run_tool_runs_r(r: Client) -> None:
    response = r.request(
        "POST", "/v1/tools/code_run", {"arguments": {"code": "cat(6 * 7)", "language": "r"}}
    )
    assert response.status == 200, response.body[:500]
    assert response.json()["result"]["output"] == "42"
    assert response.json()["result"]["exit_code"] == 0


def test_gateway_run_takes_an_r_script_by_its_suffix(
    gateway: GatewayThread, tmp_path: Path
) -> None:
    kernel_environment.require(gateway, "r", "ggplot2")
    (tmp_path / "plot.R").write_text(
        "cat('drawing\\n')\n"
        "library(ggplot2)\n"
        "print(ggplot(data.frame(x = 1:3, y = c(2, 4, 3)), aes(x, y)) + geom_line())\n"
        "quit(status = 2)\n"
    )
    done = gateway_run(tmp_path, "plot.R", url=f"http://127.0.0.1:{gateway.port}", token=None)
    assert (done.returncode, done.stdout) == (2, "drawing\n"), done.stderr
    assert (tmp_path / "plot-chart-1.png").read_bytes().startswith(b"\x89PNG")


# --- notebooks and pools -------------------------------------------------------------------


def test_an_r_notebook_replays_with_its_plots(r: Client) -> None:
    """notebooks/r/plots.ipynb (outputs checked by hand: nbclient has no R kernel here)."""
    stored = json.loads(R_NOTEBOOK.read_text(encoding="utf-8"))
    response = r.request("POST", "/v1/notebooks/run", {"notebook": stored, "timeout": 120})
    assert response.status == 200, response.body[:2000]
    answer = response.json()
    nbformat.validate(nbformat.from_dict(answer["notebook"]))
    assert_same_execution(answer["notebook"], stored)
    run = answer["run"]
    assert (run["status"], run["language"]) == ("succeeded", "r")
    assert [c["spec"]["title"] for c in run["charts"]] == ["votes", "votes again"]
    assert answer["notebook"]["metadata"]["kernelspec"]["name"] == "ir"


def test_a_pooled_r_kernel_serves_a_run(gateway: GatewayThread) -> None:
    kernel_environment.require(gateway, "r")
    server = start_gateway(gateway.backend_name, pool_python=0, pool_bash=0, pool_deno=0, pool_r=1)
    try:
        pools = server.gateway.services.runs.pools  # type: ignore[union-attr]
        assert wait_for(lambda: pools.describe()["irkernel"]["ready"] == 1, timeout=120)
        record = run_r(server.client(), "x <- 6 * 7\ncat(x)")
        assert (record["status"], record["stdout"]) == ("succeeded", "42")
        assert pools.describe()["irkernel"]["hits"] == 1
    finally:
        server.stop()


def test_one_r_kernel_is_pooled_by_default_where_the_kernels_have_r(
    gateway: GatewayThread,
) -> None:
    """Issue 33: R starts cold in 1.5-2 s, so by default one R kernel is kept ready where the
    backend's kernels have R, and none where they do not (it could never start)."""
    has_r = "r" in kernel_environment.environment(gateway)["languages"]
    others = {"pool_python": 0, "pool_bash": 0, "pool_deno": 0}  # pool_r left at its default
    server = GatewayThread(backend=gateway.backend_name, **others).start()
    try:
        pools = server.gateway.services.runs.pools  # type: ignore[union-attr]
        wanted = 1 if has_r else 0
        assert wait_for(lambda: pools.describe()["irkernel"]["size"] == wanted, timeout=60)
        if has_r:
            assert wait_for(lambda: pools.describe()["irkernel"]["ready"] == 1, timeout=120)
            record = run_r(server.client(), "cat(6 * 7)")
            assert (record["status"], record["stdout"]) == ("succeeded", "42")
            assert pools.describe()["irkernel"]["hits"] == 1
    finally:
        server.stop()


def test_without_r_a_run_in_r_is_refused_saying_why(local_client: Client) -> None:
    """Where the kernels have no R (here: the local backend on a machine without R), a run in
    R is 400 unsupported_language saying so (API.md), as is a notebook in R: no sandbox is
    started for it."""
    if shutil.which("R") is not None:
        pytest.skip("this machine has R: the local backend's kernels run it")
    response = local_client.request("POST", "/v1/runs", {"code": "cat(1)", "language": "r"})
    assert response.status == 400
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("unsupported_language", "language")
    assert "kernels have no 'r'" in error["message"]
    stored = json.loads(R_NOTEBOOK.read_text(encoding="utf-8"))
    response = local_client.request("POST", "/v1/notebooks/run", {"notebook": stored})
    assert response.status == 400
    assert response.json()["error"]["code"] == "unsupported_language"


@pytest.mark.attack
def test_what_is_planted_in_a_workspace_never_runs_when_r_starts(
    gateway: GatewayThread, tmp_path: Path
) -> None:
    """R reads `.Rprofile` and `.Renviron` of its working folder and restores `.RData` when
    it starts: in a persistent workspace a tenant's earlier run could plant them (as
    `sitecustomize.py` for Python, issue 8 hole 3). R's kernel starts with `--vanilla`."""
    kernel_environment.require(gateway, "r")
    server = start_gateway(gateway.backend_name, workspaces=tmp_path / "ws")
    try:
        client = server.client()
        planted = (
            'writeLines(c("file.create(\'ran-rprofile\')", "planted_profile <- TRUE"),\n'
            "           '.Rprofile')\n"
            "writeLines('PLANTED_ENV=1', '.Renviron')\n"
            "planted_data <- TRUE\nsave.image()\n"
        )
        record = run_r(client, planted, working_dir=".")
        assert record["status"] == "succeeded", record["error"]
        workspace = tmp_path / "ws" / "local"  # the single user's
        assert {".Rprofile", ".Renviron", ".RData"} <= {p.name for p in workspace.iterdir()}
        probe = (
            "result <- list(profile = exists('planted_profile'), data = exists('planted_data'),\n"
            "               env = Sys.getenv('PLANTED_ENV'))"
        )
        record = run_r(client, probe, working_dir=".")
        assert record["result"] == {"profile": False, "data": False, "env": ""}
        assert not (workspace / "ran-rprofile").exists()
    finally:
        server.stop()
