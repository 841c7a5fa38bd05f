"""Attacks on the gateway's own memory and event loop through the HTTP front door (issue 20,
rows 2, 3, 4 and 9): bodies nobody asked for, bodies and WebSocket messages of one user,
answers a client never reads, a notebook export that froze the loop, and what health told
anyone.

Each attack runs against a gateway in a process of its own (its memory is its alone) with a
tokens file, on the local backend (the front door is the same whatever the backend). While
the attack holds, the gateway's resident memory is sampled (`/proc/<pid>/status`) and
another user's `GET /v1/health` is timed: what the gateway promises is that its memory stays
within its budgets and that health answers within a second or two whatever one client does.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tornado.web

from gateway.app import routes
from tests import raw_socket
from tests.api import assert_error
from tests.conftest import start_gateway
from tests.support import (
    Client,
    GatewayProcess,
    GatewayThread,
    Watch,
    serving,
    watching,
    write_tokens,
)
from tests.test_openapi import route_template

pytestmark = [pytest.mark.attack, pytest.mark.serial]  # times answers, measures memory

MiB = 1024 * 1024
MALLORY, BOB = "mallory-token-0123456789", "bob-token-0123456789abcd"
# Another user's health answers within this long while an attack runs (generous: the machine
# is shared; the broken gateway took 5 to 75 s).
HEALTH_LATENCY = 2.0
MIN_PROBES = 3


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    return write_tokens(tmp_path / "secrets", {MALLORY: ("mallory", "user"), BOB: ("bob", "user")})


@contextlib.contextmanager
def gateway(tmp_path: Path, tokens: Path, **settings: Any) -> Iterator[GatewayProcess]:
    data = tmp_path / "data"
    data.mkdir()
    server = GatewayProcess(
        "local", data, tokens=tokens, allow_local_multi_user=True, **settings
    ).start()
    yield from serving(server)


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    return raw_socket.connect(port, rcvbuf, timeout=60)


def send_body(sock: socket.socket, nbytes: int) -> int:
    """Send up to `nbytes` of body; how many the gateway took before it closed on us."""
    chunk = b"x" * MiB
    sent = 0
    try:
        while sent < nbytes:
            sock.sendall(chunk[: min(MiB, nbytes - sent)])
            sent += min(MiB, nbytes - sent)
    except OSError:
        pass
    return sent


def flood(server: GatewayProcess, socks: list[socket.socket], first: bytes, nbytes: int) -> Watch:
    """Each socket, from a thread of its own, sends `first` then up to `nbytes` of body
    while the gateway is watched (another user's health timed); then they are closed."""

    def attack(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(first)
        send_body(sock, nbytes)

    try:
        with watching(server.pid, server.port, BOB, MIN_PROBES) as watch:
            senders = [threading.Thread(target=attack, args=(sock,)) for sock in socks]
            for thread in senders:
                thread.start()
            for thread in senders:  # each has sent its body, or was cut off
                thread.join(120)
    finally:
        for sock in socks:
            sock.close()
    return watch


def interim_or_final(sock: socket.socket) -> tuple[int, bytes]:
    """After headers with `Expect: 100-continue`: the status of the first answer (100 means
    "send the body") and its bytes so far."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


# --- row 2: request bodies ------------------------------------------------------------------


def test_bodies_sent_to_endpoints_that_take_none_cost_the_gateway_nothing(
    tmp_path: Path, tokens: Path
) -> None:
    """Row 2: anyone, no token, 24 connections `GET /v1/health` each announcing 47 MiB and
    sending 40 MiB of it. The gateway buffered every byte (345 -> 2,199 MiB with 40); now it
    answers 413 at the headers and closes, and reads none of it."""
    with gateway(tmp_path, tokens) as server:
        socks = [connect(server.port) for _ in range(24)]
        head = (
            b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(47 * MiB).encode() + b"\r\n\r\n"
        )

        watch = flood(server, socks, head, 40 * MiB)
    assert watch.growth < MiB * 100, watch.report()
    assert watch.worst_health < HEALTH_LATENCY and not watch.failures, watch.report()


def every_route_and_method(server: GatewayThread) -> list[tuple[str, str]]:
    """Each (method, path) the route table serves, a path made from each route's pattern,
    and one address that serves nothing."""
    services = server.gateway.services
    assert services is not None
    made = []
    for pattern, handler, *_ in routes(services):
        path = (
            route_template(pattern)
            .format("run_0123456789abcdef0123")
            .replace("/static/run_0123456789abcdef0123", "/static/app.js")
        )
        for method in ("GET", "POST", "DELETE"):
            if getattr(handler, method.lower()) is not getattr(
                tornado.web.RequestHandler, method.lower()
            ):
                made.append((method, path))
    return [*made, ("POST", "/v1/nothing-here"), ("GET", "/v1/nothing-here")]


def test_no_route_reads_a_body_before_the_request_is_admitted(tokens: Path) -> None:
    """Row 2: every route, every method it serves, no token, 10 MiB announced and not one
    byte of it sent: each is answered at its headers (401 where a token is needed, 413 where
    no body is taken, 404 at no address) and its connection closed. The public GETs (health,
    the page, the document) and the WebSocket handshake used to wait for the body, reading
    it into memory as it came."""
    server = start_gateway("local", tokens=tokens, allow_uploads=True, body_timeout=60)
    try:
        operations = every_route_and_method(server)
        assert len(operations) >= 15, operations
        answers = {}
        for method, path in operations:
            sock = connect(server.port)
            sock.settimeout(10)
            try:
                sock.sendall(
                    f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {10 * MiB}\r\n\r\n".encode()
                )
                received, closed = b"", False
                with contextlib.suppress(TimeoutError):
                    try:
                        while chunk := sock.recv(65536):
                            received += chunk
                    except ConnectionResetError:
                        pass
                    closed = True
                answers[(method, path)] = received, closed
            finally:
                sock.close()
    finally:
        server.stop()
    for (method, path), (received, closed) in answers.items():
        assert closed, (method, path, "the gateway kept the connection for the body")
        status = received[9:12]
        assert status in (b"401", b"404", b"413"), (method, path, received[:300])
        if method == "POST" and b"nothing-here" not in path.encode():
            assert status == b"401", (method, path, received[:300])
        assert b'"error"' in received, (method, path, received[:300])


def test_a_background_runs_request_stays_counted_until_the_run_ends(
    tmp_path: Path, tokens: Path
) -> None:
    """A background run's files are held by the gateway until the run ends, also after its
    202: they stay in the user's share of the bodies budget. One user's background runs of
    30 MiB of files each are admitted while they fit in the 96 MiB share: two, each keeping
    its 30 MiB while it runs; the third's bytes fit (90 MiB) but parsing them takes 30 MiB
    more (issue 29: their text decoded), so it is 503 `capacity`. Another user is still
    admitted, and once the user's runs end the room is theirs again. Before, the room was
    given back with the 202, and only `max_runs_per_user` (8 runs of up to 32 MiB) bounded
    what one user had the gateway hold."""
    files = [{"path": f"part{i}.txt", "content": "x" * (10 * MiB - 64)} for i in range(3)]
    body = json.dumps(
        {"code": "import time\ntime.sleep(3600)", "background": True, "files": files}
    ).encode()
    head = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + MALLORY.encode() + b"\r\nExpect: 100-continue\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )

    def post() -> tuple[int, bytes]:
        """Headers first; the body only after the gateway's 100 Continue."""
        with connect(port) as sock:
            sock.sendall(head)
            status, data = interim_or_final(sock)
            if status != 100:
                return status, data
            sock.sendall(body)
            status, data = interim_or_final(sock)
            while b"}" not in data:  # the small JSON answer of a 202
                data += sock.recv(65536)
            return status, data

    with gateway(tmp_path, tokens) as server:
        port = server.port
        mallory = Client(port, MALLORY)
        admitted = [post() for _ in range(2)]
        assert [status for status, _ in admitted] == [202, 202], admitted
        ids = [json.loads(data[data.index(b"{") :])["id"] for _, data in admitted]
        status, refused = post()  # 60 MiB held for her, 60 more to parse it: over her share
        assert status == 503, refused[:300]
        assert b'"capacity"' in refused and b"Retry-After:" in refused, refused[:300]
        bob = Client(port, BOB).run(code="print('bob')")
        assert bob["stdout"] == "bob\n"
        for run_id in ids:
            assert mallory.request("DELETE", f"/v1/runs/{run_id}").json()["status"] == "cancelled"
        status, again = post()  # her runs ended: the room is hers again
        assert status == 202, again[:300]
        run_id = json.loads(again[again.index(b"{") :])["id"]
        assert mallory.request("DELETE", f"/v1/runs/{run_id}").json()["status"] == "cancelled"


def test_one_users_bodies_in_flight_are_bounded(tmp_path: Path, tokens: Path) -> None:
    """Row 2, with a token: 12 connections each POSTing a 40 MiB body and stalling before its
    end. Each used to be buffered whole (480 MiB); now the user's bodies in flight stop at
    `max_body_bytes_in_flight_per_user` (96 MiB): a body that does not fit is refused at its
    headers with 503 `capacity` and `Retry-After`. Another user is not refused."""
    head = (
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + MALLORY.encode() + b"\r\nExpect: 100-continue\r\n"
        b"Content-Length: " + str(40 * MiB).encode() + b"\r\n\r\n"
    )
    with gateway(tmp_path, tokens) as server:
        socks = [connect(server.port) for _ in range(12)]
        answers: list[tuple[int, bytes]] = []
        try:
            with watching(server.pid, server.port, BOB, MIN_PROBES) as watch:
                for sock in socks:
                    sock.sendall(head)
                    status, data = interim_or_final(sock)
                    answers.append((status, data))
                    if status == 100:
                        send_body(sock, 39 * MiB)  # and stall: the gateway holds what it got
                bob = Client(server.port, BOB).request("POST", "/v1/runs", {"code": 1})
        finally:
            for sock in socks:
                sock.close()
    admitted = [a for a in answers if a[0] == 100]
    refused = [a for a in answers if a[0] == 503]
    assert len(admitted) <= 3 and len(admitted) + len(refused) == 12, [a[0] for a in answers]
    assert b'"capacity"' in refused[-1][1] and b"Retry-After:" in refused[-1][1], refused[-1]
    assert bob.status == 400 and bob.json()["error"]["field"] == "code", bob.body[:300]
    assert watch.growth < MiB * 200, watch.report()
    assert watch.worst_health < HEALTH_LATENCY and not watch.failures, watch.report()


def websocket_handshake(port: int, token: str) -> socket.socket:
    sock = connect(port)
    sock.sendall(
        (
            f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
        ).encode()
    )
    status, _ = interim_or_final(sock)
    assert status == 101
    return sock


def test_one_users_websocket_messages_in_flight_are_bounded(tmp_path: Path, tokens: Path) -> None:
    """Row 2, the WebSocket: 8 connections (the per-user maximum) each announcing one 40 MiB
    message and sending 39 MiB of it. Each was buffered whole (a message may be
    `max_body_bytes`); now messages being received count toward the same per-user budget as
    bodies, and a connection whose message does not fit is closed (1013, try again later)."""
    with gateway(tmp_path, tokens) as server:
        socks = [websocket_handshake(server.port, MALLORY) for _ in range(8)]
        frame = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", 40 * MiB) + b"\0\0\0\0"
        watch = flood(server, socks, frame, 39 * MiB)
    assert watch.growth < MiB * 200, watch.report()
    assert watch.worst_health < HEALTH_LATENCY and not watch.failures, watch.report()


# --- row 3: answers ---------------------------------------------------------------------------

BIG_RECORD = (
    "import os\n"
    "for i in range(5):\n"
    "    with open(f'f{i}.bin', 'wb') as f:\n"
    "        f.write(os.urandom(8 * 1024 * 1024))\n"
)


def test_answers_nobody_reads_are_bounded_and_keep_the_loop_free(
    tmp_path: Path, tokens: Path
) -> None:
    """Row 3: a user's ~55 MiB record (five 8 MiB files returned, base64), then 24
    connections `GET /v1/runs/{id}` that never read. Each answer was built on the event loop
    and held until `write_timeout` (77 -> 2,569 MiB with 40; another user's health took
    9-15 s). Now answers in flight are budgeted (64 MiB per user): the others wait for room
    without holding their record, and large answers are encoded off the loop."""
    settings = {
        "max_return_file_bytes": 8 * MiB,
        "max_return_files_bytes": 48 * MiB,
        "write_timeout": 60,
    }
    with gateway(tmp_path, tokens, **settings) as server:
        mallory = Client(server.port, MALLORY)
        record = mallory.run(code=BIG_RECORD, return_files=["f*.bin"], timeout=60)
        assert len(record["files"]) == 5 and all("content" in f for f in record["files"])
        request = (
            f"GET /v1/runs/{record['id']} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {MALLORY}\r\n\r\n"
        ).encode()
        del record
        socks: list[socket.socket] = []
        try:
            with watching(server.pid, server.port, BOB, MIN_PROBES) as watch:
                for _ in range(24):
                    sock = connect(server.port, rcvbuf=4096)
                    sock.sendall(request)
                    socks.append(sock)
                # the attack holds: nobody reads; an answer has begun to arrive
                ready, _, _ = select.select(socks, [], [], 60)
                assert ready, "no answer began within 60 s"
                first = ready[0].recv(64)
                assert first.startswith(b"HTTP/1.1 200"), first
                time.sleep(8)  # the attack holding is what health is timed against
        finally:
            for sock in socks:
                sock.close()
    assert watch.growth < MiB * 400, watch.report()
    assert watch.worst_health < HEALTH_LATENCY and not watch.failures, watch.report()


# --- row 4: the notebook export -----------------------------------------------------------------


def test_exporting_a_huge_notebook_does_not_freeze_the_loop(tmp_path: Path, tokens: Path) -> None:
    """Row 4, the loop: a replayed notebook of 50,000 empty markdown cells (3.5 MiB), then two
    `GET /v1/runs/{id}/notebook` at once. Each converted, validated and wrote the notebook
    on the event loop (75 s each for 400,000 cells), so nothing else was answered meanwhile;
    now the export is built by the gateway's own code in the heavy-work pool."""
    cells = [
        {"id": f"c{i}", "cell_type": "markdown", "metadata": {}, "source": ""}
        for i in range(50_000)
    ]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
    # (an operator's choice: by default a replay takes 10,000 cells at most)
    with gateway(tmp_path, tokens, max_notebook_cells=50_000) as server:
        mallory = Client(server.port, MALLORY)
        replayed = mallory.request("POST", "/v1/notebooks/run", notebook, timeout=300)
        assert replayed.status == 200, replayed.body[:500]
        run_id = replayed.json()["run"]["id"]
        del replayed
        statuses: list[int] = []

        def export() -> None:
            response = mallory.request("GET", f"/v1/runs/{run_id}/notebook", timeout=300)
            statuses.append(response.status)
            assert len(json.loads(response.body)["cells"]) == 50_000

        with watching(server.pid, server.port, BOB, MIN_PROBES) as watch:
            exports = [threading.Thread(target=export) for _ in range(2)]
            for thread in exports:
                thread.start()
            for thread in exports:
                thread.join(300)
    assert statuses == [200, 200]
    assert watch.worst_health < HEALTH_LATENCY and not watch.failures, watch.report()


# --- row 9, and issue 29 row 7: what health and /metrics tell whom -----------------------------

OPS = "ops-admin-token-0123456789"
SCRAPER = "scraper-token-0123456789abcdef"
DETAILS = {"status", "backend", "store", "kernels", "pools", "version"}
READ_SECRET = """
try:
    result = open(PATH).read()
except OSError as exc:
    result = exc.strerror
"""


def test_only_an_operator_is_told_every_tenants_activity(tmp_path: Path) -> None:
    """Row 9: running kernels and pool hits and misses told anyone, without a token, what
    other tenants were doing. Issue 29 row 7: any user's token still read them, and runs by
    status and language on `/metrics`. Now only an admin's token or the operator's metrics
    token (a Prometheus scrape's bearer token, which opens nothing else) is told; no
    sandbox can read that token's file."""
    tokens = write_tokens(tmp_path / "secrets", {BOB: ("bob", "user"), OPS: ("ops", "admin")})
    # outside /tmp (a local sandbox has a /tmp of its own), readable by everyone
    folder = Path(tempfile.mkdtemp(prefix="gwsecrets-", dir="/var/lib"))
    os.chmod(folder, 0o755)
    scraper_file = folder / "metrics.token"
    scraper_file.write_text(SCRAPER + "\n")
    os.chmod(scraper_file, 0o644)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, folder)
        server = cleanup.enter_context(gateway(tmp_path, tokens, metrics_token_file=scraper_file))
        callers = {
            "anyone": Client(server.port),
            "forged": Client(server.port, "not-a-token-0123456789"),
            **{who: Client(server.port, t) for who, t in [("bob", BOB), ("ops", OPS)]},
            "scraper": Client(server.port, SCRAPER),
        }
        ran = callers["bob"].run(code=f"PATH = {str(scraper_file)!r}\n{READ_SECRET}")
        health = {who: client.request("GET", "/v1/health") for who, client in callers.items()}
        metrics = {who: client.request("GET", "/metrics") for who, client in callers.items()}
        # the metrics token is no user's: it runs nothing and lists nothing
        scraper_runs = callers["scraper"].request("POST", "/v1/runs", {"code": "print(1)"})
        scraper_lists = callers["scraper"].request("GET", "/v1/runs")
    assert ran["status"] == "succeeded" and SCRAPER not in str(ran["result"]), ran
    for who in ("anyone", "forged", "bob"):
        assert health[who].status == 200 and health[who].json() == {"status": "ok"}, who
    for who in ("ops", "scraper"):
        assert health[who].status == 200 and set(health[who].json()) == DETAILS, who
    assert_error(metrics["anyone"], 401, "unauthorized")
    assert_error(metrics["forged"], 401, "unauthorized")
    assert_error(metrics["bob"], 403, "forbidden", "/metrics")
    for who in ("ops", "scraper"):
        text = metrics[who].body.decode()
        assert metrics[who].status == 200, (who, text)
        assert 'gateway_runs_total{language="python",status="succeeded"} 1.0' in text, text
    assert_error(scraper_runs, 401, "unauthorized")
    assert_error(scraper_lists, 401, "unauthorized")


def test_a_metrics_token_must_be_its_own(tmp_path: Path) -> None:
    """A metrics token that is also a user's would tell that user everything: refused at
    start, as is a file that holds no token."""
    from gateway.auth import TokenTable

    tokens = write_tokens(tmp_path / "secrets", {BOB: ("bob", "user")})
    for text, says in [
        (BOB, "also a token"),
        ("short", "at least 16"),
        ("two tokens " * 3, "white space"),
    ]:
        path = tmp_path / "secrets" / "metrics.token"
        path.write_text(text)
        with pytest.raises(ValueError, match=says):
            TokenTable.load(tokens, path)
