"""stdout and stderr come back in the order the program wrote them (issue 14): a run's `output`
and `outputs`, code_exec's `[stderr] ` lines, code_run's output, the WebSocket's events and
the page, for both kernels on every backend; caps keep the head and tail of that order. What the
surfaces make of one order (caps, tools, the WebSocket, the page) runs on one backend
(conftest.OneBackend)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import Any

import pytest

from tests.api import truncation_marker
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread
from tests.ws_client import open_stream

LANGUAGES = ("python", "bash", "javascript", "typescript")


def alternating(count: int) -> str:
    return "".join(f"o{i}\ne{i}\n" for i in range(count))


def alternating_code(language: str, count: int) -> str:
    if language == "python":
        return (
            "import sys\n"
            f"for i in range({count}):\n"
            "    print(f'o{i}')\n"
            "    print(f'e{i}', file=sys.stderr)"
        )
    if language == "bash":
        return f"for i in $(seq 0 {count - 1}); do echo o$i; echo e$i >&2; done"
    return (
        f"for (let i = 0; i < {count}; i++) {{ console.log(`o${{i}}`); console.error(`e${{i}}`); }}"
    )


def stream(name: str, text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": text}


def alternating_outputs(count: int) -> list[dict[str, Any]]:
    return [
        s for i in range(count) for s in (stream("stdout", f"o{i}\n"), stream("stderr", f"e{i}\n"))
    ]


def tool(client: Client, name: str, body: Any) -> Any:
    response = client.request("POST", f"/v1/tools/{name}", body)
    assert response.status == 200, (response.status, response.body[:2000])
    return response.json()


# --- the run record -----------------------------------------------------------------------


@pytest.mark.parametrize("language", LANGUAGES)
def test_alternating_writes_without_flush_keep_their_order(client: Client, language: str) -> None:
    record = client.run(code=alternating_code(language, 100), language=language)
    assert record["status"] == "succeeded", record
    assert record["output"] == alternating(100)
    # one stream output per change of stream, as nbformat would have it
    assert record["outputs"] == alternating_outputs(100)
    assert record["stdout"] == "".join(f"o{i}\n" for i in range(100))
    assert record["stderr"] == "".join(f"e{i}\n" for i in range(100))


JS_WARNING = "console.log('before');\nconsole.warn('warning: careful');\nconsole.log('after');"
WARNING = {
    "python": "import warnings\nprint('before')\nwarnings.warn('careful')\nprint('after')",
    "bash": "echo before\necho 'warning: careful' >&2\necho after",
    "javascript": JS_WARNING,
    "typescript": JS_WARNING,
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_warning_between_prints_stays_between_them(client: Client, language: str) -> None:
    record = client.run(code=WARNING[language], language=language)
    assert record["status"] == "succeeded", record
    outputs = record["outputs"]
    assert [o["name"] for o in outputs] == ["stdout", "stderr", "stdout"], outputs
    assert outputs[0]["text"] == "before\n" and outputs[2]["text"] == "after\n"
    assert "careful" in outputs[1]["text"]
    assert record["output"] == "before\n" + outputs[1]["text"] + "after\n"


JS_TRACEBACK = (
    "console.log('o1');\nconsole.error('e1');\nconsole.log('o2');\nthrow new Error('boom');"
)
TRACEBACK = {
    "python": (
        "import sys\nprint('o1')\nprint('e1', file=sys.stderr)\nprint('o2')\n"
        "raise ValueError('boom')"
    ),
    "bash": "echo o1\necho e1 >&2\necho o2\ncat /no/such/file",
    "javascript": JS_TRACEBACK,
    "typescript": JS_TRACEBACK,
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_error_comes_after_the_prints_before_it(client: Client, language: str) -> None:
    record = client.run(code=TRACEBACK[language], language=language)
    assert record["status"] == "failed", record
    outputs = record["outputs"]
    assert outputs[:3] == [
        stream("stdout", "o1\n"),
        stream("stderr", "e1\n"),
        stream("stdout", "o2\n"),
    ]
    assert len(outputs) == 4, outputs
    if language != "bash":
        assert outputs[3]["output_type"] == "error", outputs[3]
        assert "boom" in outputs[3]["evalue"]
        assert record["output"] == "o1\ne1\no2\n"
    else:
        assert outputs[3]["name"] == "stderr" and "/no/such/file" in outputs[3]["text"]
        assert record["output"] == "o1\ne1\no2\n" + outputs[3]["text"]


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_flood_of_alternating_writes_arrives_complete_and_in_order(
    client: Client, language: str
) -> None:
    count = 3000  # about 33 KB: well under the output cap, but 6000 changes of stream
    record = client.run(code=alternating_code(language, count), language=language, timeout=120)
    assert record["status"] == "succeeded", record
    assert not record["output_truncated"]
    assert record["output"] == alternating(count)
    assert record["outputs"] == alternating_outputs(count)


def test_python_single_characters_alternating_keep_their_order(client: Client) -> None:
    code = "import sys\nfor i in range(2000):\n    sys.stdout.write('o')\n    sys.stderr.write('e')"
    record = client.run(code=code, language="python", timeout=120)
    assert record["output"] == "oe" * 2000
    assert record["stdout"] == "o" * 2000 and record["stderr"] == "e" * 2000


def test_bash_a_line_after_a_flood_on_the_other_stream_keeps_its_place(client: Client) -> None:
    # a long run on one stream makes the kernel read it in bulk; the line on the other stream
    # must still land right after the flood and before what follows
    code = "seq 1 20000\necho done >&2\necho after\nseq 1 50 >&2\necho end"
    record = client.run(code=code, language="bash")
    numbers = "".join(f"{i}\n" for i in range(1, 20001))
    assert (
        record["output"]
        == numbers + "done\nafter\n" + "".join(f"{i}\n" for i in range(1, 51)) + "end\n"
    )
    assert [o["name"] for o in record["outputs"]] == ["stdout", "stderr"] * 2 + ["stdout"]


def test_bash_kernel_idles_after_a_flood(client: Client) -> None:
    # after a flood the quiet stream is gated; the kernel must still sleep, not spin, while
    # the cell goes on (CPU time, not wall time: a spinning loop burns it even on busy cores)
    quiet = client.run(code="sleep 3", language="bash")
    flood = client.run(code="seq 1 100000 >/dev/null; seq 1 100000; sleep 3", language="bash")
    assert flood["status"] == quiet["status"] == "succeeded"
    extra = flood["usage"]["cpu_ms"] - quiet["usage"]["cpu_ms"]
    assert extra < 700, (quiet["usage"], flood["usage"])


def test_bash_reopened_stderr_and_redirected_stderr_still_work(client: Client) -> None:
    # /dev/stderr reopens the stderr pipe (not in packet mode); exec 2>file takes stderr away
    code = "echo a\necho x >/dev/stderr\nexec 2>/dev/null\necho hidden >&2\necho b"
    record = client.run(code=code, language="bash")
    assert record["status"] == "succeeded", record
    assert record["stdout"] == "a\nb\n" and record["stderr"] == "x\n"
    assert record["output"] == "a\nx\nb\n"


@pytest.mark.one_backend
@pytest.mark.parametrize("language", LANGUAGES)
def test_caps_keep_the_head_and_tail_of_the_ordered_output(
    backend_name: str, language: str
) -> None:
    cap = 4096
    server = start_gateway(backend_name, stream_cap_bytes=cap)
    try:
        record = server.client().run(code=alternating_code(language, 2000), language=language)
    finally:
        server.stop()
    text = alternating(2000)
    head, tail = text[: cap // 2], text[len(text) - (cap - cap // 2) :]
    assert record["output_truncated"]
    assert record["output"] == head + truncation_marker(len(text) - cap) + tail
    # the outputs hold the same head and tail, each change of stream its own output
    assert "".join(o["text"] for o in record["outputs"]) == record["output"]
    first = record["outputs"][:10]
    assert first == alternating_outputs(5)


# --- the tools ----------------------------------------------------------------------------


@pytest.mark.one_backend
def test_code_exec_prefixes_exactly_the_stderr_lines(client: Client) -> None:
    code = (
        "import sys\nprint('o1')\nprint('e1', file=sys.stderr)\nprint('o2')\n"
        "print('e2', file=sys.stderr)\nprint('o3')"
    )
    answer = tool(client, "code_exec", {"code": code})
    assert answer["success"] is True, answer
    assert answer["output"] == "o1\n[stderr] e1\no2\n[stderr] e2\no3\n"


@pytest.mark.one_backend
@pytest.mark.parametrize("language", LANGUAGES)
def test_code_run_output_is_in_write_order(client: Client, language: str) -> None:
    answer = tool(
        client,
        "code_run",
        {"arguments": {"code": alternating_code(language, 20), "language": language}},
    )
    assert answer["result"]["output"] == alternating(20)


# --- live: the WebSocket and the page -----------------------------------------------------


async def _stream_events(port: int, language: str, code: str) -> list[dict[str, Any]]:
    async with open_stream(port) as ws:
        ws.write_message(
            json.dumps({"type": "run", "ref": "r", "code": code, "language": language})
        )
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] not in ("done", "error"):
            message = await asyncio.wait_for(ws.read_message(), 60)
            assert message is not None, f"connection closed; events so far: {events}"
            events.append(json.loads(message))
        return events


@pytest.mark.one_backend
@pytest.mark.parametrize("language", LANGUAGES)
def test_websocket_output_events_come_in_write_order(gateway: GatewayThread, language: str) -> None:
    code = alternating_code(language, 50)
    # a thread of its own: Playwright's sync API may hold an event loop in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        events = pool.submit(asyncio.run, _stream_events(gateway.port, language, code)).result()
    assert events[-1]["type"] == "done", events[-1]
    live = [(e["output"]["name"], e["output"]["text"]) for e in events if e["type"] == "output"]
    # however the kernel cut its messages, they add up to the ordered output, and no message
    # mixes up the order: joined per change of stream, they are the alternating lines
    merged: list[tuple[str, str]] = []
    for name, text in live:
        if merged and merged[-1][0] == name:
            merged[-1] = (name, merged[-1][1] + text)
        else:
            merged.append((name, text))
    assert merged == [(o["name"], o["text"]) for o in alternating_outputs(50)]
    assert events[-1]["run"]["outputs"] == alternating_outputs(50)


ON_THE_PAGE = {  # the page's own samples space their writes out: tighter tests
    "bash": "for i in 1 2 3; do echo o$i; echo e$i >&2; done",
    "javascript": "for (let i = 1; i <= 3; i++) { console.log(`o${i}`); console.error(`e${i}`); }",
    "typescript": "for (let i: number = 1; i <= 3; i++) { console.log(`o${i}`); console.error(`e${i}`); }",
}


@pytest.mark.one_backend
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_page_shows_streams_in_write_order(
    chromium_browser: Any, gateway: GatewayThread, language: str
) -> None:
    context = chromium_browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{gateway.port}/")
        page.wait_for_selector("body[data-ready=true]")
        page.select_option("#language", language)  # the editor switches to that sample
        if language in ON_THE_PAGE:
            # the editor's text replaced as a person would: select all, then type
            page.locator("#editor .cm-content").click()
            page.keyboard.press("Control+a")
            page.keyboard.insert_text(ON_THE_PAGE[language])
        page.locator("#run").click()
        page.wait_for_function(
            "() => ['succeeded', 'failed', 'error', 'killed']"
            ".includes(document.querySelector('#status').dataset.status)",
            timeout=120_000,
        )
        blocks = page.evaluate(
            "() => [...document.querySelectorAll('#outputs .stream')]"
            ".map((b) => [b.dataset.stream, b.textContent])"
        )
    finally:
        context.close()
    if language == "python":  # the page's own sample: a print, then a line on stderr
        assert blocks[:2] == [
            ["stdout", "hello from a fresh kernel\n"],
            ["stderr", "this goes to stderr\n"],
        ], blocks
    else:
        assert blocks == [
            [name, f"{letter}{i}\n"]
            for i in (1, 2, 3)
            for name, letter in (("stdout", "o"), ("stderr", "e"))
        ], blocks
