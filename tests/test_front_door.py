"""The front door's answers to what it will not hold (docs/API.md, Conventions and Limits): a
body on an endpoint that takes none, a body or an answer that finds no room among those in
flight (503 `capacity` with `Retry-After`), gzip, and what health says to whom. The
attacks these close are in test_attacks_front.py."""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import socket
from collections.abc import Iterator
from email.message import Message

import pytest

from tests.api import assert_error
from tests.conftest import start_gateway
from tests.raw_socket import connect
from tests.support import Client, GatewayThread, Response, serving, wait_for

ANN, BOB = "ann-token-0123456789abcdef", "bob-token-0123456789abcdef"
OPS = "ops-token-0123456789abcdef"  # an admin: reads /metrics and health's details
KiB = 1024


@pytest.fixture(scope="module")
def door() -> Iterator[GatewayThread]:
    """Two users and an admin; small budgets: 1 MiB of bodies in flight per user (4 MiB in
    all)."""
    server = start_gateway(
        "local",
        users={ANN: ("ann", "user"), BOB: ("bob", "user"), OPS: ("ops", "admin")},
        max_body_bytes_in_flight=4 * 1024 * KiB,
        max_body_bytes_in_flight_per_user=1024 * KiB,
    )
    yield from serving(server)


def read_answer(sock: socket.socket) -> Response:
    """One whole answer (by its Content-Length), then whether the gateway closes after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = Message()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip()] = value.strip()
    length = int(headers["Content-Length"] or 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return Response(status, headers, body)


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def headers_of(method: str, path: str, token: str | None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{auth}{extra}\r\n"
    ).encode()


# --- a body where none is taken ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/health"),
        ("GET", "/v1/runs/run_0123456789abcdef0123"),
        ("DELETE", "/v1/runs/run_0123456789abcdef0123"),
        ("GET", "/metrics"),
        ("GET", "/"),
        ("GET", "/v1/stream"),
    ],
)
def test_a_body_on_an_endpoint_that_takes_none_is_413_at_the_headers(
    door: GatewayThread, method: str, path: str
) -> None:
    """Answered before any of the body is sent, and the connection closed after it."""
    with connect(door.port) as sock:
        sock.sendall(headers_of(method, path, ANN, f"Content-Length: {10 * 1024 * KiB}\r\n"))
        answer = read_answer(sock)
        assert_error(answer, 413, "payload_too_large", "takes no request body")
        assert closed(sock)


def test_a_chunked_body_on_a_get_is_413_too(door: GatewayThread) -> None:
    with connect(door.port) as sock:
        sock.sendall(headers_of("GET", "/v1/health", None, "Transfer-Encoding: chunked\r\n"))
        assert_error(read_answer(sock), 413, "payload_too_large")


def test_an_empty_body_on_a_get_is_no_body(door: GatewayThread) -> None:
    response = Client(door.port, ANN).request("GET", "/v1/health", headers={"Content-Length": "0"})
    assert response.status == 200


def test_a_method_an_address_does_not_serve_is_405_before_its_body(door: GatewayThread) -> None:
    with connect(door.port) as sock:
        sock.sendall(headers_of("PUT", "/v1/runs", None, f"Content-Length: {1024 * KiB}\r\n"))
        answer = read_answer(sock)
        assert_error(answer, 405, "method_not_allowed")
        assert answer.headers["Allow"] == "GET, POST"  # list runs, start one


# --- bodies in flight ---------------------------------------------------------------------------


def start_post(port: int, token: str, length: int) -> tuple[socket.socket, int, bytes]:
    """A POST /v1/runs announcing `length` bytes with `Expect: 100-continue`: the socket and
    the gateway's first answer (100: send the body)."""
    sock = connect(port)
    sock.sendall(
        headers_of(
            "POST", "/v1/runs", token, f"Content-Length: {length}\r\nExpect: 100-continue\r\n"
        )
    )
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return sock, int(data.split(b" ", 2)[1]), data


def in_flight(server: GatewayThread) -> float:
    text = Client(server.port, OPS).request("GET", "/metrics").body.decode()
    match = re.search(r"^gateway_body_bytes_in_flight (\S+)$", text, re.M)
    assert match, text
    return float(match[1])


def test_a_body_that_finds_no_room_is_503_with_retry_after(door: GatewayThread) -> None:
    """Ann's bodies in flight stop at her share (1 MiB): a second 800 KiB body while the
    first is still arriving is refused at its headers; Bob's is not. The room comes back
    when the first body's connection closes."""
    first, status, _ = start_post(door.port, ANN, 800 * KiB)
    assert status == 100
    first.sendall(b"x" * (400 * KiB))  # half of it, then nothing: it is in flight
    with contextlib.ExitStack() as stack:
        stack.callback(first.close)
        second, status, data = start_post(door.port, ANN, 800 * KiB)
        stack.callback(second.close)
        assert status == 503, data
        assert b"Retry-After: " in data and b'"capacity"' in data, data
        bobs, status, _ = start_post(door.port, BOB, 800 * KiB)
        stack.callback(bobs.close)
        assert status == 100
    assert wait_for(lambda: in_flight(door) == 0, timeout=30)
    again, status, _ = start_post(door.port, ANN, 800 * KiB)
    again.close()
    assert status == 100


def test_a_body_larger_than_the_share_passes_alone(door: GatewayThread) -> None:
    """A single body may be larger than the user's share (up to max_body_bytes)."""
    response = Client(door.port, ANN).request(
        "POST", "/v1/runs", {"code": 1, "x": "y" * 1500 * KiB}
    )
    assert_error(response, 400, "invalid_request")


