"""`gateway.client`: `GatewayClient` and `AsyncGatewayClient` against a real gateway (local
backend: the client only speaks HTTP and WebSocket). Every call returns its model, every
error answer is raised as its typed error with the API's code, message, field and
Retry-After, and `stream_run` yields a run's events in order and cancels it when left.
(tests/test_client_typed.py: the typed record, the blocking client's stream, `wait`.)"""

from __future__ import annotations

import asyncio
import email.utils
import http.server
import io
import secrets
import sqlite3
import threading
import time
import zipfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import gateway.client
from gateway.client import (
    AsyncGatewayClient,
    AsyncRunStream,
    Forbidden,
    GatewayClient,
    GatewayError,
    InvalidRequest,
    NotebookResult,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
    Unreachable,
)
from gateway.client.refusals import parse_retry_after
from gateway.models.answers import Health, RunAccepted, Upload
from gateway.models.listing import RunList
from gateway.models.record import RunRecord
from gateway.models.stream import (
    AcceptedEvent,
    CellFinishedEvent,
    CellStartedEvent,
    DoneEvent,
    OutputEvent,
)
from tests.api import code_cell_json, notebook_json
from tests.conftest import start_gateway
from tests.postgres import Server
from tests.stream_client import connect
from tests.support import GatewayThread, free_port, serving, wait_for

T = TypeVar("T")

LIVE = "import time\nprint('first', flush=True)\ntime.sleep(120)"  # cannot end on its own
NOTEBOOK = notebook_json(code_cell_json("a", "x = 3"), code_cell_json("b", "print(x * 2)"))


def url_of(server: GatewayThread) -> str:
    return f"http://127.0.0.1:{server.port}"


def run_async(main: Callable[[], Awaitable[T]]) -> T:
    async def wrapped() -> T:
        return await main()

    return asyncio.run(wrapped())


@pytest.fixture
def api(local_gateway: GatewayThread) -> Iterator[GatewayClient]:
    with GatewayClient(url_of(local_gateway)) as client:
        yield client


def public(record: RunRecord) -> dict[str, Any]:
    return record.to_json()


# --- the public surface -------------------------------------------------------------------


def test_public_surface_is_declared() -> None:
    assert set(gateway.client.__all__) == {
        "DEFAULT_TIMEOUT",
        "AsyncGatewayClient",
        "GatewayClient",
        "RunStream",
        "AsyncRunStream",
        "StreamEvent",
        "TypedRunRecord",
        "TypedRunList",
        "Session",
        "AsyncSession",
        "SnapshotGone",
        "SnapshotElsewhere",
        "FilesGone",
        "QuotaExceeded",
        "RunOptions",
        "NotebookOptions",
        "NotebookResult",
        "FileSpec",
        "ListQuery",
        "GatewayError",
        "InvalidRequest",
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "PayloadTooLarge",
        "RateLimited",
        "Unavailable",
        "ServerError",
        "Unreachable",
        "UnexpectedAnswer",
        "returned_files",
        "run_charts",
        "run_error",
    }
    for name in gateway.client.__all__:
        assert hasattr(gateway.client, name), name
    errors = [getattr(gateway.client, name) for name in gateway.client.__all__]
    errors = [e for e in errors if isinstance(e, type) and issubclass(e, Exception)]
    assert len(errors) == 15 and all(issubclass(e, GatewayError) for e in errors)


def test_the_two_clients_offer_the_same_calls() -> None:
    def calls(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("_")}

    sync, asynchronous = calls(GatewayClient), calls(AsyncGatewayClient)
    assert sync - {"close"} == asynchronous - {"aclose"}
    assert {"stream_run", "stream_notebook", "wait"} <= sync


def test_a_bad_url_is_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        GatewayClient("ftp://example")
    with pytest.raises(ValueError, match="http"):
        AsyncGatewayClient("127.0.0.1:8888")


