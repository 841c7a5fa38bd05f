"""JavaScript and TypeScript (Deno's Jupyter kernel behind kernels/deno/relay.py) on every
backend: the same record semantics as Python and bash (issue 11)."""

from __future__ import annotations

import base64
import os
import socket

import nbformat
import pytest

from tests import census
from tests.support import Client, GatewayThread

LANGUAGES = ("javascript", "typescript")


@pytest.fixture(params=LANGUAGES)
def language(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_console_log_makes_a_complete_record(client: Client, language: str) -> None:
    record = client.run(language=language, code='console.log("hello")')
    assert record["language"] == language
    assert (record["status"], record["exit_code"], record["success"]) == ("succeeded", 0, True)
    assert (
        record["stdout"] == "hello\n" and record["stderr"] == "" and record["output"] == "hello\n"
    )
    assert record["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "hello\n"}]
    assert record["error"] is None and record["result"] is None and record["notes"] == []
    assert record["usage"]["cpu_ms"] is not None and record["usage"]["peak_memory_bytes"] > 0


def test_streams_apart_and_interleaved_in_order(client: Client, language: str) -> None:
    code = (
        'console.log("out1");\n'
        'console.error("err1");\n'
        'process.stdout.write("out2 ");\n'
        'await Deno.stdout.write(new TextEncoder().encode("out3\\n"));\n'
        'process.stderr.write("err2\\n");\n'
        "void 0;\n"
    )
    record = client.run(language=language, code=code)
    assert record["stdout"] == "out1\nout2 out3\n"
    assert record["stderr"] == "err1\nerr2\n"
    assert record["output"] == "out1\nerr1\nout2 out3\nerr2\n"
    assert [o["name"] for o in record["outputs"]] == ["stdout", "stderr", "stdout", "stderr"]


def test_all_output_arrives_though_deno_sends_it_after_idle(client: Client) -> None:
    """Deno publishes prints after the cell's idle status: without the gateway's fence this
    run ends with a few of these lines, or none."""
    code = 'for (let i = 0; i < 3000; i++) console.log("line " + i);\nconsole.error("last");'
    record = client.run(language="javascript", code=code)
    assert record["stdout"] == "".join(f"line {i}\n" for i in range(3000))
    assert record["stderr"] == "last\n"


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [
        ('console.log("before");\nDeno.exit(3);\nconsole.log("after")', "failed", 3),
        ('console.log("before");\nprocess.exit(4)', "failed", 4),
        ('console.log("before");\nDeno.exit(0)', "succeeded", 0),
        ('console.log("before");\nDeno.exitCode = 5;\nDeno.exit()', "failed", 5),
        (
            'console.log("before");\nsetTimeout(() => Deno.exit(6), 50);\nawait new Promise(() => {})',
            "failed",
            6,
        ),
    ],
)
def test_exit_is_the_runs_exit_code_with_the_output_before_it(
    client: Client, code: str, status: str, exit_code: int
) -> None:
    record = client.run(language="typescript", code=code, timeout=20)
    assert (record["status"], record["exit_code"]) == (status, exit_code), record
    assert record["stdout"] == "before\n"
    assert not any("died" in note for note in record["notes"]), record["notes"]


def test_uncaught_error_is_exit_1_with_the_stack(client: Client, language: str) -> None:
    code = (
        'console.log("before");\nfunction inner() { throw new TypeError("bad value"); }\ninner();'
    )
    record = client.run(language=language, code=code)
    assert (record["status"], record["exit_code"]) == ("failed", 1)
    assert record["stdout"] == "before\n"
    error = record["error"]
    assert (error["ename"], error["evalue"]) == ("TypeError", "bad value")
    assert any("inner" in line for line in error["traceback"]), error
    assert record["outputs"][-1]["output_type"] == "error"


def test_a_tight_loop_is_killed_at_the_deadline_keeping_output_and_files(
    client: Client, language: str
) -> None:
    code = (
        'console.log("started");\n'
        'Deno.writeTextFileSync("progress.txt", "half");\n'
        "while (true) {}\n"
    )
    record = client.run(language=language, code=code, timeout=2, return_files=["progress.txt"])
    assert (record["status"], record["timed_out"], record["kill_reason"]) == (
        "timed_out",
        True,
        "timeout",
    )
    assert record["exit_code"] is None
    assert record["stdout"] == "started\n"
    assert record["files"][0]["content"] == "half"
    assert census.after_teardown() == []


def test_vars_are_globals_and_result_is_read_back(client: Client, language: str) -> None:
    code = "const result = [x + 1, input.x, input['not valid'], input.result, typeof result0];"
    record = client.run(
        language=language, code=code, vars={"x": 5, "not valid": 1, "result": 9, "result0": 2}
    )
    assert record["result"] == [6, 5, 1, 9, "number"], record
    assert record["outputs"] == []  # reading `result` back shows nothing


@pytest.mark.parametrize(
    ("code", "result"),
    [
        ("var result = {a: [1, 2.5, null]}", {"a": [1, 2.5, None]}),
        ("let output = 'o'", "o"),
        ("const output = 1; const result = 2", 2),
        ("globalThis.result = new Map() instanceof Map", True),
        ("const x = 1", None),
        ("let result; // declared, never set", None),
    ],
)
def test_result_then_output(client: Client, code: str, result: object) -> None:
    record = client.run(language="javascript", code=code)
    assert record["status"] == "succeeded", record
    assert record["result"] == result
    assert record["notes"] == []


def test_unserialisable_result_is_null_with_a_note(client: Client) -> None:
    record = client.run(language="typescript", code="const result = 10n")
    assert record["result"] is None and record["status"] == "succeeded"
    assert any("result" in note and "JSON" in note for note in record["notes"]), record


def test_env_reaches_the_kernel_and_gateway_env_does_not(client: Client, language: str) -> None:
    os.environ["GATEWAY_TEST_SECRET"] = "s3cret"
    try:
        record = client.run(
            language=language,
            code='const result = [Deno.env.get("GREETING"), Deno.env.get("GATEWAY_TEST_SECRET") ?? null, process.env.GREETING]',
            env={"GREETING": "hi"},
        )
    finally:
        del os.environ["GATEWAY_TEST_SECRET"]
    assert record["result"] == ["hi", None, "hi"]


def test_files_in_and_out(client: Client, language: str) -> None:
    files = [
        {"path": "data/in.txt", "content": "héllo"},
        {"path": "b.bin", "content": base64.b64encode(b"\x00\xff").decode(), "encoding": "base64"},
    ]
    code = (
        "const text = Deno.readTextFileSync('data/in.txt');\n"
        "const bytes = Array.from(Deno.readFileSync('b.bin'));\n"
        "Deno.mkdirSync('out', { recursive: true });\n"
        "Deno.writeTextFileSync('out/upper.txt', text.toUpperCase());\n"
        "const result = [text, bytes];\n"
    )
    record = client.run(language=language, code=code, files=files, return_files=["out/upper.txt"])
    assert record["result"] == ["héllo", [0, 255]], record
    assert record["files"] == [
        {"path": "out/upper.txt", "size": 6, "encoding": "utf-8", "content": "HÉLLO"}
    ]


def test_typescript_top_level_await_and_node_builtins(client: Client) -> None:
    code = (
        "import { basename } from 'node:path';\n"
        "interface Box<T> { value: T }\n"
        "const box: Box<number> = { value: await Promise.resolve(41) };\n"
        "const result: [number, string] = [box.value + 1, basename('/a/b/c.ts')];\n"
    )
    record = client.run(language="typescript", code=code)
    assert record["status"] == "succeeded", record
    assert record["result"] == [42, "c.ts"]


def test_typescript_entrypoint_runs_the_file(client: Client) -> None:
    files = [
        {
            "path": "main.ts",
            "content": "import { twice } from './lib.ts';\nconsole.log('main');\n(globalThis as any).result = twice((globalThis as any).x);\n",
        },
        {"path": "lib.ts", "content": "export const twice = (n: number): number => n * 2;\n"},
    ]
    record = client.run(language="typescript", entrypoint="main.ts", files=files, vars={"x": 21})
    assert record["status"] == "succeeded", record
    assert (record["stdout"], record["result"]) == ("main\n", 42)


def test_rich_display_outputs_are_mime_bundles(client: Client, language: str) -> None:
    code = (
        "await Deno.jupyter.display({ 'text/markdown': '**md**', 'text/plain': 'md' }, { raw: true });\n"
        "console.log('between');\n"
        "Deno.jupyter.html`<b>bold</b>`\n"
    )
    record = client.run(language=language, code=code)
    assert record["status"] == "succeeded", record
    kinds = [(o["output_type"], o.get("data", {})) for o in record["outputs"]]
    assert kinds[0] == ("display_data", {"text/markdown": "**md**", "text/plain": "md"})
    assert kinds[1] == ("stream", {})
    assert kinds[2][0] == "execute_result" and kinds[2][1]["text/html"] == "<b>bold</b>"


def test_no_network_for_deno_nor_the_sandbox(gateway: GatewayThread, client: Client) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        code = (
            "const out: string[] = [Deno.permissions.querySync({ name: 'net' }).state];\n"
            f"for (const port of [{listener.getsockname()[1]}, {gateway.port}]) {{\n"
            "  try { (await Deno.connect({ hostname: '127.0.0.1', port })).close(); out.push('connected'); }\n"
            "  catch (error) { out.push(error.name); }\n"
            "}\n"
            "out.push(Deno.permissions.requestSync({ name: 'net' }).state);\n"
            "const result = out;\n"
        )
        record = client.run(language="typescript", code=code, timeout=30)
    finally:
        listener.close()
    assert record["status"] == "succeeded", record
    assert record["result"] == ["prompt", "NotCapable", "NotCapable", "denied"], record
    # and below Deno's permissions, the sandbox: a subprocess has no route either
    bash = client.run(
        language="bash",
        code=f"exec 3<>/dev/tcp/127.0.0.1/{gateway.port} && echo connected || echo refused",
    )
    assert "connected" not in bash["stdout"], bash


def test_nothing_carries_over_between_runs(client: Client) -> None:
    first = client.run(
        language="javascript",
        code="globalThis.secret = 1; Deno.writeTextFileSync('left.txt', 'x'); Deno.env.set('LEFT', '1');",
    )
    assert first["status"] == "succeeded", first
    second = client.run(
        language="javascript",
        code="const result = [typeof secret, Array.from(Deno.readDirSync('.')).length, Deno.env.get('LEFT') ?? null]",
    )
    assert second["result"] == ["undefined", 0, None]


def test_the_runs_notebook_names_the_deno_kernel(client: Client, language: str) -> None:
    record = client.run(language=language, code="1 + 1")
    exported = client.request("GET", f"/v1/runs/{record['id']}/notebook")
    nb = nbformat.reads(exported.body.decode(), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "deno"
    assert nb.metadata.language_info.name == language
    [cell] = nb.cells
    assert [o.output_type for o in cell.outputs] == ["execute_result"]
    assert cell.outputs[0].data["text/plain"] == "2"


def test_bash_has_python_deno_and_git_on_its_path(client: Client) -> None:
    record = client.run(
        language="bash",
        code="python3 -c 'print(6 * 7)'\ndeno eval 'console.log(6 * 7)'\ngit --version | cut -d' ' -f1-2",
        timeout=60,
    )
    assert record["status"] == "succeeded", record
    assert record["stdout"] == "42\n42\ngit version\n", record
