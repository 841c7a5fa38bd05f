"""The seed-compatible tool endpoints (`/v1/tools/*`): every example of the three manuals in
reference/, their limits, clamps, truncation boundaries and answer shapes, on one backend (they are the gateway's:
conftest.OneBackend)."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import Principal
from gateway.models.record import RunRecord
from gateway.runs.config import RequestPolicy
from gateway.tools import cut_bytes, prefix_stderr, program_chunks, traceback_text
from gateway.tools.code_exec import exec_timeout, parse_code_exec
from gateway.tools.code_run import cut_output
from tests.api import assert_error, poll_run
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, part_config, write_tokens

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend

KiB = 1024


def tool(client: Client, name: str, body: Any, status: int = 200) -> Any:
    response = client.request("POST", f"/v1/tools/{name}", body)
    assert response.status == status, (response.status, response.body[:3000])
    return response.json()


def code_run(client: Client, **arguments: Any) -> dict[str, Any]:
    answer = tool(client, "code_run", {"arguments": arguments})
    assert answer["tool"] == "code_run" and answer["id"].startswith("run_")
    assert set(answer) == {"id", "tool", "result"}
    result: dict[str, Any] = answer["result"]
    return result


def run_python(client: Client, source: str | None = None, **fields: Any) -> dict[str, Any]:
    vars_ = fields.pop("vars", None)
    params = {"source": source, **fields} if source is not None else fields
    body: dict[str, Any] = {"params": params}
    if vars_ is not None:
        body["input"] = {"vars": vars_}
    answer: dict[str, Any] = tool(client, "run_python", body)
    return answer


# --- code_run -----------------------------------------------------------------------------


def test_code_run_manual_example_python(client: Client) -> None:
    code = (
        "import statistics\nprices = [19.5, 22.0, 18.75, 25.1]\n"
        "print(round(statistics.mean(prices), 2))"
    )
    result = code_run(client, code=code, timeout_seconds=20)
    assert result == {
        "language": "python",
        "exit_code": 0,
        "output": "21.34\n",
        "truncated": False,
        "timed_out": False,
    }


def test_code_run_manual_example_bash_with_files(client: Client) -> None:
    result = code_run(
        client,
        language="bash",
        code="sort -t, -k2 -n data/sales.csv | tail -1 | tee top.txt",
        files=[{"path": "data/sales.csv", "content": "north,120\nsouth,340\neast,95\n"}],
        return_files=["top.txt"],
    )
    assert result == {
        "language": "bash",
        "exit_code": 0,
        "output": "south,340\n",
        "truncated": False,
        "timed_out": False,
        "files": [{"path": "top.txt", "size": 10, "encoding": "utf-8", "content": "south,340\n"}],
    }


def test_code_run_exception_and_bash_exit_status(client: Client) -> None:
    python = code_run(client, code="print('before')\n1/0", timeout_seconds=120)
    assert python["exit_code"] == 1 and python["timed_out"] is False
    assert python["output"].startswith("before\n")
    assert python["output"].rstrip().endswith("ZeroDivisionError: division by zero")
    assert "\x1b" not in python["output"]  # a plain-text traceback, no terminal colours
    assert "files" not in python and "notes" not in python
    bash = code_run(client, language="bash", code="echo out; echo err >&2; sleep 0.2; exit 3")
    assert bash == {
        "language": "bash",
        "exit_code": 3,
        "output": "out\nerr\n",
        "truncated": False,
        "timed_out": False,
    }


# Every language the manual names, the same program: print, fail, time out, exit.
CODE_RUN_PROGRAMS = {
    "python": (
        "print('a'); import sys; print('b', file=sys.stderr)",
        "print('before', flush=True)\nraise ValueError('bad')",
        "print('started', flush=True)\nwhile True: pass",
        "import sys\nprint('bye', flush=True)\nsys.exit(7)",
    ),
    "bash": (
        "echo a; echo b >&2",
        "echo before; false",
        "echo started; while :; do :; done",
        "echo bye; exit 7",
    ),
    "javascript": (
        "console.log('a'); console.error('b')",
        "console.log('before');\nthrow new RangeError('bad')",
        "console.log('started');\nwhile (true) {}",
        "console.log('bye');\nprocess.exit(7)",
    ),
    "typescript": (
        "const a: string = 'a'; console.log(a); console.error('b')",
        "console.log('before');\nconst f = (): never => { throw new RangeError('bad') };\nf()",
        "console.log('started');\nwhile (true) {}",
        "console.log('bye');\nDeno.exit(7)",
    ),
}


@pytest.mark.parametrize("language", sorted(CODE_RUN_PROGRAMS))
def test_code_run_every_language_of_the_manual(client: Client, language: str) -> None:
    printing, failing, looping, exiting = CODE_RUN_PROGRAMS[language]
    ok = code_run(client, language=language, code=printing)
    assert ok == {
        "language": language,
        "exit_code": 0,
        "output": "a\nb\n",
        "truncated": False,
        "timed_out": False,
    }
    failed = code_run(client, language=language, code=failing)
    assert failed["exit_code"] == 1 and failed["timed_out"] is False, failed
    assert failed["output"].startswith("before\n")
    if language != "bash":
        assert "bad" in failed["output"] and "\x1b" not in failed["output"], failed
    stopped = code_run(
        client, language=language, code=looping, timeout_seconds=1, return_files=["none.txt"]
    )
    assert (stopped["exit_code"], stopped["timed_out"], stopped["output"]) == (None, True, "")
    assert stopped["files"] == [{"path": "none.txt", "size": None, "error": "not found"}]
    exited = code_run(client, language=language, code=exiting)
    assert (exited["exit_code"], exited["output"]) == (7, "bye\n"), exited


def test_code_run_output_over_50000_characters_keeps_first_10000_and_last_40000(
    client: Client,
) -> None:
    # exactly 50,000 characters (100,000 bytes): characters count, not bytes
    exact = code_run(client, code="import sys\n_ = sys.stdout.write('é' * 50000)")
    assert exact["truncated"] is False and exact["output"] == "é" * 50000
    assert "notes" not in exact
    over = code_run(
        client, code="import sys\n_ = sys.stdout.write('A' * 10000 + 'M' + 'Z' * 40000)"
    )
    assert over["truncated"] is True
    assert over["output"] == "A" * 10000 + "Z" * 40000
    assert any("first 10,000 and last 40,000" in note for note in over["notes"])


def test_code_run_timeout_loses_the_output_but_reads_files(client: Client) -> None:
    code = (
        "import time\nprint('started', flush=True)\n"
        "open('progress.txt', 'w').write('step 1\\n')\ntime.sleep(30)"
    )
    result = code_run(client, code=code, timeout_seconds=1, return_files=["progress.txt"])
    assert result["exit_code"] is None and result["timed_out"] is True
    assert result["output"] == "" and result["truncated"] is False
    assert result["files"] == [
        {"path": "progress.txt", "size": 7, "encoding": "utf-8", "content": "step 1\n"}
    ]
    assert any("timeout_seconds (1 s)" in note for note in result["notes"])


def test_code_run_return_files_in_order_with_errors_and_limits(client: Client) -> None:
    code = (
        "import os\nos.mkdir('sub')\n"
        "open('p1.txt', 'w').write('a' * 900_000)\n"
        "open('p2.txt', 'w').write('b' * 90_000)\n"
        "open('p3.txt', 'w').write('c' * 20_000)\n"
        "open('big.bin', 'wb').write(b'x' * 1_000_001)\n"
        "open('huge.bin', 'wb').write(b'x' * 1_100_000)\n"
        "open('img.bin', 'wb').write(bytes([0x89, 0x50, 0xff, 0x00]))\n"
        "open('a[1].txt', 'w').write('literal')\n"
    )
    asked = [
        "exact.txt",  # 1,000,000 bytes: at the per-file limit, returned
        "missing.txt",
        "sub",
        "big.bin",  # 1,000,001 bytes: over 1 MB
        "huge.bin",  # over the gateway's own 1 MiB read limit too
        "p1.txt",  # 900,000: returned (1,900,000 so far)
        "/home/daytona/p2.txt",  # the manual's working directory: 1,990,000 so far
        "p3.txt",  # 20,000 more would pass 2 MB in all
        "img.bin",  # 4 bytes still fit; not UTF-8 -> base64
        "a[1].txt",  # a name, not a pattern
    ]
    result = code_run(
        client,
        code=code,
        files=[{"path": "exact.txt", "content": "e" * 1_000_000}],
        return_files=asked,
    )
    assert result["exit_code"] == 0, result
    files = result["files"]
    assert [f["path"] for f in files] == asked
    by = {f["path"]: f for f in files}
    assert by["exact.txt"]["size"] == 1_000_000 and by["exact.txt"]["content"] == "e" * 1_000_000
    assert by["missing.txt"] == {"path": "missing.txt", "size": None, "error": "not found"}
    assert by["sub"] == {"path": "sub", "size": None, "error": "is a folder"}
    assert by["big.bin"]["size"] == 1_000_001 and "content" not in by["big.bin"]
    assert "1000000 bytes" in by["big.bin"]["error"]
    assert by["huge.bin"]["size"] == 1_100_000 and "1000000 bytes" in by["huge.bin"]["error"]
    assert by["p1.txt"]["content"] == "a" * 900_000 and by["p1.txt"]["encoding"] == "utf-8"
    assert by["/home/daytona/p2.txt"]["content"] == "b" * 90_000
    assert by["p3.txt"]["size"] == 20_000 and "2000000 bytes" in by["p3.txt"]["error"]
    assert by["img.bin"] == {
        "path": "img.bin",
        "size": 4,
        "encoding": "base64",
        "content": "iVD/AA==",
    }
    assert by["a[1].txt"]["content"] == "literal"
    for entry in files:
        assert set(entry) in ({"path", "size", "encoding", "content"}, {"path", "size", "error"})


def test_code_run_notes_what_it_does_not_return(client: Client) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(); plt.plot([1, 3, 2]); fig.savefig('chart.png'); plt.show()\n"
        "print('drawn')\n"
        "1 + 1"
    )
    result = code_run(client, code=code, return_files=["chart.png"])
    assert result["exit_code"] == 0 and result["output"] == "drawn\n"
    [chart] = result["files"]
    assert chart["encoding"] == "base64" and chart["size"] > 1000
    notes = result["notes"]
    assert any(n.startswith("1 chart(s) the code showed") and "savefig" in n for n in notes), notes
    assert any("last expression" in n for n in notes), notes


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({}, "invalid_request", "arguments"),
        ({"arguments": "print(1)"}, "invalid_request", "arguments"),
        ({"arguments": {}}, "invalid_request", "arguments.code"),
        ({"arguments": {"code": 1}}, "invalid_request", "arguments.code"),
        (
            {"arguments": {"code": "1", "language": "ruby"}},
            "unsupported_language",
            "arguments.language",
        ),
        (
            {"arguments": {"code": "1", "language": "JavaScript"}},
            "unsupported_language",
            "arguments.language",
        ),
        (
            {"arguments": {"code": "1", "timeout_seconds": 0}},
            "invalid_request",
            "arguments.timeout_seconds",
        ),
        (
            {"arguments": {"code": "1", "timeout_seconds": 121}},
            "invalid_request",
            "arguments.timeout_seconds",
        ),
        (
            {"arguments": {"code": "1", "timeout_seconds": 2.5}},
            "invalid_request",
            "arguments.timeout_seconds",
        ),
        (
            {"arguments": {"code": "1", "timeout_seconds": "30"}},
            "invalid_request",
            "arguments.timeout_seconds",
        ),
        (
            {"arguments": {"code": "1", "timeout_seconds": True}},
            "invalid_request",
            "arguments.timeout_seconds",
        ),
        ({"arguments": {"code": "1", "timeout": 5}}, "invalid_request", "arguments.timeout"),
        (
            {
                "arguments": {
                    "code": "1",
                    "files": [{"path": f"f{i}", "content": ""} for i in range(11)],
                }
            },
            "invalid_request",
            "arguments.files",
        ),
        (
            {"arguments": {"code": "1", "files": [{"path": "a", "content": "x" * 1_000_001}]}},
            "invalid_request",
            "arguments.files[0].content",
        ),
        (
            {"arguments": {"code": "1", "files": [{"path": "../a", "content": ""}]}},
            "invalid_path",
            "arguments.files[0].path",
        ),
        (
            {"arguments": {"code": "1", "files": [{"path": "/etc/a", "content": ""}]}},
            "invalid_path",
            "arguments.files[0].path",
        ),
        (
            {
                "arguments": {
                    "code": "1",
                    "files": [{"path": "a", "content": "", "encoding": "base64"}],
                }
            },
            "invalid_request",
            "arguments.files[0].encoding",
        ),
        (
            {
                "arguments": {
                    "code": "1",
                    "files": [{"path": "a", "content": ""}, {"path": "./a", "content": ""}],
                }
            },
            "invalid_request",
            "arguments.files[1]",
        ),
        (
            {"arguments": {"code": "1", "return_files": "a"}},
            "invalid_request",
            "arguments.return_files",
        ),
        (
            {"arguments": {"code": "1", "return_files": [f"f{i}" for i in range(11)]}},
            "invalid_request",
            "arguments.return_files",
        ),
    ],
)
def test_code_run_invalid_arguments_are_400(
    local_client: Client, body: dict[str, Any], code: str, field: str
) -> None:
    response = local_client.request("POST", "/v1/tools/code_run", body)
    error = assert_error(response, 400, code, field=field)
    if code == "unsupported_language":
        assert "python" in error["message"] and "bash" in error["message"]


def test_code_run_limits_at_their_edges_are_accepted(client: Client) -> None:
    files = [{"path": f"d/f{i}.txt", "content": str(i)} for i in range(10)]
    result = code_run(
        client,
        language="bash",
        code="cat d/f*.txt | wc -c",
        files=files,
        return_files=[f"/home/daytona/d/f{i}.txt" for i in range(10)],
        timeout_seconds=1.0,  # a whole number is an integer, as in JSON Schema
    )
    assert result["exit_code"] == 0 and result["output"].strip() == "10"
    assert [f["content"] for f in result["files"]] == [str(i) for i in range(10)]


# --- run_python ---------------------------------------------------------------------------


def test_run_python_manual_examples(client: Client) -> None:
    examples = [
        ({"x": 5}, "result = x + 1", {"result": 6, "stdout": "", "stderr": ""}),
        (
            {"data": [1, 2, 3, 4, 5]},
            "result = {'sum': sum(data), 'count': len(data)}",
            {"result": {"sum": 15, "count": 5}, "stdout": "", "stderr": ""},
        ),
        (
            {"data": [1, 2, 3]},
            "print('summing')\nresult = sum(data)",
            {"result": 6, "stdout": "summing\n", "stderr": ""},
        ),
    ]
    for vars_, source, expected in examples:
        body = {
            "type": "code.run_python",
            "input": {"vars": vars_},
            "params": {"source": source, "timeout_seconds": 5},
        }
        assert tool(client, "run_python", body) == expected


def test_run_python_manual_multi_file_project(client: Client) -> None:
    params = {
        "files": {
            "main.py": "import lib\nresult = lib.double(x)\n",
            "lib.py": "def double(n):\n    return n * 2\n",
        },
        "entrypoint": "main.py",
        "timeout_seconds": 5,
    }
    body = {"id": "step-1", "input": {"vars": {"x": 5}}, "params": params}  # a step's own keys pass
    answer = tool(client, "run_python", body)
    assert answer == {"result": 10, "stdout": "", "stderr": ""}


def test_run_python_limits_at_their_edges_are_accepted(client: Client) -> None:
    files = {f"lib/m{i}.py": f"V = {i}\n" for i in range(62)}
    files["data.txt"] = "d" * (64 * KiB)
    files["main.py"] = "import os\nresult = [len(os.listdir('lib')), os.path.getsize('data.txt')]\n"
    answer = run_python(client, files=files, entrypoint="main.py", timeout_seconds=30)
    assert answer == {"result": [62, 64 * KiB], "stdout": "", "stderr": ""}
    source = "result = x + 1\n#"
    source += "a" * (50_000 - len(source))
    assert run_python(client, source, vars={"x": 1}, timeout_seconds=1)["result"] == 2


def test_run_python_exception_is_a_traceback_in_stderr(client: Client) -> None:
    answer = run_python(
        client, "import sys\nprint('out')\nprint('err', file=sys.stderr)\nresult = 1\n1/0"
    )
    assert answer["result"] is None and answer["stdout"] == "out\n"
    assert answer["stderr"].startswith("err\n")
    assert answer["stderr"].rstrip().endswith("ZeroDivisionError: division by zero")
    assert "\x1b" not in answer["stderr"]
    assert set(answer) == {"result", "stdout", "stderr"}


def test_run_python_streams_are_cut_at_64_kib(client: Client) -> None:
    source = (
        "import sys\nsys.stdout.write('x' * 65536)\nsys.stdout.flush()\n"
        "sys.stderr.write('y' * 65536 + 'Z')\nresult = 'ok'"
    )
    answer = run_python(client, source)
    assert answer["result"] == "ok"
    assert answer["stdout"] == "x" * 65536 and "stdout_truncated" not in answer
    assert answer["stderr"] == "y" * 65536 and answer["stderr_truncated"] is True


def test_run_python_result_output_and_vars(client: Client) -> None:
    vars_ = {"x": 1, "my-key": 2, "result": 3, "output": 4}
    source = (
        "output = [x, input['my-key'], input['result'], 'my-key' in globals(), "
        "'result' in globals()]"
    )
    # `result` and `output` are not injected; `output` is read back when `result` is unset
    assert run_python(client, source, vars=vars_)["result"] == [1, 2, 3, False, False]
    assert run_python(client, "output = 'o'\nresult = 'r'")["result"] == "r"  # result wins
    assert run_python(client, "y = 1") == {"result": None, "stdout": "", "stderr": ""}
    unserialisable = run_python(client, "result = {1, 2}")
    assert unserialisable["result"] is None
    assert "not JSON-serialisable" in unserialisable["stderr"]


def test_run_python_timeout(client: Client) -> None:
    answer = run_python(
        client, "import time\nprint('tick', flush=True)\ntime.sleep(30)", timeout_seconds=1
    )
    assert answer["result"] is None and answer["stdout"] == "tick\n"
    assert answer["stderr"] == "Killed: the run exceeded timeout_seconds (1 s).\n"


def test_run_python_has_512_mb_and_no_network(client: Client, gateway: GatewayThread) -> None:
    big = "x = b'x' * (700 * 1024 * 1024)\nresult = len(x)"
    answer = run_python(client, big, timeout_seconds=30)
    assert answer["result"] is None
    killed = "Killed: the code used more memory than its limit (512 MB).\n"
    assert answer["stderr"] == killed or "MemoryError" in answer["stderr"], answer
    assert code_run(client, code=big + "\nprint(result)")["output"] == "734003200\n"  # 1 GiB
    source = (
        "import errno, socket\ntry:\n"
        f"    socket.create_connection(('127.0.0.1', {gateway.port}), timeout=2).close()\n"
        "    result = 'connected'\n"
        "except OSError as exc:\n    result = errno.errorcode.get(exc.errno, repr(exc))\n"
    )
    # refused: nothing listens on the sandbox's own loopback; unreachable: no loopback at all
    assert run_python(client, source)["result"] in ("ECONNREFUSED", "ENETUNREACH")


def _files_over_96_kib() -> dict[str, str]:
    return {"main.py": "result = 1", "a.txt": "a" * 60 * KiB, "b.txt": "b" * 40 * KiB}


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({}, "invalid_request", "params"),
        ({"params": {}}, "invalid_request", "params.source"),
        ({"params": {"source": ""}}, "invalid_request", "params.source"),
        ({"params": {"source": "#" * 50_001}}, "invalid_request", "params.source"),
        ({"params": {"source": 5}}, "invalid_request", "params.source"),
        (
            {"params": {"source": "1", "files": {"a.py": ""}, "entrypoint": "a.py"}},
            "conflicting_fields",
            "params.files",
        ),
        (
            {"params": {"source": "1", "entrypoint": "a.py"}},
            "conflicting_fields",
            "params.entrypoint",
        ),
        ({"params": {"files": {"a.py": "1"}}}, "invalid_request", "params.entrypoint"),
        (
            {"params": {"files": {"a.py": "1"}, "entrypoint": "b.py"}},
            "invalid_request",
            "params.entrypoint",
        ),
        ({"params": {"files": {}, "entrypoint": "a.py"}}, "invalid_request", "params.files"),
        (
            {"params": {"files": {f"f{i}.py": "" for i in range(65)}, "entrypoint": "f0.py"}},
            "invalid_request",
            "params.files",
        ),
        (
            {"params": {"files": {"a.py": "#" * (64 * KiB + 1)}, "entrypoint": "a.py"}},
            "invalid_request",
            'params.files["a.py"]',
        ),
        (
            {"params": {"files": _files_over_96_kib(), "entrypoint": "main.py"}},
            "invalid_request",
            "params.files",
        ),
        (
            {"params": {"files": {"../a.py": ""}, "entrypoint": "../a.py"}},
            "invalid_path",
            'params.files["../a.py"]',
        ),
        (
            {"params": {"files": {"/a.py": ""}, "entrypoint": "/a.py"}},
            "invalid_path",
            'params.files["/a.py"]',
        ),
        (
            {"params": {"source": "1", "timeout_seconds": 0}},
            "invalid_request",
            "params.timeout_seconds",
        ),
        (
            {"params": {"source": "1", "timeout_seconds": 31}},
            "invalid_request",
            "params.timeout_seconds",
        ),
        (
            {"params": {"source": "1", "timeout_seconds": "5"}},
            "invalid_request",
            "params.timeout_seconds",
        ),
        ({"params": {"source": "1", "timeout": 5}}, "invalid_request", "params.timeout"),
        ({"type": "code.run_node", "params": {"source": "1"}}, "invalid_request", "type"),
        ({"input": {"vars": []}, "params": {"source": "1"}}, "invalid_request", "input.vars"),
        ({"input": [], "params": {"source": "1"}}, "invalid_request", "input"),
        (
            {"params": {"archive_file_id": "f_1", "source": "1"}},
            "conflicting_fields",
            "params.archive_file_id",
        ),
        ({"params": {"archive_file_id": "f_1"}}, "archive_mode_disabled", "params.archive_file_id"),
        (
            {"params": {"archive_file_id": "f_1", "entrypoint": "src/main.py"}},
            "archive_mode_disabled",
            "params.archive_file_id",
        ),
    ],
)
def test_run_python_invalid_requests_are_validation_errors(
    local_client: Client, body: dict[str, Any], code: str, field: str
) -> None:
    status = 403 if code == "archive_mode_disabled" else 400
    response = local_client.request("POST", "/v1/tools/run_python", body)
    assert_error(response, status, code, field=field)


# --- code_exec ----------------------------------------------------------------------------


def test_code_exec_manual_example_without_the_project_folder(client: Client) -> None:
    code = "import json, pathlib\nprint(json.loads(pathlib.Path('package.json').read_text())['version'])"
    answer = tool(client, "code_exec", {"code": code})
    assert answer["success"] is False and answer["exit_code"] == 1
    lines = answer["output"].splitlines()
    assert lines and all(line.startswith("[stderr] ") for line in lines), answer
    assert "FileNotFoundError" in lines[-1]


def test_code_exec_manual_example_counting_to_five(client: Client) -> None:
    code = "import time\nfor i in range(5):\n    print(i); time.sleep(1)"
    answer = tool(client, "code_exec", {"code": code, "timeout": 120})
    assert answer == {"success": True, "exit_code": 0, "output": "0\n1\n2\n3\n4\n"}


def test_code_exec_prefixes_stderr_lines_in_arrival_order(client: Client) -> None:
    code = (
        "import sys, time\n"
        "def out(stream, text):\n"
        "    stream.write(text); stream.flush(); time.sleep(0.3)\n"
        "out(sys.stdout, 'out1\\n')\n"
        "out(sys.stderr, 'e1\\ne2\\n')\n"
        "out(sys.stdout, 'partial')\n"
        "out(sys.stderr, 'x\\n')\n"
        "raise ValueError('boom')\n"
    )
    answer = tool(client, "code_exec", {"code": code})
    assert answer["success"] is False and answer["exit_code"] == 1
    output = answer["output"]
    assert output.startswith("out1\n[stderr] e1\n[stderr] e2\npartial\n[stderr] x\n"), output
    assert output.endswith("[stderr] ValueError: boom\n")
    rest = output.split("[stderr] x\n", 1)[1].splitlines()
    assert all(line.startswith("[stderr] ") for line in rest)


def test_code_exec_no_output_timeout_and_exit_codes(client: Client) -> None:
    assert tool(client, "code_exec", {"code": "x = 1"}) == {
        "success": True,
        "exit_code": 0,
        "output": "(no output)",
    }
    timed_out = tool(
        client,
        "code_exec",
        {"code": "print('lost', flush=True)\nimport time\ntime.sleep(30)", "timeout": 0},
    )
    assert timed_out == {
        "success": False,
        "error": "timeout",
        "output": "Code execution timed out after 1s",
    }
    # a non-numeric timeout falls back to 30 s, an excessive one to 300: never a 400
    answer = tool(client, "code_exec", {"code": "import sys\nsys.exit(4)", "timeout": "soon"})
    assert answer == {"success": False, "exit_code": 4, "output": "(no output)"}
    answer = tool(client, "code_exec", {"code": "import sys\nsys.exit('bye')", "timeout": 10_000})
    assert answer == {"success": False, "exit_code": 1, "output": "[stderr] bye\n"}


def test_code_exec_background_returns_a_task_id(client: Client) -> None:
    response = client.request(
        "POST", "/v1/tools/code_exec", {"code": "print('detached')", "background": True}
    )
    assert response.status == 202, response.body
    answer = response.json()
    assert set(answer) == {"task_id"}
    task_id = answer["task_id"]
    assert response.headers["Location"] == f"/v1/runs/{task_id}"
    record = poll_run(client, task_id)
    assert record["id"] == task_id and record["status"] == "succeeded"
    assert record["stdout"] == "detached\n"


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({}, 400, "invalid_request", "code"),
        ({"code": 5}, 400, "invalid_request", "code"),
        ({"code": "1", "timeout_seconds": 5}, 400, "invalid_request", "timeout_seconds"),
        ({"code": "1", "background": "yes"}, 400, "invalid_request", "background"),
        ({"code": "1", "working_dir": "proj"}, 403, "forbidden", "working_dir"),
        ({"code": "1", "working_dir": ""}, 400, "invalid_path", "working_dir"),
    ],
)
def test_code_exec_invalid_requests(
    local_client: Client, body: dict[str, Any], status: int, code: str, field: str
) -> None:
    response = local_client.request("POST", "/v1/tools/code_exec", body)
    assert_error(response, status, code, field=field)


@pytest.mark.parametrize(
    ("value", "background", "expected"),
    [
        (0, False, 1),
        (-5, False, 1),
        (0.2, False, 1),
        (10_000, False, 300),
        (float("inf"), False, 300),
        (2.5, False, 2.5),
        ("45", False, 45),
        ("abc", False, 30),
        (True, False, 30),
        ([1], False, 30),
        (float("nan"), False, 30),
        (None, False, 30),
        (None, True, 300),
        (20, True, 20),
    ],
)
def test_code_exec_timeout_clamp(value: Any, background: bool, expected: float) -> None:
    assert exec_timeout(value, background) == expected


CALLER = Principal("u", "user")


def test_code_exec_detached_default_and_operator_ceiling() -> None:
    policy = part_config(RequestPolicy)
    assert parse_code_exec({"code": "1", "background": True}, policy, CALLER).request.timeout == 300
    assert parse_code_exec({"code": "1"}, policy, CALLER).request.timeout == 30
    lower = part_config(RequestPolicy, max_timeout=60)
    assert parse_code_exec({"code": "1", "timeout": 10_000}, lower, CALLER).request.timeout == 60


# --- code_exec working_dir: workspaces, users and admins ---------------------------------

USER_TOKEN = "user-" + secrets.token_hex(12)
ADMIN_TOKEN = "admin-" + secrets.token_hex(12)


@pytest.fixture
def workspaces(backend_name: str) -> Iterator[tuple[GatewayThread, Path]]:
    root = Path(tempfile.mkdtemp(prefix="tooltest-"))
    tokens = write_tokens(root, {USER_TOKEN: ("alice", "user"), ADMIN_TOKEN: ("root", "admin")})
    (root / "ws").mkdir()
    server = start_gateway(backend_name, workspaces=root / "ws", tokens=tokens)
    try:
        yield server, root / "ws"
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_code_exec_working_dir_rules(workspaces: tuple[GatewayThread, Path]) -> None:
    server, ws = workspaces
    alice = server.client(USER_TOKEN)
    home = ws / "alice"
    (home / "project").mkdir(parents=True)
    (home / "project" / "package.json").write_text('{"version": "1.2.3"}')
    (home / "data.csv").write_text("ab\ncde\n")
    example = "import json, pathlib\nprint(json.loads(pathlib.Path('package.json').read_text())['version'])"
    answer = tool(alice, "code_exec", {"code": example, "working_dir": "project"})
    assert answer == {"success": True, "exit_code": 0, "output": "1.2.3\n"}
    # an absolute path outside the workspace is silently replaced by its root
    example = "print(sum(len(l) for l in open('data.csv')))"
    answer = tool(alice, "code_exec", {"code": example, "working_dir": "/home/user/project"})
    assert answer == {"success": True, "exit_code": 0, "output": "7\n"}
    assert_error(
        alice.request("POST", "/v1/tools/code_exec", {"code": "1", "working_dir": "../bob"}),
        400,
        "invalid_path",
        field="working_dir",
    )
    admin = server.client(ADMIN_TOKEN)
    assert_error(
        admin.request(
            "POST", "/v1/tools/code_exec", {"code": "1", "working_dir": "/home/user/project"}
        ),
        403,
        "forbidden",
        field="working_dir",
    )
    for name in ("code_run", "run_python", "code_exec"):
        unauthenticated = server.client().request("POST", f"/v1/tools/{name}", {})
        assert unauthenticated.status == 401


# --- the pure pieces ----------------------------------------------------------------------


def test_prefix_stderr_keeps_prefixes_at_line_starts() -> None:
    chunks = [("stdout", "a"), ("stderr", "b\nc"), ("stderr", "d\n"), ("stdout", "e\n")]
    assert prefix_stderr(chunks) == "a\n[stderr] b\n[stderr] cd\ne\n"
    assert prefix_stderr([("stderr", "x"), ("stdout", "y")]) == "[stderr] x\ny"
    assert prefix_stderr([("stderr", "\n\n")]) == "[stderr] \n[stderr] \n"
    assert prefix_stderr([]) == ""


def test_traceback_text_and_cuts() -> None:
    assert traceback_text({"ename": "SystemExit", "evalue": "3"}) == ""
    assert traceback_text({"ename": "SystemExit", "evalue": "None"}) == ""
    assert traceback_text({"ename": "SystemExit", "evalue": "bye"}) == "bye\n"
    error = {"ename": "E", "traceback": ["\x1b[31mE\x1b[39m: boom"]}
    assert traceback_text(error) == "E: boom\n"
    assert cut_bytes("é" * 3, 3) == ("é", True)
    assert cut_bytes("abc", 3) == ("abc", False)
    assert cut_output("x" * 50_000) == ("x" * 50_000, False)
    assert cut_output("a" * 10_000 + "b" + "c" * 40_000) == ("a" * 10_000 + "c" * 40_000, True)
    record = RunRecord(id="run_x", language="python", timed_out=True)
    record.outputs = [{"output_type": "error", "ename": "KeyboardInterrupt", "traceback": ["K"]}]
    assert program_chunks(record) == []


def test_run_python_vendored_dependencies_from_an_uploaded_archive(backend_name: str) -> None:
    """The manual's "Vendored dependencies": an archive with a vendor folder on sys.path."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("vendor/tinylib.py", "def shout(s):\n    return s.upper() + '!'\n")
        archive.writestr(
            "src/main.py",
            "import sys\nsys.path.insert(0, 'vendor')\nimport tinylib\nresult = tinylib.shout(word)\n",
        )
    server = start_gateway(backend_name, allow_uploads=True)
    try:
        client = server.client()
        upload = client.request(
            "POST",
            "/v1/uploads",
            raw=buffer.getvalue(),
            headers={"Content-Type": "application/zip"},
        )
        assert upload.status == 201, upload.body
        body = {
            "input": {"vars": {"word": "hi"}},
            "params": {"archive_file_id": upload.json()["id"], "entrypoint": "src/main.py"},
        }
        assert tool(client, "run_python", body)["result"] == "HI!"
        body["params"]["entrypoint"] = "src/missing.py"
        missing = tool(client, "run_python", body)
        assert missing["result"] is None and "missing.py" in missing["stderr"]
    finally:
        server.stop()
