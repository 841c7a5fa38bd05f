"""The client's answers as its users meet them (issue 33): a record typed all the way down
(its error, charts and returned files as their models, its timestamps as datetimes), read
with the server's own models so that the two cannot drift; a notebook as nbformat's
`NotebookNode`; the blocking client's `stream_run` and `stream_notebook`, with the same
events as the async client's; and `wait(run_id)` for a background run. Against a real
gateway (local backend: the client only speaks HTTP and WebSocket)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
import time
import typing
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from pydantic import BaseModel

from gateway.client import (
    AsyncGatewayClient,
    GatewayClient,
    InvalidRequest,
    NotFound,
    RunStream,
    TypedRunRecord,
    Unauthorized,
)
from gateway.models import listing, record
from gateway.models.record import (
    Chart,
    ReturnedFileContent,
    ReturnedFileError,
    RunError,
    RunRecord,
)
from gateway.models.stream import (
    AcceptedEvent,
    CellFinishedEvent,
    CellStartedEvent,
    DoneEvent,
    OutputEvent,
)
from gateway.models.typed import (
    TypedRunList,
    TypedRunSummary,
    TypedSnapshotInfo,
    TypedSnapshotList,
)
from gateway.openapi import build_document, schemas
from tests.api import code_cell_json, notebook_json
from tests.conftest import start_gateway
from tests.support import REPO, GatewayThread, serving, wait_for

LIVE = "import time\nprint('first', flush=True)\ntime.sleep(120)"  # cannot end on its own
NOTEBOOK = notebook_json(code_cell_json("a", "x = 3"), code_cell_json("b", "print(x * 2)"))
PARTS = (
    "import matplotlib.pyplot as plt\n"
    "plt.bar(['a', 'b'], [3, 5])\n"
    "plt.title('votes')\n"
    "plt.show()\n"
    "open('out.txt', 'w').write('written')\n"
    "raise ValueError('bad')\n"
)
TIMESTAMPS = ("started_at", "finished_at")


def url_of(server: GatewayThread) -> str:
    return f"http://127.0.0.1:{server.port}"


@pytest.fixture
def api(local_gateway: GatewayThread) -> Iterator[GatewayClient]:
    with GatewayClient(url_of(local_gateway)) as client:
        yield client


def instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def assert_same_as_sent(typed: TypedRunRecord, sent: dict[str, Any]) -> None:
    """The typed record holds what the gateway sent, no field lost or added: the same JSON,
    but its timestamps, which are the same instants."""
    mine = typed.to_json()
    assert set(mine) == set(sent)
    for name, value in sent.items():
        if name in TIMESTAMPS and value is not None:
            assert getattr(typed, name) == instant(value), name
        else:
            assert mine[name] == value, name


# --- typed all the way down -------------------------------------------------------------


def test_a_record_is_typed_all_the_way_down(
    api: GatewayClient, local_gateway: GatewayThread
) -> None:
    before = dt.datetime.now(dt.UTC)
    run = api.run(PARTS, return_files=["out.txt", "missing.txt"], timeout=30)
    assert isinstance(run, TypedRunRecord) and isinstance(run, RunRecord)
    assert run.status == "failed"
    assert isinstance(run.error, RunError) and run.error.ename == "ValueError"
    assert isinstance(run.charts[0], Chart) and run.charts[0].spec is not None
    assert run.charts[0].spec.title == "votes"
    written, missing = run.files
    assert isinstance(written, ReturnedFileContent) and written.content == "written"
    assert isinstance(missing, ReturnedFileError) and missing.error == "not found"
    assert isinstance(run.started_at, dt.datetime) and isinstance(run.finished_at, dt.datetime)
    assert run.started_at.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(seconds=5) < run.started_at <= run.finished_at
    assert run.created_at is None  # the gateway does not send it: no made-up value
    sent = local_gateway.client().request("GET", f"/v1/runs/{run.id}").json()
    assert_same_as_sent(api.get_run(run.id), sent)
    assert_same_as_sent(run, sent)
    page = api.list_runs(limit=1)
    assert isinstance(page, TypedRunList) and page.runs[0].id == run.id
    assert isinstance(page.runs[0], TypedRunSummary)
    assert isinstance(page.runs[0].created_at, dt.datetime)
    assert page.runs[0].created_at <= run.started_at


def test_the_async_client_and_the_streams_type_their_records_too(
    local_gateway: GatewayThread,
) -> None:
    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            run = await client.run("raise KeyError('k')")
            assert isinstance(run.error, RunError) and run.error.ename == "KeyError"
            assert isinstance(run.finished_at, dt.datetime)
            async with client.stream_run("1 / 0") as stream:
                _ = [event async for event in stream]
            assert stream.record is not None and stream.record.error is not None
            assert stream.record.error.ename == "ZeroDivisionError"
            replay = await client.run_notebook(NOTEBOOK)
            assert isinstance(replay.run, TypedRunRecord)
            assert isinstance(replay.run.started_at, dt.datetime)

    asyncio.run(main())


def test_a_kept_states_expiry_is_a_datetime() -> None:
    """A snapshot (the forkserver backend keeps them): the record's and the listing's."""
    server = start_gateway("forkserver")
    try:
        with GatewayClient(url_of(server)) as client:
            run = client.run("x = 1", keep=True)
            assert isinstance(run.snapshot, TypedSnapshotInfo)
            assert run.snapshot.expires_at > dt.datetime.now(dt.UTC)
            [listed] = client.list_snapshots().snapshots
            assert (listed.id, listed.expires_at) == (run.snapshot.id, run.snapshot.expires_at)
            client.delete_snapshot(listed.id)
    finally:
        server.stop()


# --- the same models as the server's: they cannot drift --------------------------------

DOCUMENT = build_document()["components"]["schemas"]
DOCUMENTED = {name: model for model, name in schemas.ANSWERS}


def properties(model: type[BaseModel]) -> dict[str, Any]:
    """The properties of `model`'s component in the gateway's OpenAPI document."""
    found: dict[str, Any] = DOCUMENT[schemas.RENAMES[model.__name__]]["properties"]
    return found


def component_of(model: type[BaseModel], field: str) -> str | None:
    """The component the document gives a field kept as plain JSON (`component()`), if it
    is one."""
    prop = properties(model)[field]
    if prop.get("type") == "array":
        prop = prop["items"]
    refs = [o["$ref"] for o in [prop, *prop.get("anyOf", [])] if "$ref" in o]
    return refs[0].rsplit("/", 1)[1] if refs else None


def types_in(annotation: Any) -> set[Any]:
    """The classes an annotation names (`list[A | B] | None` -> {A, B, NoneType, list})."""
    found = {typing.get_origin(annotation) or annotation}
    for argument in typing.get_args(annotation):
        found |= types_in(argument)
    return found


@pytest.mark.fast
def test_the_typed_record_is_the_servers_with_its_parts_read_by_their_documented_models() -> None:
    """Every field of the server's record is the typed record's (inherited: the server's
    annotation and all); each part the server keeps as plain JSON and the document describes
    by a component of ours is read by that component's model (the models the record holds,
    its snapshots, by the same models or their typed subclasses); `outputs` stay nbformat's
    JSON, as the document says."""
    server, typed = RunRecord.model_fields, TypedRunRecord.model_fields
    assert set(typed) == set(server)
    parts = {}
    for name in properties(RunRecord):
        component = component_of(RunRecord, name)
        if component is None or component not in DOCUMENTED:
            continue
        model = DOCUMENTED[component]
        reading = types_in(typed[name].annotation)
        if dict in types_in(server[name].annotation):  # plain JSON on the server
            fields = model.model_fields
            roots = types_in(fields["root"].annotation) if "root" in fields else {model}
            assert roots <= reading, (name, component)
            parts[name] = component
        else:
            assert any(isinstance(t, type) and issubclass(t, model) for t in reading), name
    assert parts == {"error": "RunError", "charts": "Chart", "files": "ReturnedFile"}
    assert component_of(RunRecord, "outputs") == "Output" and "Output" not in DOCUMENTED
    overridden = {n for n in server if typed[n].annotation != server[n].annotation}
    assert overridden == {*parts, *TIMESTAMPS, "created_at", "snapshot", "snapshots"}


@pytest.mark.fast
@pytest.mark.parametrize(
    ("server", "typed"),
    [
        (RunRecord, TypedRunRecord),
        (record.SnapshotInfo, TypedSnapshotInfo),
        (listing.RunSummary, TypedRunSummary),
    ],
)
def test_every_timestamp_the_document_names_is_a_datetime(
    server: type[BaseModel], typed: type[BaseModel]
) -> None:
    """A field the document says is a `date-time` is a datetime on the client: a new one on
    the server fails this until the client types it."""
    timestamps = {
        name
        for name, prop in properties(server).items()
        if any(o.get("format") == "date-time" for o in [prop, *prop.get("anyOf", [])])
    }
    assert timestamps
    for name in timestamps:
        assert dt.datetime in types_in(typed.model_fields[name].annotation), name
    assert issubclass(typed, server)


EXAMPLE = re.compile(r"<!-- schema: (\w+) -->\n```json\n(.*?)```", re.DOTALL)


@pytest.mark.fast
def test_the_contracts_examples_read_typed() -> None:
    """docs/API.md's examples of a record, a listing and the snapshots, read by the client's
    models: typed, and written back as the same JSON but for how an instant is spelled."""
    examples = EXAMPLE.findall((REPO / "docs" / "API.md").read_text())
    seen = set()
    for name, text in examples:
        value = json.loads(text)
        if name == "RunRecord" or name == "StreamDoneMessage":
            sent = value if name == "RunRecord" else value["run"]
            typed = TypedRunRecord.model_validate(sent)
            assert_same_as_sent(typed, sent)
            assert isinstance(typed.finished_at, dt.datetime)
        elif name == "SnapshotList":
            snapshots = TypedSnapshotList.model_validate(value).snapshots
            assert [s.expires_at for s in snapshots] == [
                instant(s["expires_at"]) for s in value["snapshots"]
            ]
        elif name == "RunList":
            runs = TypedRunList.model_validate(value).runs
            assert [r.created_at for r in runs] == [instant(r["created_at"]) for r in value["runs"]]
        else:
            continue
        seen.add(name)
    assert seen == {"RunRecord", "StreamDoneMessage", "SnapshotList", "RunList"}


# --- notebooks --------------------------------------------------------------------------


def test_a_notebook_is_nbformats_notebook_node(
    api: GatewayClient, local_gateway: GatewayThread
) -> None:
    run = api.run("print(6 * 7)")
    notebook = api.notebook(run.id)
    assert isinstance(notebook, nbformat.NotebookNode)
    assert notebook.cells[0].outputs[0].text == "42\n"  # attributes all the way down
    nbformat.validate(notebook)
    replay = api.run_notebook(NOTEBOOK)
    assert isinstance(replay.notebook, nbformat.NotebookNode)
    assert replay.notebook.cells[1].outputs[0].text == "6\n"

    async def main() -> Any:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            return await client.notebook(run.id)

    assert asyncio.run(main()).cells[0].source == "print(6 * 7)"


# --- the blocking client's stream ---------------------------------------------------------


def test_stream_run_yields_the_events_in_order_with_the_record_last(api: GatewayClient) -> None:
    threads = threading.active_count()
    stream = api.stream_run("print('a')\nprint('b')", timeout=20)
    assert isinstance(stream, RunStream) and stream.id is None
    events = list(stream)
    assert isinstance(events[0], AcceptedEvent) and isinstance(events[-1], DoneEvent)
    assert all(isinstance(event, OutputEvent) for event in events[1:-1])
    assert {event.id for event in events} == {stream.id}
    text = "".join(str(e.output["text"]) for e in events if isinstance(e, OutputEvent))
    assert text == "a\nb\n"
    assert isinstance(stream.record, TypedRunRecord) and stream.record.stdout == "a\nb\n"
    assert api.get_run(events[0].id).to_json() == stream.record.to_json()
    assert list(stream) == []  # it ended
    assert wait_for(lambda: threading.active_count() == threads, timeout=10)  # its connection's


def test_stream_output_arrives_while_running_and_cancel_ends_it(api: GatewayClient) -> None:
    with api.stream_run(LIVE) as stream:
        kinds = []
        for event in stream:
            kinds.append(event.type)
            if isinstance(event, OutputEvent):
                assert event.output["text"] == "first\n"
                assert stream.id is not None and api.get_run(stream.id).status == "running"
                stream.cancel()
    assert kinds[:2] == ["accepted", "output"] and kinds[-1] == "done"
    assert stream.record is not None
    assert (stream.record.status, stream.record.stdout) == ("cancelled", "first\n")


def first_output(stream: RunStream) -> str:
    for event in stream:
        if isinstance(event, OutputEvent):
            break
    assert stream.id is not None
    return stream.id


def cancelled(api: GatewayClient, run_id: str) -> bool:
    return api.get_run(run_id).status == "cancelled"


@pytest.mark.parametrize("how", ["with", "for", "close from another thread"])
def test_leaving_the_stream_cancels_the_run(api: GatewayClient, how: str) -> None:
    """`break` out of the events, or drop the stream half-read, or close it while another
    thread waits for its next event: the connection closes and the gateway cancels the
    run."""
    threads = threading.active_count()
    if how == "with":
        with api.stream_run(LIVE) as stream:
            run_id = first_output(stream)
    elif how == "for":
        run_id = first_output(api.stream_run(LIVE))  # dropped here, half-read
    else:
        stream = api.stream_run(LIVE)
        run_id = first_output(stream)
        rest: list[Any] = []
        reader = threading.Thread(target=lambda: rest.extend(stream))
        reader.start()
        time.sleep(0.5)
        stream.close()
        reader.join(10)
        assert not reader.is_alive() and rest == []  # the end of the events, no error
    assert wait_for(lambda: cancelled(api, run_id), timeout=60)
    assert api.get_run(run_id).kill_reason == "cancelled"
    assert wait_for(lambda: threading.active_count() == threads, timeout=10)


def test_stream_notebook_yields_each_cells_events_and_the_executed_notebook(
    api: GatewayClient,
) -> None:
    with api.stream_notebook(NOTEBOOK, cell_timeout=20) as stream:
        events = list(stream)
    assert [event.type for event in events] == [
        "accepted",
        "cell_started",
        "cell_finished",
        "cell_started",
        "output",
        "cell_finished",
        "done",
    ]
    assert isinstance(events[1], CellStartedEvent) and events[1].cell_id == "a"
    assert isinstance(events[5], CellFinishedEvent) and events[5].execution_count == 2
    assert stream.record is not None and stream.record.stdout == "6\n"
    assert isinstance(stream.notebook, nbformat.NotebookNode)
    assert stream.notebook.cells[1].outputs[0].text == "6\n"


TOKEN = "typed-client-token-0123456789"


@pytest.fixture(scope="module")
def guarded() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local", users={TOKEN: ("typed", "user")}))


def test_stream_errors_are_typed(guarded: GatewayThread) -> None:
    """A refused handshake (401) and a refused run (400 with its field) raise the client's
    errors, as they do from the async client."""
    with GatewayClient(url_of(guarded)) as anonymous, pytest.raises(Unauthorized) as caught:
        list(anonymous.stream_run("print(1)"))
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    with GatewayClient(url_of(guarded), token=TOKEN) as client:
        with pytest.raises(InvalidRequest) as invalid:
            list(client.stream_run("1", language="cobol"))  # type: ignore[typeddict-item]
        assert (invalid.value.code, invalid.value.field) == ("unsupported_language", "language")
        with pytest.raises(InvalidRequest) as refused:
            list(client.stream_notebook({"nbformat": 4, "cells": 1}))
        assert refused.value.field == "notebook.cells"
        assert [e.type for e in client.stream_run("print(1)")][-1] == "done"


# --- wait -------------------------------------------------------------------------------


def test_wait_returns_the_record_once_the_background_run_is_done(api: GatewayClient) -> None:
    started = api.start("import time\ntime.sleep(1.5)\nprint('done')")
    run = api.wait(started.id, timeout=60)
    assert isinstance(run, TypedRunRecord)
    assert (run.id, run.status, run.stdout) == (started.id, "succeeded", "done\n")
    assert isinstance(run.finished_at, dt.datetime)
    with pytest.raises(NotFound):
        api.wait("run_0000", timeout=5)


def test_wait_gives_up_after_its_timeout_and_the_run_goes_on(api: GatewayClient) -> None:
    started = api.start(LIVE)
    try:
        begun = time.monotonic()
        with pytest.raises(TimeoutError, match=started.id):
            api.wait(started.id, timeout=1)
        assert 1 <= time.monotonic() - begun < 5
        assert api.get_run(started.id).status in ("queued", "running")
    finally:
        api.cancel(started.id)
    assert api.wait(started.id, timeout=30).status == "cancelled"


def test_the_async_wait(local_gateway: GatewayThread) -> None:
    async def main() -> None:
        async with AsyncGatewayClient(url_of(local_gateway)) as client:
            started = await client.start("import time\ntime.sleep(1)\nresult = 7")
            run = await client.wait(started.id, timeout=60)
            assert (run.status, run.result) == ("succeeded", 7)
            live = await client.start(LIVE)
            try:
                with pytest.raises(TimeoutError):
                    await client.wait(live.id, timeout=0.5)
            finally:
                await client.cancel(live.id)

    asyncio.run(main())
