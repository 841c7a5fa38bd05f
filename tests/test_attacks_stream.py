"""Greedy WebSocket clients (issue 8, item 10): many connections per user, and a client that
never reads while its runs finish. Every event the gateway sends is bounded, `done`
included, and so is what waits for a client that does not read. The runs really execute,
so each test runs on both backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.handlers.stream import StreamHandler
from tests.conftest import BACKENDS, start_gateway
from tests.support import GatewayThread, serving, wait_for
from tests.ws_client import RawStream, handshake, open_stream, receive

pytestmark = pytest.mark.attack

MiB = 1024 * 1024
TOKENS = {
    "alice-token-0123456789": ("alice", "user"),
    "bob-token-0123456789ab": ("bob", "user"),
}
ALICE, BOB = (f"Bearer {t}" for t in TOKENS)
STREAMS = 2
EVENT = 2 * MiB  # max_event_bytes here
HOLD = 8 * MiB  # the outbox's hold_bytes (gateway/handlers/stream.py)
DROP = 4 * MiB  # the outbox's bound on live outputs


@pytest.fixture(scope="module", params=BACKENDS)
def greedy(request: pytest.FixtureRequest) -> Iterator[GatewayThread]:
    server = start_gateway(
        request.param,
        users=TOKENS,
        max_streams_per_user=STREAMS,
        max_event_bytes=EVENT,
        max_runs_per_user=8,
        max_queued_runs=16,
    )
    yield from serving(server)


def streams_of(server: GatewayThread) -> list[StreamHandler]:
    assert server.gateway.services is not None
    return [s for s in server.gateway.services.open_streams if isinstance(s, StreamHandler)]


def test_a_user_has_at_most_max_streams_per_user(greedy: GatewayThread) -> None:
    mine = [RawStream(greedy.port, {"Authorization": ALICE}) for _ in range(STREAMS)]
    try:
        assert [s.status for s in mine] == [101] * STREAMS
        status, body = asyncio.run(handshake(greedy.port, {"Authorization": ALICE}))
        assert status == 429 and body["error"]["code"] == "capacity", body
        other = RawStream(greedy.port, {"Authorization": BOB})  # another user is not affected
        assert other.status == 101
        other.close()
        mine.pop().close()
        # once the gateway saw the close, alice may connect again
        assert wait_for(lambda: len(streams_of(greedy)) <= STREAMS - 1, timeout=30)
        again = RawStream(greedy.port, {"Authorization": ALICE})
        assert again.status == 101
        mine.append(again)
    finally:
        for stream in mine:
            stream.close()


BIG_RUN = "print('x' * 1_000_000, end='')"  # a record of ~3 MB (stdout, output, outputs)


def test_done_events_wait_for_a_client_that_does_not_read(greedy: GatewayThread) -> None:
    """Eight runs of ~3 MB records to a client that reads nothing until they are all over:
    `done` events went around the outbox's bound and piled up in the gateway."""
    client = RawStream(greedy.port, {"Authorization": ALICE})
    try:
        for ref in range(8):
            client.send({"type": "run", "ref": ref, "code": BIG_RUN, "timeout": 60})
        events = []
        while sum(e["type"] == "accepted" for e in events) < 8:
            events.append(client.recv())
        assert not [e for e in events if e["type"] == "error"], events
        (handler,) = [s for s in streams_of(greedy) if s.user.user == "alice"]
        # from here on the client reads nothing until every run is over
        assert wait_for(greedy.idle, timeout=300), "the runs did not finish"
        peak = handler.outbox.peak_bytes
        while sum(e["type"] == "done" for e in events) < 8:
            events.append(client.recv())
    finally:
        client.close()
    # what waited: under the hold bound, plus one event of each kind that may pass it
    assert peak <= HOLD + DROP + EVENT, f"{peak / MiB:.1f} MiB waited for the client"
    done = [e for e in events if e["type"] == "done"]
    assert sorted(e["ref"] for e in done) == list(range(8))
    for event in done:
        record = event["run"]
        assert record["status"] == "succeeded"
        assert len(json.dumps(event)) <= EVENT
        assert any("GET /v1/runs/" in note for note in record["notes"])
    # the whole record is still there
    whole = greedy.client(next(iter(TOKENS))).request("GET", f"/v1/runs/{done[0]['id']}")
    assert whole.status == 200 and whole.json()["stdout"] == "x" * 1_000_000


def test_an_output_event_over_the_limit_is_dropped_and_counted(greedy: GatewayThread) -> None:
    code = "from IPython.display import HTML, display\ndisplay(HTML('h' * 3_000_000))\nprint('ok')"

    async def main() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with open_stream(greedy.port, {"Authorization": BOB}) as ws:
            await ws.write_message(json.dumps({"type": "run", "ref": "big", "code": code}))
            while not events or events[-1]["type"] != "done":
                events.append(await receive(ws, 120))
        return events

    events = asyncio.run(main())
    sizes = [len(json.dumps(e)) for e in events]
    assert max(sizes) <= EVENT, sizes
    outputs = [e["output"] for e in events if e["type"] == "output"]
    assert not [o for o in outputs if o["output_type"] == "display_data"]
    assert sum(e["dropped"] for e in events if e["type"] == "output_dropped") >= 1
    assert events[-1]["run"]["stdout"] == "ok\n"
