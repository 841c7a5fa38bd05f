"""A notebook replayed over the WebSocket, cell by cell (API.md, "Notebook replay, cell by
cell"): the events of each cell arrive as it runs, in order, before the last cell has
finished; cancel stops the replay with the cells run so far; a notebook the POST would
refuse gets the same error as an event and the connection goes on; `done` stays within
`max_event_bytes` with the record and the notebook."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest

from tests.conftest import start_gateway
from tests.openapi_support import assert_valid
from tests.stream_client import Stream, connect
from tests.support import GatewayThread, serving


def notebook(*cells: tuple[str, str]) -> dict[str, Any]:
    """An nbformat v4.5 notebook of (cell_type, source) cells, ids c0, c1, ..."""
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {"id": f"c{i}", "cell_type": kind, "metadata": {}, "source": source}
            | ({"outputs": [], "execution_count": None} if kind == "code" else {})
            for i, (kind, source) in enumerate(cells)
        ],
    }


SCHEMAS = {  # the document's schema of each event (generated from gateway.models.stream)
    "accepted": "StreamAcceptedMessage",
    "cell_started": "StreamCellStartedMessage",
    "output": "StreamOutputMessage",
    "cell_finished": "StreamCellFinishedMessage",
    "done": "StreamDoneMessage",
}


def of(stream: Stream, ref: Any) -> list[dict[str, Any]]:
    return [e for e in stream.events if e.get("ref") == ref]


def test_cells_stream_in_order_and_done_has_the_executed_notebook(
    local_gateway: GatewayThread,
) -> None:
    nb = notebook(
        ("code", "print('a')"),
        ("markdown", "# not run"),
        ("code", "import sys\nprint('b'); print('e', file=sys.stderr)"),
        ("code", "6 * 7"),
    )

    async def main() -> None:
        async with connect(local_gateway.port) as stream:
            stream.send({"type": "notebook", "ref": "nb", "notebook": nb})
            done = await stream.done("nb")
            events = of(stream, "nb")
        run_id = events[0]["id"]
        assert all(e["id"] == run_id for e in events)
        assert_valid("StreamNotebookMessage", {"type": "notebook", "ref": "nb", "notebook": nb})
        for event in events:
            assert_valid(SCHEMAS[event["type"]], {k: v for k, v in event.items() if k != "_t"})
        shapes = [
            (e["type"], e.get("index"), e.get("output", {}).get("output_type")) for e in events
        ]
        assert shapes == [
            ("accepted", None, None),
            ("cell_started", 0, None),
            ("output", 0, "stream"),
            ("cell_finished", 0, None),
            ("cell_started", 2, None),
            ("output", 2, "stream"),
            ("output", 2, "stream"),
            ("cell_finished", 2, None),
            ("cell_started", 3, None),
            ("output", 3, "execute_result"),
            ("cell_finished", 3, None),
            ("done", None, None),
        ]
        started = [e for e in events if e["type"] == "cell_started"]
        assert [e["cell_id"] for e in started] == ["c0", "c2", "c3"]
        finished = [e for e in events if e["type"] == "cell_finished"]
        assert [(e["cell_id"], e["execution_count"], e["status"]) for e in finished] == [
            ("c0", 1, "ok"),
            ("c2", 2, "ok"),
            ("c3", 3, "ok"),
        ]
        assert all(isinstance(e["duration_ms"], int) and e["duration_ms"] >= 0 for e in finished)
        assert [e["output"].get("text") for e in events if e["type"] == "output"][:3] == [
            "a\n",
            "b\n",
            "e\n",
        ]
        record, executed = done["run"], done["notebook"]
        assert record["id"] == run_id and record["status"] == "succeeded"
        nbformat.validate(nbformat.from_dict(executed))
        cells = executed["cells"]
        assert [c.get("execution_count") for c in cells] == [1, None, 2, 3]
        assert cells[0]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "a\n"}]
        assert cells[3]["outputs"][0]["data"]["text/plain"] == "42"
        assert executed["metadata"]["gateway"]["run_id"] == run_id

    asyncio.run(main())


def test_a_cells_events_arrive_before_the_last_cell_finishes_and_cancel_stops_it(
    local_gateway: GatewayThread,
) -> None:
    """The last cell cannot end on its own: everything before it must have arrived while
    it runs; then a cancel ends the replay with the cells run so far."""
    nb = notebook(
        ("code", "x = 2\nprint(x)"),
        ("code", "print(x * 21)"),
        ("code", "import time\nprint('waiting', flush=True)\ntime.sleep(600)"),
        ("code", "print('never')"),
    )
    client = local_gateway.client()

    async def main() -> None:
        async with connect(local_gateway.port) as stream:
            stream.send({"type": "notebook", "ref": 7, "notebook": nb, "timeout": 300})
            accepted = await stream.until(lambda e: e["type"] == "accepted")
            await stream.until(lambda e: e["type"] == "cell_finished" and e["index"] == 1)
            await stream.until(lambda e: e["type"] == "output" and e["index"] == 2)
            status = await asyncio.to_thread(
                lambda: client.request("GET", f"/v1/runs/{accepted['id']}").json()["status"]
            )
            assert status == "running"
            assert not [e for e in stream.events if e["type"] == "done"]
            texts = [e["output"]["text"] for e in of(stream, 7) if e["type"] == "output"]
            assert texts == ["2\n", "42\n", "waiting\n"]
            stream.send({"type": "cancel", "id": accepted["id"]})
            done = await stream.done(7)
            events = of(stream, 7)
        last = [e for e in events if e["type"] == "cell_finished"][-1]
        assert (last["index"], last["status"]) == (2, "cancelled")
        assert not [e for e in events if e.get("index") == 3]
        assert done["run"]["status"] == "cancelled"
        assert done["run"]["kill_reason"] == "cancelled"
        cells = done["notebook"]["cells"]
        assert [c["execution_count"] for c in cells] == [1, 2, 3, None]
        assert [[o.get("text") for o in c["outputs"]] for c in cells] == [
            ["2\n"],
            ["42\n"],
            ["waiting\n"],
            [],
        ]

    asyncio.run(main())


def test_a_notebook_the_post_refuses_is_an_error_event_and_the_connection_goes_on(
    local_gateway: GatewayThread,
) -> None:
    client = local_gateway.client()
    too_much = notebook(("code", "x = 1\n" + "#" * (1024 * 1024)))
    invalid = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "x"}]}
    cases: list[tuple[dict[str, Any], str, str | None]] = [
        ({"notebook": too_much}, "payload_too_large", "notebook"),
        ({"notebook": invalid}, "invalid_request", "notebook"),
        ({"notebook": notebook(("code", "1")), "timeout": "soon"}, "invalid_request", "timeout"),
        ({"notebook": notebook(("code", "1")), "network": True}, "forbidden", "network"),
        ({"notebook": notebook(("code", "1")), "extra": 1}, "invalid_request", "extra"),
        ({}, "invalid_request", "notebook"),
        ({"notebook": 5}, "invalid_request", "notebook"),
    ]

    async def main() -> None:
        async with connect(local_gateway.port) as stream:
            for number, (fields, code, field) in enumerate(cases):
                post = await asyncio.to_thread(client.request, "POST", "/v1/notebooks/run", fields)
                assert post.status >= 400 and post.json()["error"]["code"] == code, fields
                stream.send({"type": "notebook", "ref": number, **fields})
                event = await stream.until(lambda e: e["type"] == "error")
                assert event["ref"] == number
                assert event["error"]["code"] == code, event
                assert event["error"]["field"] == field, event
                assert event["error"]["field"] == post.json()["error"].get("field")
            stream.send("{not json")
            await stream.until(lambda e: e["type"] == "error")
            stream.send({"type": "notebook", "ref": "ok", "notebook": notebook(("code", "1+1"))})
            done = await stream.done("ok")
        assert done["run"]["status"] == "succeeded"
        assert not [e for e in stream.events if e["type"] == "accepted" and e["ref"] != "ok"]

    asyncio.run(main())


@pytest.fixture(scope="module")
def small_events() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local", max_event_bytes=128 * 1024))


def test_done_holds_the_record_and_the_notebook_within_max_event_bytes(
    small_events: GatewayThread,
) -> None:
    """Three cells print 100 kB each: the record and the notebook would hold 600 kB."""
    nb = notebook(*[("code", f"print('{i}' * 100_000)") for i in range(3)])

    async def main() -> dict[str, Any]:
        async with connect(small_events.port) as stream:
            stream.send({"type": "notebook", "ref": "big", "notebook": nb})
            await stream.done("big")
            return next(e for e in stream.events if e["type"] == "done")

    done = asyncio.run(main())
    size = len(json.dumps({k: v for k, v in done.items() if k != "_t"}, separators=(",", ":")))
    assert size <= 128 * 1024, size
    assert done["run"]["status"] == "succeeded"
    assert any("over its limit" in note for note in done["run"]["notes"])
    cells = done["notebook"]["cells"]
    assert [c["execution_count"] for c in cells] == [1, 2, 3]
    assert all(len(c["outputs"]) == 1 for c in cells)  # each cell keeps its place
    whole = small_events.client().request("GET", f"/v1/runs/{done['id']}").json()
    assert whole["stdout"].startswith("0" * 100_000)
