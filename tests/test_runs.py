"""The behavioural suite of POST /v1/runs, run against every backend (real kernels); what is
the gateway's alone (a record's fields, the clamp) on one (conftest.OneBackend)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from tests import census
from tests.api import poll_run, pools, submit, take
from tests.support import Client, GatewayThread, wait_for, wrote

RECORD_FIELDS = {
    "id",
    "language",
    "status",
    "success",
    "exit_code",
    "stdout",
    "stderr",
    "output",
    "stdout_truncated",
    "stderr_truncated",
    "output_truncated",
    "outputs",
    "result",
    "error",
    "charts",
    "files",
    "timed_out",
    "kill_reason",
    "usage",
    "started_at",
    "finished_at",
    "snapshot",
    "continued_from",
    "continued_by",
    "snapshots",
    "name",
    "files_given",
    "notes",
}


def test_print_one_returns_a_complete_record(client: Client) -> None:
    record = client.run(code="print(1)")
    assert set(record) == RECORD_FIELDS
    assert record["status"] == "succeeded" and record["success"] is True
    assert record["snapshot"] is None and record["continued_from"] is None
    assert record["snapshots"] == [] and record["continued_by"] is None
    assert record["name"] is None and record["files_given"] is None  # no notebook, no files
    assert record["exit_code"] == 0
    assert record["stdout"] == "1\n" and record["stderr"] == "" and record["output"] == "1\n"
    assert record["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    assert record["error"] is None and record["result"] is None and record["charts"] == []
    assert record["timed_out"] is False and record["kill_reason"] is None
    assert record["usage"]["wall_ms"] > 0
    assert record["usage"]["cpu_ms"] is not None and record["usage"]["cpu_ms"] >= 0
    assert record["usage"]["peak_memory_bytes"] > 1_000_000
    assert record["started_at"].endswith("Z") and record["finished_at"] >= record["started_at"]


def test_stdout_and_stderr_apart_and_interleaved_in_order(client: Client) -> None:
    """The order the code wrote them in, with no flush and no pause asked of it (API.md,
    "Order of stdout and stderr")."""
    code = "import sys\nprint('out1')\nprint('err1', file=sys.stderr)\nprint('out2')\n"
    record = client.run(code=code)
    assert record["stdout"] == "out1\nout2\n"
    assert record["stderr"] == "err1\n"
    assert record["output"] == "out1\nerr1\nout2\n"
    assert [o["name"] for o in record["outputs"]] == ["stdout", "stderr", "stdout"]


@pytest.mark.one_backend
def test_uncaught_exception_is_a_failed_run_not_an_http_error(client: Client) -> None:
    record = client.run(code="print('before')\n1/0")
    assert record["status"] == "failed" and record["success"] is False
    assert record["exit_code"] == 1
    assert record["stdout"] == "before\n"
    assert record["error"]["ename"] == "ZeroDivisionError"
    assert any("1/0" in line or "ZeroDivision" in line for line in record["error"]["traceback"])
    assert record["outputs"][-1]["output_type"] == "error"


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [
        ("import sys; sys.exit(3)", "failed", 3),
        ("import sys; sys.exit(0)", "succeeded", 0),
        ("import sys; sys.exit()", "succeeded", 0),
        ("import sys; sys.exit('bye')", "failed", 1),
    ],
)
def test_sys_exit_sets_the_exit_code(
    client: Client, code: str, status: str, exit_code: int
) -> None:
    record = client.run(code=code)
    assert (record["status"], record["exit_code"]) == (status, exit_code)


@pytest.mark.one_backend
def test_result_then_output_are_read_back(client: Client) -> None:
    assert client.run(code="result = {'a': [1, 2.5, None]}")["result"] == {"a": [1, 2.5, None]}
    assert client.run(code="output = 'o'")["result"] == "o"
    assert client.run(code="output = 1\nresult = 2")["result"] == 2
    assert client.run(code="import numpy as np\nresult = np.arange(3)")["result"] == [0, 1, 2]
    assert client.run(code="x = 1")["result"] is None


@pytest.mark.one_backend
def test_unserialisable_result_is_null_with_a_note(client: Client) -> None:
    record = client.run(code="result = object()")
    assert record["result"] is None
    assert any("result" in note and "JSON" in note for note in record["notes"])


@pytest.mark.one_backend
def test_vars_become_globals_and_input(client: Client) -> None:
    code = "result = [x + 1, input['x'], input['not valid'], input['result'], 'result' in dir()]"
    record = client.run(code=code, vars={"x": 5, "not valid": 1, "result": 9})
    # `result` is reserved: it is only in `input`, never a global before the code sets it
    assert record["result"] == [6, 5, 1, 9, False]


def test_env_reaches_the_kernel_and_gateway_env_does_not(client: Client) -> None:
    code = "import os\nresult = [os.environ.get('GREETING'), os.environ.get('GATEWAY_TEST_SECRET')]"
    import os as host_os

    host_os.environ["GATEWAY_TEST_SECRET"] = "s3cret"
    try:
        record = client.run(code=code, env={"GREETING": "hi"})
    finally:
        del host_os.environ["GATEWAY_TEST_SECRET"]
    assert record["result"] == ["hi", None]


def test_files_are_staged_in_utf8_and_base64_with_folders(client: Client) -> None:
    files = [
        {"path": "data/deep/a.txt", "content": "héllo"},
        {"path": "b.bin", "content": base64.b64encode(b"\x00\xff").decode(), "encoding": "base64"},
    ]
    code = "result = [open('data/deep/a.txt').read(), list(open('b.bin','rb').read())]"
    assert client.run(code=code, files=files)["result"] == ["héllo", [0, 255]]


def test_python_entrypoint_runs_as_main_and_imports_siblings(client: Client) -> None:
    files = [
        {"path": "main.py", "content": "import lib\nprint(__name__)\nresult = lib.double(x)\n"},
        {"path": "lib.py", "content": "def double(n):\n    return n * 2\n"},
    ]
    record = client.run(entrypoint="main.py", files=files, vars={"x": 21})
    assert record["status"] == "succeeded", record
    assert record["stdout"] == "__main__\n" and record["result"] == 42


def test_bash_entrypoint(client: Client) -> None:
    files = [{"path": "run.sh", "content": "echo from script; exit 4\n"}]
    record = client.run(language="bash", entrypoint="run.sh", files=files)
    assert (record["stdout"], record["exit_code"], record["status"]) == (
        "from script\n",
        4,
        "failed",
    )


def test_bash_keeps_streams_apart_and_reports_the_exit_status(client: Client) -> None:
    record = client.run(language="bash", code="echo out; echo err >&2; echo more; exit 3")
    assert record["stdout"] == "out\nmore\n" and record["stderr"] == "err\n"
    assert record["exit_code"] == 3 and record["status"] == "failed"
    ok = client.run(language="bash", code="x=$((6*7)); echo $x")
    assert (ok["stdout"], ok["exit_code"], ok["status"]) == ("42\n", 0, "succeeded")


def test_bash_vars_become_environment_variables(client: Client) -> None:
    record = client.run(
        language="bash", code='echo "$NAME $COUNT"', vars={"NAME": "a b", "COUNT": 3}
    )
    assert record["stdout"] == "a b 3\n"


def test_return_files_paths_globs_and_errors(client: Client) -> None:
    code = (
        "import os\n"
        "os.makedirs('out/sub', exist_ok=True)\n"
        "open('out/a.txt','w').write('A')\n"
        "open('out/sub/b.txt','w').write('B')\n"
        "open('img.bin','wb').write(bytes([0, 200, 255]))\n"
    )
    record = client.run(
        code=code, return_files=["out/a.txt", "out/**/*.txt", "img.bin", "missing.txt", "out"]
    )
    by_path = {}
    for entry in record["files"]:
        by_path.setdefault(entry["path"], entry)
    assert by_path["out/a.txt"] == {
        "path": "out/a.txt",
        "size": 1,
        "encoding": "utf-8",
        "content": "A",
    }
    assert by_path["out/sub/b.txt"]["content"] == "B"
    assert by_path["img.bin"]["encoding"] == "base64"
    assert base64.b64decode(by_path["img.bin"]["content"]) == bytes([0, 200, 255])
    assert by_path["missing.txt"]["error"] == "not found"
    assert by_path["out"]["error"] == "is a folder"


def test_return_files_never_leave_the_working_folder(client: Client) -> None:
    code = (
        "import os\n"
        "os.symlink('/etc/passwd', 'link')\n"
        "os.symlink('/etc', 'etcdir')\n"
        "open('inside.txt','w').write('ok')\n"
        "os.symlink('inside.txt', 'good_link')\n"
    )
    record = client.run(
        code=code,
        return_files=["link", "etcdir/passwd", "../../etc/passwd", "/etc/passwd", "good_link", "*"],
    )
    answered = [(e["path"], e.get("content", e.get("error"))) for e in record["files"]]
    outside = "outside the working folder"
    assert answered == [
        ("link", outside),
        ("etcdir/passwd", outside),
        ("../../etc/passwd", outside),
        ("/etc/passwd", outside),
        ("good_link", "ok"),
        ("etcdir", outside),  # the matches of "*", in order
        ("good_link", "ok"),
        ("inside.txt", "ok"),
        ("link", outside),
    ]
    assert not any("root:" in json.dumps(e) for e in record["files"])


@pytest.mark.one_backend
def test_rich_outputs_are_mime_bundles(client: Client) -> None:
    code = (
        "from IPython.display import display, HTML, JSON, SVG\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(JSON({'k': 1}))\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"></svg>\'))\n'
        "import pandas as pd\n"
        "pd.DataFrame({'a': [1, 2]})\n"
    )
    record = client.run(code=code)
    kinds = [(o["output_type"], sorted(o.get("data", {}))) for o in record["outputs"]]
    assert ("display_data", ["text/html", "text/plain"]) in kinds
    assert ("display_data", ["application/json", "text/plain"]) in kinds
    assert any("image/svg+xml" in data for _, data in kinds)
    assert kinds[-1][0] == "execute_result" and "text/html" in kinds[-1][1]
    assert [c["mime"] for c in record["charts"]] == ["image/svg+xml"]


def test_charts_from_show_left_open_and_savefig(client: Client) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6], label='s'); plt.title('shown'); plt.xlabel('x')\n"
        "plt.show()\n"
        "fig, ax = plt.subplots(); ax.bar(['a', 'b'], [3, 7]); ax.set_title('saved')\n"
        "fig.savefig('chart.png')\n"
        "fig.savefig('chart.svg')\n"
        "plt.figure(); plt.scatter([1, 2], [3, 4]); plt.title('left open')\n"
    )
    record = client.run(code=code)
    assert record["status"] == "succeeded", record
    charts = record["charts"]
    titles = [(c["source"], c.get("path"), c["spec"]["title"], c["mime"]) for c in charts]
    assert ("display", None, "shown", "image/png") in titles
    assert ("savefig", "chart.png", "saved", "image/png") in titles
    assert ("savefig", "chart.svg", "saved", "image/svg+xml") in titles
    assert ("display", None, "left open", "image/png") in titles
    shown = next(c for c in charts if c["spec"]["title"] == "shown")
    assert shown["spec"]["type"] == "line" and shown["spec"]["x_label"] == "x"
    assert shown["spec"]["series"][0]["y"] == [4, 5, 6]
    saved = next(c for c in charts if c.get("path") == "chart.png")
    assert saved["spec"]["type"] == "bar" and saved["spec"]["series"][0]["y"] == [3, 7]
    assert base64.b64decode(saved["data"])[:8] == b"\x89PNG\r\n\x1a\n"


def ended_after_it_started(server: GatewayThread, client: Client, body: dict[str, Any]) -> Any:
    """A background run of code that first writes `started` in its working folder: its
    record once final, and how long after the host saw `started` it was final. Timed from
    that event, not from the POST: a slow kernel start does not count."""
    run_id = submit(client, body)
    assert wait_for(lambda: wrote(server, "started"), timeout=90), poll_run(
        client, run_id, lambda r: True
    )
    seen = time.monotonic()
    record = poll_run(client, run_id, timeout=60)
    return record, time.monotonic() - seen


# From the code's start to its final record: the timeout, then the kill and the read back.
GRACE = 10.0


def test_timeout_returns_partial_output_and_files(gateway: GatewayThread, client: Client) -> None:
    code = (
        "import time\nprint('started', flush=True)\n"
        "open('progress.txt','w').write('half')\nopen('started', 'w').close()\n"
        "time.sleep(3600)"
    )
    record, after = ended_after_it_started(
        gateway, client, {"code": code, "timeout": 2, "return_files": ["progress.txt"]}
    )
    assert record["status"] == "timed_out" and record["timed_out"] is True
    assert after < 2 + GRACE, after
    assert record["exit_code"] is None and record["kill_reason"] == "timeout"
    assert record["stdout"].startswith("started\n")
    assert record["files"][0]["content"] == "half"


@pytest.mark.parametrize(
    "code",
    [
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen('started', 'w').close()\n"
        "while True: time.sleep(0.01)",
        "open('started', 'w').close()\nwhile True: pass",
        "import subprocess\nsubprocess.Popen(['setsid', 'sleep', '1000'])\n"
        "subprocess.Popen('nohup sleep 1000 &', shell=True)\nopen('started', 'w').close()\n"
        "import time; time.sleep(1000)",
    ],
)
def test_code_that_resists_still_ends_at_the_deadline(
    gateway: GatewayThread, client: Client, code: str
) -> None:
    record, after = ended_after_it_started(gateway, client, {"code": code, "timeout": 1.5})
    assert record["status"] == "timed_out"
    assert after < 1.5 + GRACE, after
    assert census.after_teardown() == []


def test_background_children_do_not_outlive_a_finished_run(client: Client) -> None:
    code = (
        "nohup sleep 1000 >/dev/null 2>&1 &\n"
        "setsid sleep 1000 >/dev/null 2>&1 &\n"
        "( ( sleep 1000 & ) & )\n"
        "echo done"
    )
    record = client.run(language="bash", code=code)
    assert record["stdout"] == "done\n"
    assert census.after_teardown() == []


def test_nothing_carries_over_between_runs(client: Client) -> None:
    """Every run takes a pooled kernel (the pools are full before each): the first leaves a
    variable, files and an environment variable behind, and none of the runs after it sees
    them. As many runs follow as the pool holds, and one more, so that a used kernel handed
    back to the pool would be taken by one of them."""
    first = take(
        client,
        "import os\nsecret = 1\nopen('left.txt','w').write('x')\n"
        "open('/tmp/left.txt','w').write('x')\n"
        "os.environ['LEFT'] = '1'",
    )
    assert first["status"] == "succeeded", first
    size = pools(client)["ipykernel"]["size"]
    assert size >= 1, pools(client)
    for _ in range(size + 1):
        later = take(
            client,
            "import os\nresult = ['secret' in dir(), os.path.exists('left.txt'), "
            "os.path.exists('/tmp/left.txt'), os.environ.get('LEFT'), os.listdir('.')]",
        )
        assert later["result"] == [False, False, False, None, []], later


@pytest.mark.one_backend
def test_timeout_is_clamped_and_noted(client: Client) -> None:
    record = client.run(code="print(1)", timeout=0.01)
    assert record["status"] == "succeeded"
    assert any("clamped to 1 s" in n for n in record["notes"])


@pytest.mark.one_backend
def test_get_and_notebook_of_a_run(client: Client) -> None:
    import nbformat

    record = client.run(code="print('nb')\n1 + 1")
    fetched = client.request("GET", f"/v1/runs/{record['id']}")
    assert fetched.status == 200 and fetched.json() == record
    exported = client.request("GET", f"/v1/runs/{record['id']}/notebook")
    assert exported.status == 200
    assert exported.headers["Content-Type"].startswith("application/x-ipynb+json")
    nb = nbformat.reads(exported.body.decode(), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    assert nb.metadata.language_info.name == "python"
    [cell] = nb.cells
    assert cell.source == "print('nb')\n1 + 1"
    assert [o.output_type for o in cell.outputs] == ["stream", "execute_result"]


def test_background_run_polls_and_cancels(gateway: GatewayThread, client: Client) -> None:
    """The cancel lands while the code runs (it has written `started`), not while its kernel
    starts, and ends that kernel: no sandbox of the run is left once the gateway settles."""
    response = client.request(
        "POST",
        "/v1/runs",
        {
            "code": "import time\nopen('started', 'w').close()\ntime.sleep(120)",
            "background": True,
        },
    )
    assert response.status == 202
    run_id = response.json()["id"]
    assert response.json()["status"] in ("queued", "running")
    poll_run(client, run_id, until=lambda r: r["status"] == "running", timeout=30)
    assert wait_for(lambda: wrote(gateway, "started"), timeout=60)
    cancelled = client.request("DELETE", f"/v1/runs/{run_id}")
    assert cancelled.status == 200
    record = cancelled.json()
    assert record["status"] == "cancelled" and record["kill_reason"] == "cancelled", record
    assert record["exit_code"] is None
    assert client.request("GET", f"/v1/runs/{run_id}").json()["status"] == "cancelled"
    assert census.after_teardown(timeout=60) == []  # long before the code's 120 s are up


def test_runs_in_parallel_do_not_block_each_other(client: Client) -> None:
    """Three runs are running at once (seen by /v1/health, which answers all along: the
    event loop is not blocked); none can end before it is cancelled."""
    ids = [submit(client, {"code": "import time\ntime.sleep(120)"}) for _ in range(3)]
    try:
        for run_id in ids:
            poll_run(client, run_id, until=lambda r: r["status"] == "running", timeout=60)
        health = client.request("GET", "/v1/health", timeout=10).json()
        assert health["kernels"]["running"] >= 3
    finally:
        records = [client.request("DELETE", f"/v1/runs/{run_id}").json() for run_id in ids]
    assert [r["status"] for r in records] == ["cancelled"] * 3


def test_usage_measures_the_cpu_and_memory_the_code_used(client: Client) -> None:
    idle = client.run(code="print(1)")["usage"]
    code = (
        "import time\n"
        "block = bytearray(200 * 1024 * 1024)\n"
        "block[:: 4096] = b'x' * len(block[:: 4096])  # touch every page\n"
        "spent = time.process_time()\n"
        "while time.process_time() - spent < 1.0:\n"
        "    pass\n"
    )
    busy = client.run(code=code, timeout=60)
    assert busy["status"] == "succeeded", busy
    usage = busy["usage"]
    assert usage["cpu_ms"] >= 1000 and usage["cpu_ms"] >= idle["cpu_ms"] + 900, (usage, idle)
    assert usage["wall_ms"] >= 1000, usage
    assert usage["peak_memory_bytes"] >= 200 * 1024 * 1024, usage
    assert usage["peak_memory_bytes"] < 1024**3  # the sandbox's limit: it was not killed
    assert idle["peak_memory_bytes"] < 200 * 1024 * 1024, idle
