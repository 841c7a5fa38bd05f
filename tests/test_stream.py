"""`WebSocket /v1/stream`: live outputs per run, many runs per connection, cancel, errors
that keep the connection usable, handshake auth and origin, and bounded memory for a
client that does not read."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import psutil
import pytest
import tornado.httpclient
import tornado.websocket

from tests.conftest import start_gateway
from tests.invalid_requests import RUN_FIELD_ERRORS
from tests.stream_client import Stream, connect, stream_text
from tests.support import GatewayThread, serving, wait_for
from tests.ws_client import RawStream

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend

TOKEN = "stream-test-token-0123456789"


# --- the event sequence -------------------------------------------------------------------

LIVE = {
    "python": "import time\nprint('first', flush=True)\ntime.sleep(120)",
    "bash": "echo first\nsleep 120",
    "javascript": "console.log('first');\nawait new Promise((r) => setTimeout(r, 120_000));",
}
QUICK = {
    "python": "print('first')\nprint('second')",
    "bash": "echo first; echo second",
    "javascript": "console.log('first');\nconsole.log('second');",
}


@pytest.mark.parametrize("language", ["python", "bash", "javascript"])
def test_events_come_in_order_and_output_arrives_while_running(
    gateway: GatewayThread, language: str
) -> None:
    """The first output arrives while the run is still running (no clock: the code cannot end
    on its own), then the run is cancelled; a short run's record joins its stream outputs."""
    client = gateway.client()

    async def main() -> None:
        async with connect(gateway.port) as stream:
            stream.send(
                {"type": "run", "ref": "live", "code": LIVE[language], "language": language}
            )
            accepted = await stream.until(lambda e: e["type"] == "accepted")
            first = await stream.until(lambda e: e["type"] == "output")
            run_id = accepted["id"]
            assert run_id.startswith("run_") and first["id"] == run_id
            assert first["output"] == {"output_type": "stream", "name": "stdout", "text": "first\n"}
            # live: the run is still going when its first output is here
            status = await asyncio.to_thread(
                lambda: client.request("GET", f"/v1/runs/{run_id}").json()["status"]
            )
            assert status == "running"
            stream.send({"type": "cancel", "id": run_id})
            done = await stream.done("live")
            events = [e for e in stream.events if e.get("ref") == "live"]
            kinds = [e["type"] for e in events]
            assert kinds[0] == "accepted" and kinds[-1] == "done", kinds
            assert set(kinds[1:-1]) == {"output"}, kinds
            assert all(e["id"] == run_id for e in events)
            assert done["run"]["status"] == "cancelled" and done["run"]["stdout"] == "first\n"

            events = await stream.run("quick", code=QUICK[language], language=language)
        record = events[-1]["run"]
        assert record["status"] == "succeeded"
        assert record["stdout"] == "first\nsecond\n" == stream_text(events)
        assert record["outputs"] == [
            {"output_type": "stream", "name": "stdout", "text": "first\nsecond\n"}
        ]

    asyncio.run(main())


def test_two_runs_on_one_connection_interleave(gateway: GatewayThread) -> None:
    """Both runs print, then wait: each printed before the other ended (no clock: neither
    can end on its own until it is cancelled)."""
    code = "import time\nfor i in range(2):\n    print('{0}', i, flush=True)\ntime.sleep(120)"

    async def main() -> None:
        async with connect(gateway.port) as stream:
            stream.send({"type": "run", "ref": "A", "code": code.format("A")})
            stream.send({"type": "run", "ref": 2, "code": code.format("B")})

            def printed(ref: Any) -> str:
                return stream_text([e for e in stream.events if e.get("ref") == ref])

            while printed("A") != "A 0\nA 1\n" or printed(2) != "B 0\nB 1\n":
                await stream.until(lambda e: e["type"] == "output")
            assert not [e for e in stream.events if e["type"] == "done"]  # both still running
            for ref in ("A", 2):
                accepted = next(
                    e for e in stream.events if e["type"] == "accepted" and e["ref"] == ref
                )
                stream.send({"type": "cancel", "id": accepted["id"]})
            await stream.done("A")
            await stream.done(2)
            events = stream.events
        a = [e for e in events if e["ref"] == "A"]
        b = [e for e in events if e["ref"] == 2]
        assert len(a) + len(b) == len(events)
        for mine, letter in ((a, "A"), (b, "B")):
            assert mine[0]["type"] == "accepted" and mine[-1]["type"] == "done"
            assert len({e["id"] for e in mine}) == 1
            assert stream_text(mine) == f"{letter} 0\n{letter} 1\n"
            assert mine[-1]["run"]["stdout"] == stream_text(mine)
            assert mine[-1]["run"]["status"] == "cancelled"
        assert a[0]["id"] != b[0]["id"]

    asyncio.run(main())