def test_a_chunked_body_past_the_room_left_is_503(door: GatewayThread) -> None:
    first, status, _ = start_post(door.port, ANN, 800 * KiB)
    assert status == 100
    try:
        first.sendall(b"x" * (400 * KiB))
        with connect(door.port) as sock:
            sock.sendall(headers_of("POST", "/v1/runs", ANN, "Transfer-Encoding: chunked\r\n"))
            chunk = b"y" * (64 * KiB)
            with contextlib.suppress(OSError):
                for _ in range(8):  # 512 KiB: past the 224 KiB left of ann's share
                    sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            assert_error(read_answer(sock), 503, "capacity")
    finally:
        first.close()
    assert wait_for(lambda: in_flight(door) == 0, timeout=30)


def test_unauthenticated_bodies_are_never_admitted(door: GatewayThread) -> None:
    with connect(door.port) as sock:
        sock.sendall(headers_of("POST", "/v1/runs", None, f"Content-Length: {800 * KiB}\r\n"))
        assert_error(read_answer(sock), 401, "unauthorized")
        assert closed(sock)
    assert in_flight(door) == 0


# --- answers ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_readers() -> Iterator[GatewayThread]:
    """Answers to one user: at most 1 MiB in flight; taken within 3 s."""
    server = start_gateway(
        "local",
        users={ANN: ("ann", "user")},
        max_answer_bytes_in_flight_per_user=1024 * KiB,
        write_timeout=3,
    )
    yield from serving(server)


def test_an_answer_that_finds_no_room_in_time_is_503_with_retry_after(
    slow_readers: GatewayThread,
) -> None:
    """Four GETs of an 8 MiB record (more than the sockets' buffers take) that nobody
    reads: each waits for the one before it to be taken or dropped (3 s), so that the later
    ones find no room within their 3 s."""
    client = Client(slow_readers.port, ANN)
    code = (
        "import os\nfor i in range(4):\n    open(f'f{i}', 'wb').write(os.urandom(1 << 20))\n"
        "print('x' * 2_000_000)"
    )
    record = client.run(code=code, return_files=["f*"])
    assert len(record["files"]) == 4 and all("content" in f for f in record["files"])
    request = headers_of("GET", f"/v1/runs/{record['id']}", ANN)
    socks = [connect(slow_readers.port, rcvbuf=4096) for _ in range(4)]
    try:
        for sock in socks:
            sock.sendall(request)
        firsts = [sock.recv(64) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert sum(first.startswith(b"HTTP/1.1 200") for first in firsts) >= 1, firsts
    refused = [first for first in firsts if first.startswith(b"HTTP/1.1 503")]
    assert refused, firsts


def test_answers_are_gzipped_when_asked(slow_readers: GatewayThread) -> None:
    client = Client(slow_readers.port, ANN)
    record = client.run(code="print('abc' * 200_000)")  # a large answer: made in the pool
    for path in (f"/v1/runs/{record['id']}", f"/v1/runs/{record['id']}/notebook"):
        plain = client.request("GET", path)
        zipped = client.request("GET", path, headers={"Accept-Encoding": "gzip"})
        assert plain.headers["Content-Encoding"] is None
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert "Accept-Encoding" in (zipped.headers["Vary"] or "")
        assert len(zipped.body) < len(plain.body) // 10
        assert json.loads(gzip.decompress(zipped.body)) == json.loads(plain.body)
    small = client.request("GET", "/openapi.json", headers={"Accept-Encoding": "gzip"})
    assert small.headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(small.body))["openapi"] == "3.1.0"


def test_answers_made_in_pieces_are_the_same_json() -> None:
    """`encode` hands the C encoder at most ~1 MiB at a time (it keeps the GIL for a whole
    call); the bytes are still `dumps_utf8`'s (a lone surrogate escaped as there)."""
    from gateway.handlers.encode import PIECE_BYTES, encode, encode_json
    from gateway.jsoncodec import dumps_utf8

    big = "é" * (3 * PIECE_BYTES)
    values = [
        {"a": big, "b": [1, 2.5, None, True, {"k": "x"}], "c": {"d": [big[:10]] * 3}},
        [{"i": i, "s": "z" * i} for i in range(3000)],
        {"cells": [{"id": f"c{i}", "source": ""} for i in range(200_000)] + [big]},
        {"x": "\ud800" * PIECE_BYTES * 2},
        "plain",
        [],
        {},
    ]
    for value in values:
        assert encode_json(value) == dumps_utf8(value)
        zipped = encode(value, True)
        if zipped.gzipped:
            assert gzip.decompress(b"".join(zipped.parts)) == dumps_utf8(value)
            assert zipped.size == sum(len(part) for part in zipped.parts)


# --- health --------------------------------------------------------------------------------------


def test_health_without_a_token_says_only_the_status(door: GatewayThread) -> None:
    for token in (None, "not-a-token-0123456789"):
        response = Client(door.port, token).request("GET", "/v1/health")
        assert response.status == 200 and response.json() == {"status": "ok"}


def test_health_tells_a_users_token_only_the_status(door: GatewayThread) -> None:
    response = Client(door.port, BOB).request("GET", "/v1/health")
    assert response.status == 200 and response.json() == {"status": "ok"}


def test_health_with_an_admins_token_has_the_details(door: GatewayThread) -> None:
    response = Client(door.port, OPS).request("GET", "/v1/health")
    body = response.json()
    assert response.status == 200 and body["status"] == "ok" and body["backend"] == "local"
    assert body["store"] == {"kind": "sqlite", "ok": True} and body["version"]
    assert set(body["kernels"]) == {"running", "pooled"} and isinstance(body["pools"], dict)


def test_a_single_user_gateway_tells_its_user_everything(local_client: Client) -> None:
    body = Client(local_client.port).request("GET", "/v1/health").json()
    assert {"status", "backend", "store", "kernels", "pools", "version"} <= set(body)