def test_the_stream_address_follows_the_gateways() -> None:
    assert GatewayClient("http://h:1/").stream_url == "ws://h:1/v1/stream"
    assert AsyncGatewayClient("https://h/gw").stream_url == "wss://h/gw/v1/stream"


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), ("0", 0.0), ("2.5", 2.5), ("soon", None), ("-3", None), ("", None)],
)
def test_retry_after_in_seconds(header: str, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds


def test_retry_after_as_an_http_date() -> None:
    """RFC 9110 allows a date too (a proxy in front of the gateway may send one)."""
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    seconds = parse_retry_after(later)
    assert seconds is not None and 100 < seconds <= 120
    assert parse_retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0


# --- calls and their models ---------------------------------------------------------------


def test_sync_calls_return_the_models(api: GatewayClient) -> None:
    record = api.run("print(6 * 7)\nresult = 'r'", timeout=20)
    assert isinstance(record, RunRecord)
    assert (record.status, record.stdout, record.result) == ("succeeded", "42\n", "r")
    assert record.id.startswith("run_") and record.success
    assert public(api.get_run(record.id)) == public(record)
    notebook = api.notebook(record.id)
    assert notebook["nbformat"] == 4
    assert "".join(notebook["cells"][0]["source"]) == "print(6 * 7)\nresult = 'r'"
    bash = api.run("echo $GREETING", language="bash", env={"GREETING": "hi"})
    assert (bash.language, bash.stdout) == ("bash", "hi\n")
    with_files = api.run(
        "print(open('in.txt').read())",
        files=[{"path": "in.txt", "content": "from a file"}],
        return_files=["in.txt"],
    )
    assert with_files.stdout == "from a file\n"
    [returned] = with_files.files
    assert (returned.path, returned.size) == ("in.txt", len("from a file"))
    assert gateway.client.returned_files(with_files) == [returned]  # the deprecated way
    health = api.health()
    assert isinstance(health, Health) and health.status == "ok" and health.version
    assert "gateway_" in api.metrics()
    assert api.openapi()["openapi"].startswith("3.1")


def test_async_calls_return_the_models(local_gateway: GatewayThread) -> None:
    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            record = await client.run("print(6 * 7)\nresult = [1, 2]", timeout=20)
            assert isinstance(record, RunRecord)
            assert (record.status, record.stdout, record.result) == ("succeeded", "42\n", [1, 2])
            assert public(await client.get_run(record.id)) == public(record)
            notebook = await client.notebook(record.id)
            assert "".join(notebook["cells"][0]["outputs"][0]["text"]) == "42\n"
            health = await client.health()
            assert isinstance(health, Health) and health.status == "ok"
            assert "gateway_" in await client.metrics()
            assert (await client.openapi())["openapi"].startswith("3.1")

    run_async(main)


def test_a_failing_run_is_a_record_with_its_error(api: GatewayClient) -> None:
    record = api.run("print('before')\nraise KeyError('k')")
    assert (record.status, record.exit_code, record.stdout) == ("failed", 1, "before\n")
    error = record.error
    assert error is not None and error.ename == "KeyError" and error.traceback
    assert gateway.client.run_error(record) == error  # the deprecated way
    chart = api.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    [image] = chart.charts
    assert image.mime == "image/png" and image.spec is not None and image.spec.type == "line"
    assert gateway.client.run_charts(chart) == [image]


def test_background_runs_start_and_cancel(api: GatewayClient, local_gateway: GatewayThread) -> None:
    accepted = api.start(LIVE)
    assert isinstance(accepted, RunAccepted) and accepted.status in ("queued", "running")
    record = api.cancel(accepted.id)
    assert (record.status, record.kill_reason) == ("cancelled", "cancelled")

    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            accepted = await client.start(LIVE)
            record = await client.cancel(accepted.id)
            assert (record.id, record.status) == (accepted.id, "cancelled")

    run_async(main)


def test_notebooks_replay_with_and_without_options(
    api: GatewayClient, local_gateway: GatewayThread
) -> None:
    for answer in (api.run_notebook(NOTEBOOK), api.run_notebook(NOTEBOOK, timeout=20)):
        assert isinstance(answer, NotebookResult) and isinstance(answer.run, RunRecord)
        assert answer.run.status == "succeeded" and answer.run.stdout == "6\n"
        assert answer.notebook["cells"][1]["outputs"][0]["text"] == "6\n"

    async def main() -> NotebookResult:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            return await client.run_notebook(NOTEBOOK, allow_errors=False, cell_timeout=10)

    assert run_async(main).run.stdout == "6\n"


# --- typed errors from real answers -------------------------------------------------------


def test_400_is_invalid_request_with_its_field(api: GatewayClient) -> None:
    with pytest.raises(InvalidRequest) as caught:
        api.run("1", language="cobol")
    error = caught.value
    assert (error.status, error.code, error.field) == (400, "unsupported_language", "language")
    assert "python" in error.message and "unsupported_language" in str(error)
    with pytest.raises(InvalidRequest) as caught:
        api.run("1", files=[{"path": "/etc/passwd", "content": ""}])
    assert (caught.value.code, caught.value.field) == ("invalid_path", "files[0].path")
    with pytest.raises(InvalidRequest) as caught:
        api.run_notebook({"nbformat": 4, "nbformat_minor": 5, "cells": []})
    assert caught.value.code == "invalid_request"


def test_404_and_403(api: GatewayClient) -> None:
    with pytest.raises(NotFound) as caught:
        api.get_run("run_0000")
    assert (caught.value.status, caught.value.code) == (404, "not_found")
    with pytest.raises(NotFound):
        api.cancel("run_0000")
    with pytest.raises(Forbidden) as forbidden:
        api.upload(b"PK", filename="a.zip")  # uploads are off on this gateway
    assert (forbidden.value.status, forbidden.value.code) == (403, "archive_mode_disabled")


def test_no_answer_is_unreachable() -> None:
    address = f"http://127.0.0.1:{free_port()}"
    with GatewayClient(address, timeout=5) as client, pytest.raises(Unreachable) as caught:
        client.health()
    assert (caught.value.status, caught.value.code) == (0, "unreachable")
    assert isinstance(caught.value.__cause__, Exception)  # httpx2's, kept as the cause

    async def main() -> None:
        async with AsyncGatewayClient(address, timeout=5) as client:
            with pytest.raises(Unreachable):
                await client.run("1")
            with pytest.raises(Unreachable):
                async for _ in client.stream_run("1"):
                    pass

    run_async(main)


class NotAGateway(http.server.BaseHTTPRequestHandler):
    """What may answer in a gateway's place: a proxy's HTML pages."""

    def do_GET(self) -> None:
        status = 502 if self.path.startswith("/v1/runs") else 200
        body = b"<html><body>Bad gateway</body></html>"
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_an_answer_that_is_not_the_apis() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotAGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with GatewayClient(f"http://127.0.0.1:{server.server_address[1]}") as client:
            with pytest.raises(UnexpectedAnswer) as unexpected:
                client.health()
            assert unexpected.value.status == 200 and "Health" in unexpected.value.message
            with pytest.raises(ServerError) as bad:
                client.get_run("run_1")
            error = bad.value
            assert (error.status, error.code) == (502, "http_error")
            assert "Bad gateway" in error.message
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


TOKEN = "client-" + secrets.token_hex(16)
MAX_CODE_BYTES = 2000


@pytest.fixture(scope="module")
def guarded() -> Iterator[GatewayThread]:
    """A local gateway with a token, uploads on, one run and two streams per user at a
    time, and small code."""
    server = start_gateway(
        "local",
        users={TOKEN: ("alice", "user")},
        allow_uploads=True,
        max_runs_per_user=1,
        max_streams_per_user=2,
        max_code_bytes=MAX_CODE_BYTES,
    )
    yield from serving(server)


def no_streams_open(server: GatewayThread) -> bool:
    assert server.gateway.services is not None
    return not server.gateway.services.open_streams


def test_401_without_or_with_a_wrong_token(guarded: GatewayThread) -> None:
    url = url_of(guarded)
    with GatewayClient(url) as anonymous, pytest.raises(Unauthorized) as caught:
        anonymous.run("1")
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    with GatewayClient(url, token="wrong-" + TOKEN) as wrong, pytest.raises(Unauthorized):
        wrong.get_run("run_1")
    with GatewayClient(url) as anonymous:
        assert anonymous.health().status == "ok"  # public


def test_a_users_token_reads_health_but_not_metrics(guarded: GatewayThread) -> None:
    """Both tell of every tenant's activity: a user is told only whether the gateway serves."""
    with GatewayClient(url_of(guarded), token=TOKEN) as client:
        health = client.health()
        assert health.status == "ok" and health.kernels is None and health.pools is None
        with pytest.raises(Forbidden) as caught:
            client.metrics()
    assert (caught.value.status, caught.value.code) == (403, "forbidden")


def test_413_is_payload_too_large(guarded: GatewayThread) -> None:
    with GatewayClient(url_of(guarded), token=TOKEN) as client:
        with pytest.raises(PayloadTooLarge) as caught:
            client.run("#" * (MAX_CODE_BYTES + 1))
        assert (caught.value.status, caught.value.code) == (413, "payload_too_large")


def test_uploads_and_an_entrypoint(guarded: GatewayThread, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("main.py", "print('zipped')\n")
    path = tmp_path / "project.zip"
    path.write_bytes(buffer.getvalue())
    with GatewayClient(url_of(guarded) + "/", token=TOKEN) as client:
        upload = client.upload(path)
        assert isinstance(upload, Upload)
        assert (upload.entries, upload.unpacked_bytes) == (1, len("print('zipped')\n"))
        assert client.upload(buffer.getvalue(), filename="same.zip").entries == 1
        record = client.run(archive=upload.id, entrypoint="main.py")
        assert record.stdout == "zipped\n"
        with pytest.raises(InvalidRequest) as caught:
            client.upload(b"definitely not an archive", filename="x.zip")
        assert caught.value.status == 400 and caught.value.code.startswith("archive_")

    async def main() -> Upload:
        async with AsyncGatewayClient(url_of(guarded), token=TOKEN) as client:
            return await client.upload(path)

    assert run_async(main).entries == 1


def test_429_is_rate_limited_with_the_retry_after_sent(guarded: GatewayThread) -> None:
    with GatewayClient(url_of(guarded), token=TOKEN) as client:
        busy = client.start(LIVE)
        try:
            with pytest.raises(RateLimited) as caught:
                client.run("print(1)")
            answer = guarded.client(TOKEN).request("POST", "/v1/runs", {"code": "print(1)"})
            assert answer.status == 429
            error = caught.value
            assert (error.status, error.code) == (429, "capacity")
            assert error.retry_after == float(answer.headers["Retry-After"])

            async def over_the_stream() -> None:
                async with AsyncGatewayClient(url_of(guarded), token=TOKEN) as aclient:
                    with pytest.raises(RateLimited) as refused:
                        async for _ in aclient.stream_run("print(1)"):
                            pass
                    assert refused.value.code == "capacity"
                    assert refused.value.retry_after == float(answer.headers["Retry-After"])

            run_async(over_the_stream)
        finally:
            client.cancel(busy.id)
    assert wait_for(lambda: no_streams_open(guarded), timeout=30)


def test_503_is_unavailable_and_health_still_answers(postgres_server: Server) -> None:
    """The run store's database gone (a real fault): a run is 503 `store_unavailable` with
    Retry-After, and /v1/health's 503 is still a Health (`store_unavailable`)."""
    import psycopg

    with postgres_server.database() as dsn:
        server = GatewayThread(backend="local", store=dsn).start()
        try:
            with GatewayClient(url_of(server)) as client:
                assert client.health().store.ok
                with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
                    conn.execute(f"DROP DATABASE {dsn.rsplit('/', 1)[1]} WITH (FORCE)")
                health = client.health()
                assert (health.status, health.store.ok) == ("store_unavailable", False)
                with pytest.raises(Unavailable) as caught:
                    client.run("print(1)")
                error = caught.value
                assert (error.status, error.code) == (503, "store_unavailable")
                assert error.retry_after is not None and error.retry_after >= 1
        finally:
            server.stop()


@pytest.mark.logs_errors
def test_500_is_a_server_error() -> None:
    """A real fault: the run store's table dropped under the running gateway."""
    server = start_gateway("local")
    try:
        with GatewayClient(url_of(server)) as client:
            run_id = client.run("print(1)").id
            with sqlite3.connect(server.settings.data_dir / "runs.sqlite3") as db:
                db.execute("DROP TABLE runs")
            with pytest.raises(ServerError) as caught:
                client.get_run(run_id)
            assert (caught.value.status, caught.value.code) == (500, "internal")

        async def over_the_stream() -> None:
            async with AsyncGatewayClient(url_of(server)) as client:
                with pytest.raises(ServerError) as caught:
                    async for _ in client.stream_run("print(3)"):
                        pass
                assert caught.value.code == "internal"

        run_async(over_the_stream)
    finally:
        server.stop()


# --- streaming ----------------------------------------------------------------------------


def test_stream_events_come_in_order_with_the_record_last(local_gateway: GatewayThread) -> None:
    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            stream = client.stream_run("print('a')\nprint('b')", timeout=20)
            assert isinstance(stream, AsyncRunStream) and stream.id is None
            events = [event async for event in stream]
            assert isinstance(events[0], AcceptedEvent) and isinstance(events[-1], DoneEvent)
            assert all(isinstance(event, OutputEvent) for event in events[1:-1])
            assert {event.id for event in events} == {stream.id}
            text = "".join(
                str(event.output["text"]) for event in events if isinstance(event, OutputEvent)
            )
            assert text == "a\nb\n"
            assert stream.record is not None and stream.record.stdout == "a\nb\n"
            assert public(await client.get_run(events[0].id)) == public(stream.record)

    run_async(main)


def test_stream_output_arrives_while_running_and_cancel_ends_it(
    local_gateway: GatewayThread,
) -> None:
    """The first output comes while the run still runs (it cannot end by itself);
    `cancel()` then ends it and the iteration goes on to its `done` record."""

    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            async with client.stream_run(LIVE) as stream:
                kinds = []
                async for event in stream:
                    kinds.append(event.type)
                    if isinstance(event, OutputEvent):
                        assert event.output["text"] == "first\n"
                        assert stream.id is not None
                        assert (await client.get_run(stream.id)).status == "running"
                        await stream.cancel()
            assert kinds[0] == "accepted" and kinds[1] == "output" and kinds[-1] == "done"
            assert stream.record is not None
            assert (stream.record.status, stream.record.stdout) == ("cancelled", "first\n")

    run_async(main)


@pytest.mark.parametrize("how", ["async with", "async for"])
def test_leaving_the_stream_cancels_the_run(local_gateway: GatewayThread, how: str) -> None:
    """`break` out of the events: the connection closes and the gateway cancels the run
    (with `async with` when the block is left; without it when the stream is dropped)."""

    async def first_output(stream: AsyncRunStream) -> str:
        async for event in stream:
            if isinstance(event, OutputEvent):
                break
        assert stream.id is not None
        return stream.id

    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            if how == "async with":
                async with client.stream_run(LIVE) as stream:
                    run_id = await first_output(stream)
            else:
                run_id = await first_output(client.stream_run(LIVE))
            deadline = time.monotonic() + 60
            while (record := await client.get_run(run_id)).status != "cancelled":
                assert record.status == "running" and time.monotonic() < deadline, record
                await asyncio.sleep(0.1)
            assert record.kill_reason == "cancelled"

    run_async(main)


def test_stream_errors_are_typed(guarded: GatewayThread) -> None:
    """A refused handshake (401, 429 with Retry-After) and a refused run (400 with its
    field) raise the client's errors; a token in the header is accepted."""

    async def main() -> None:
        url = url_of(guarded)
        async with AsyncGatewayClient(url) as anonymous:
            with pytest.raises(Unauthorized) as caught:
                async for _ in anonymous.stream_run("print(1)"):
                    pass
            assert (caught.value.status, caught.value.code) == (401, "unauthorized")
        async with AsyncGatewayClient(url, token=TOKEN) as client:
            with pytest.raises(InvalidRequest) as invalid:
                async for _ in client.stream_run("1", language="cobol"):
                    pass
            assert (invalid.value.code, invalid.value.field) == ("unsupported_language", "language")
            with pytest.raises(PayloadTooLarge):
                async for _ in client.stream_run("#" * (MAX_CODE_BYTES + 1)):
                    pass
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            async with client.stream_run(LIVE) as first, connect(guarded.port, headers=bearer):
                assert isinstance(await anext(first), AcceptedEvent)  # two streams open
                with pytest.raises(RateLimited) as limited:  # a third: over the limit
                    await anext(client.stream_run("print(1)"))
                assert (limited.value.status, limited.value.code) == (429, "capacity")
                assert limited.value.retry_after is not None and limited.value.retry_after >= 1

    run_async(main)
    assert wait_for(lambda: no_streams_open(guarded), timeout=30)
    assert wait_for(guarded.idle, timeout=60)


# --- listing runs, and a notebook's events over the WebSocket -----------------------------


def test_list_runs_pages_newest_first_in_both_clients(
    api: GatewayClient, local_gateway: GatewayThread
) -> None:
    first, second = api.run("print(1)"), api.run("echo 2", language="bash")
    page = api.list_runs(limit=1)
    assert isinstance(page, RunList) and [s.id for s in page.runs] == [second.id]
    assert page.next is not None
    following = api.list_runs(limit=1, cursor=page.next)
    assert [s.id for s in following.runs] == [first.id]
    assert following.runs[0].first_line == "print(1)" and following.runs[0].exit_code == 0
    bash = api.list_runs(language="bash", limit=1)
    assert bash.runs[0].id == second.id and bash.runs[0].language == "bash"
    with pytest.raises(InvalidRequest) as refused:
        api.list_runs(cursor="not-a-cursor")
    assert refused.value.field == "cursor"

    async def main() -> RunList:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            with pytest.raises(InvalidRequest):
                await client.list_runs(limit=1000)
            return await client.list_runs(limit=2, status="succeeded")

    assert [s.id for s in run_async(main).runs] == [second.id, first.id]


def test_stream_notebook_yields_each_cells_events_and_the_executed_notebook(
    local_gateway: GatewayThread,
) -> None:
    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            async with client.stream_notebook(NOTEBOOK, cell_timeout=20) as stream:
                events = [event async for event in stream]
            kinds = [event.type for event in events]
            assert kinds == [
                "accepted",
                "cell_started",
                "cell_finished",
                "cell_started",
                "output",
                "cell_finished",
                "done",
            ]
            assert isinstance(events[1], CellStartedEvent) and events[1].cell_id == "a"
            assert isinstance(events[4], OutputEvent) and events[4].index == 1
            assert isinstance(events[5], CellFinishedEvent) and events[5].execution_count == 2
            assert stream.record is not None and stream.record.stdout == "6\n"
            assert stream.notebook is not None
            assert stream.notebook["cells"][1]["outputs"][0]["text"] == "6\n"
            with pytest.raises(InvalidRequest) as refused:
                async with client.stream_notebook({"nbformat": 4, "cells": 1}) as bad:
                    async for _ in bad:
                        pass
            assert refused.value.field == "notebook.cells"

    run_async(main)