async def printed_then_sleeps(stream: Stream, ref: str | int, word: str) -> dict[str, Any]:
    """Start a run that prints `word`, then sleeps two minutes; its `accepted` event, once
    its output arrived."""
    code = f"import time\nprint({word!r}, flush=True)\ntime.sleep(120)"
    stream.send({"type": "run", "ref": ref, "code": code})
    accepted = await stream.until(lambda e: e["type"] == "accepted")
    await stream.until(lambda e: e["type"] == "output")
    return accepted


def test_cancel_ends_a_run_at_once(gateway: GatewayThread) -> None:
    async def main() -> None:
        async with connect(gateway.port) as stream:
            accepted = await printed_then_sleeps(stream, "c", "started")
            asked = time.monotonic()
            stream.send({"type": "cancel", "id": accepted["id"]})
            done = await stream.done("c", timeout=20)
        assert done["_t"] - asked < 5
        record = done["run"]
        assert record["status"] == "cancelled" and record["kill_reason"] == "cancelled"
        assert record["stdout"] == "started\n"

    asyncio.run(main())


def test_cancel_by_ref_before_the_kernel_is_ready(gateway: GatewayThread) -> None:
    async def main() -> None:
        async with connect(gateway.port) as stream:
            stream.send({"type": "run", "ref": "early", "code": "import time\ntime.sleep(120)"})
            stream.send({"type": "cancel", "ref": "early"})
            done = await stream.done("early", timeout=30)
        assert done["run"]["status"] == "cancelled"

    asyncio.run(main())


def test_closing_the_connection_cancels_its_runs(gateway: GatewayThread) -> None:
    async def main() -> str:
        async with connect(gateway.port) as stream:
            accepted = await printed_then_sleeps(stream, 1, "up")
        return str(accepted["id"])

    run_id = asyncio.run(main())
    client = gateway.client()
    assert wait_for(
        lambda: client.request("GET", f"/v1/runs/{run_id}").json()["status"] == "cancelled",
        timeout=15,
    ), client.request("GET", f"/v1/runs/{run_id}").json()
    assert client.request("GET", f"/v1/runs/{run_id}").json()["kill_reason"] == "cancelled"


def test_display_updates_and_clear_output(gateway: GatewayThread) -> None:
    code = (
        "from IPython.display import display, clear_output\n"
        "h = display('first', display_id=True)\n"
        "h.update('second')\n"
        "print('gone', flush=True)\n"
        "clear_output()\n"
        "print('kept')\n"
    )

    async def main() -> list[dict[str, Any]]:
        async with connect(gateway.port) as stream:
            return await stream.run("d", code=code)

    events = [e for e in asyncio.run(main()) if e["type"] == "output"]
    shown, updated, gone, cleared, kept = events
    assert shown["output"]["output_type"] == "display_data"
    assert shown["output"]["data"]["text/plain"] == "'first'"
    assert shown["display_id"] and "update" not in shown
    assert updated["display_id"] == shown["display_id"] and updated["update"] is True
    assert updated["output"]["data"]["text/plain"] == "'second'"
    assert gone["output"]["text"] == "gone\n"
    assert cleared["output"] == {"output_type": "clear_output"}
    assert kept["output"]["text"] == "kept\n"


def test_a_streamed_charts_output_is_slim_and_the_record_keeps_its_points(
    gateway: GatewayThread,
) -> None:
    """Issue 33, item 7, live: a chart's `output` event carries what its output in the
    record carries (`metadata.gateway` with the source and the title, docs/API.md
    `charts`), not the plotted points; the `done` event's record keeps them in `charts`
    (our kernel reads up to 1000 points a series, gateway/execution/charts.py)."""
    points = 5000
    code = (
        "import matplotlib.pyplot as plt\n"
        f"xs = list(range({points}))\n"
        "plt.plot(xs, [2 * x for x in xs]); plt.title('streamed'); plt.show()"
    )

    async def main() -> list[dict[str, Any]]:
        async with connect(gateway.port) as stream:
            return await stream.run("chart", code=code)

    events = asyncio.run(main())
    [done] = [e for e in events if e["type"] == "done"]
    record = done["run"]
    assert record["status"] == "succeeded", record["error"]
    [image] = [
        e for e in events if e["type"] == "output" and "image/png" in e["output"].get("data", {})
    ]
    assert image["output"]["metadata"]["gateway"] == {"source": "display", "title": "streamed"}
    assert '"series"' not in json.dumps(image)  # no plotted points anywhere in the event
    [recorded] = [o for o in record["outputs"] if "image/png" in o.get("data", {})]
    assert image["output"] == recorded
    [chart] = record["charts"]
    [series] = chart["spec"]["series"]
    assert series["y"] == [2 * x for x in range(1000)]


# --- errors keep the connection usable ----------------------------------------------------


def test_malformed_messages_get_error_events_and_the_connection_stays_usable(
    local_gateway: GatewayThread,
) -> None:
    async def main() -> None:
        async with connect(local_gateway.port) as stream:
            bad: list[tuple[Any, str, str | None]] = [
                ("not json", "invalid_request", None),
                (b"\x00binary", "invalid_request", None),
                ([1, 2], "invalid_request", None),
                ({"type": "nope"}, "invalid_request", "type"),
                ({"type": "cancel"}, "invalid_request", None),
                ({"type": "cancel", "id": "run_00000000000000000000"}, "not_found", None),
                ({"type": "run", "ref": {"a": 1}, "code": "1"}, "invalid_request", "ref"),
            ]
            bad += [
                ({"type": "run", "ref": f"R{i}", **body}, code, field)
                for i, (body, code, field) in enumerate(RUN_FIELD_ERRORS)
            ]
            for message, code, field in bad:
                stream.send(message)
                event = await stream.recv(10)
                assert event is not None and event["type"] == "error", (message, event)
                assert event["error"]["code"] == code, (message, event)
                if field is not None:
                    assert event["error"]["field"] == field, (message, event)
                if isinstance(message, dict) and isinstance(message.get("ref"), str):
                    assert event["ref"] == message["ref"]
                if isinstance(message, dict) and "id" in message:
                    assert event["id"] == message["id"]
                assert set(event) <= {"type", "ref", "id", "error", "_t"}
            events = await stream.run("ok", code="print(6 * 7)")
        assert events[-1]["run"]["stdout"] == "42\n"

    asyncio.run(main())


def test_a_run_over_capacity_gets_an_error_with_retry_after() -> None:
    server = start_gateway("local", max_runs_per_user=1)

    async def main() -> None:
        async with connect(server.port) as stream:
            stream.send({"type": "run", "ref": "long", "code": "import time\ntime.sleep(60)"})
            accepted = await stream.until(lambda e: e["type"] == "accepted")
            stream.send({"type": "run", "ref": "more", "code": "1"})
            error = await stream.until(lambda e: e["type"] == "error")
            assert error["ref"] == "more" and error["error"]["code"] == "capacity"
            assert isinstance(error["retry_after"], int) and error["retry_after"] >= 1
            stream.send({"type": "cancel", "id": accepted["id"]})
            assert (await stream.done("long"))["run"]["status"] == "cancelled"

    try:
        asyncio.run(main())
    finally:
        server.stop()


def test_a_message_over_the_size_cap_closes_the_connection() -> None:
    server = start_gateway("local", max_body_bytes=64 * 1024)

    async def main() -> None:
        async with connect(server.port) as stream:
            stream.send({"type": "run", "ref": "big", "code": "#" * 100_000})
            assert await stream.recv(10) is None
            assert stream.ws.close_code == 1009

    try:
        asyncio.run(main())
    finally:
        server.stop()


# --- handshake: token and origin ----------------------------------------------------------


@pytest.fixture(scope="module")
def secured() -> Any:
    yield from serving(
        start_gateway(
            "local", users={TOKEN: ("alice", "user")}, allowed_origins=("https://app.example",)
        )
    )


async def handshake_status(
    port: int, query: str = "", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    try:
        async with connect(port, query, headers) as stream:
            stream.send("{")
            event = await stream.recv(10)
            assert event is not None and event["error"]["code"] == "invalid_request"
            return 101, None
    except tornado.httpclient.HTTPClientError as exc:
        assert exc.response is not None
        assert exc.response.headers["Content-Type"].startswith("application/json")
        return exc.code, json.loads(exc.response.body)


def test_token_on_the_handshake(secured: GatewayThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        port = secured.port
        assert (await handshake_status(port, f"?token={TOKEN}"))[0] == 101
        assert (await handshake_status(port, headers={"Authorization": f"Bearer {TOKEN}"}))[
            0
        ] == 101
        status, body = await handshake_status(port)
        assert status == 401 and body["error"]["code"] == "unauthorized"
        status, body = await handshake_status(port, "?token=wrong-token-wrong-token")
        assert status == 401 and body["error"]["code"] == "unauthorized"

    asyncio.run(main())
    assert TOKEN not in caplog.text and "wrong-token-wrong-token" not in caplog.text
    assert "token=***" in caplog.text  # the access log shows the request, redacted


def test_origin_is_checked_against_the_allow_list(secured: GatewayThread) -> None:
    async def main() -> None:
        port = secured.port
        query = f"?token={TOKEN}"
        status, body = await handshake_status(port, query, {"Origin": "https://evil.example"})
        assert status == 403 and body["error"]["code"] == "forbidden"
        # a bad origin is refused before the token is even looked at
        status, _ = await handshake_status(port, headers={"Origin": "https://evil.example"})
        assert status == 403
        assert (await handshake_status(port, query, {"Origin": "https://app.example"}))[0] == 101
        same = {"Origin": f"http://127.0.0.1:{port}"}
        assert (await handshake_status(port, query, same))[0] == 101

    asyncio.run(main())


def test_single_user_mode_refuses_cross_origin_and_rebound_hosts(gateway: GatewayThread) -> None:
    async def main() -> None:
        port = gateway.port
        status, _ = await handshake_status(port, headers={"Origin": "http://evil.example"})
        assert status == 403
        # DNS rebinding: the browser thinks evil.example:port is the page's own origin
        rebound = {"Origin": f"http://evil.example:{port}", "Host": f"evil.example:{port}"}
        assert (await handshake_status(port, headers=rebound))[0] == 403
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            same = {"Origin": f"http://{host}", "Host": host}
            assert (await handshake_status(port, headers=same))[0] == 101

    asyncio.run(main())


# --- a client that does not read ----------------------------------------------------------


FLOOD = (
    "from IPython.display import display, HTML\n"
    "h = display(HTML('start'), display_id=True)\n"
    "chunk = 'x' * 200_000\n"
    "for i in range(280):\n"  # ~56 MB: under the 64 MB output limit, far over the outbox
    "    h.update(HTML(chunk + str(i)))\n"
    "print('flood done')\n"
)


def test_a_client_that_does_not_read_keeps_gateway_memory_bounded(
    gateway: GatewayThread,
) -> None:
    """~500 MB of display updates to a client that reads nothing until the run is over."""
    me = psutil.Process()
    client = RawStream(gateway.port, receive_buffer=16 * 1024)
    assert client.status == 101
    peak = baseline = me.memory_info().rss
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.05):
            peak = max(peak, me.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        client.send({"type": "run", "ref": "flood", "code": FLOOD, "timeout": 120})
        # wait (without reading) until the run is over on the gateway
        time.sleep(1)
        assert wait_for(gateway.idle, timeout=110)
        stop.set()
        sampler.join()
        growth = peak - baseline
        events = []
        while not events or events[-1]["type"] != "done":
            events.append(client.recv())
    finally:
        stop.set()
        client.close()
    kinds = [e["type"] for e in events]
    dropped = sum(e["dropped"] for e in events if e["type"] == "output_dropped")
    shown = kinds.count("output")
    print(f"rss growth {growth / 2**20:.0f} MiB; {shown} outputs sent, {dropped} dropped")
    # Unbounded buffering would hold every update (~200 kB each, 56 MB) until the client reads.
    assert growth < 45 * 2**20, f"gateway memory grew by {growth / 2**20:.0f} MiB"
    assert kinds[0] == "accepted" and kinds[-1] == "done"
    assert dropped > 200 and shown + dropped >= 280, (shown, dropped)
    record = events[-1]["run"]
    assert record["status"] == "succeeded" and record["stdout"] == "flood done\n"
    # the final record has the last state of the display
    assert record["outputs"][0]["data"]["text/html"].endswith("x279")


def test_a_run_over_the_stream_can_use_an_uploaded_archive() -> None:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("pkg/hello.py", "print('hello from the archive')\n")
    server = GatewayThread(backend="local", allow_uploads=True).start()
    try:
        upload = server.client().request(
            "POST",
            "/v1/uploads",
            raw=buffer.getvalue(),
            headers={"Content-Type": "application/zip"},
        )
        assert upload.status == 201, upload.body

        async def main() -> None:
            async with connect(server.port) as stream:
                events = await stream.run(
                    "a", archive=upload.json()["id"], entrypoint="pkg/hello.py"
                )
            assert events[-1]["run"]["stdout"] == "hello from the archive\n"

        asyncio.run(main())
    finally:
        server.stop()
