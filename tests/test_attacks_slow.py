"""Slow and greedy HTTP clients (issue 8, item 10): headers one byte a second, a body that
never comes, connections that never send, answers never read, a thousand connections.
The HTTP server is the same whatever the backend: one (local) covers it.

Every wait here is for an event (the gateway closing a connection, a gauge dropping), with
a generous bound far above the gateway's timeouts; the timeouts are what the test makes
short, not the waits."""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import start_gateway
from tests.raw_socket import connect
from tests.support import GatewayThread, serving, wait_for

pytestmark = [pytest.mark.attack, pytest.mark.serial]  # times answers, measures memory

HEADER_TIMEOUT, BODY_TIMEOUT, WRITE_TIMEOUT = 2.0, 2.0, 3.0
MAX_CONNECTIONS = 40


@pytest.fixture(scope="module")
def strict() -> Iterator[GatewayThread]:
    server = start_gateway(
        "local",
        header_timeout=HEADER_TIMEOUT,
        body_timeout=BODY_TIMEOUT,
        write_timeout=WRITE_TIMEOUT,
        max_connections=MAX_CONNECTIONS,
    )
    yield from serving(server)


def closed_by_gateway(sock: socket.socket) -> bool:
    """Read until the gateway closes; True for EOF, False if it kept the socket 30 s."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def open_connections(server: GatewayThread) -> int:
    """The gateway's gauge of open HTTP connections (this request is one of them)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    match = re.search(r"^gateway_http_connections (\S+)$", text, re.M)
    assert match, text
    return int(float(match[1])) - 1


def health(server: GatewayThread) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/v1/health")
        return conn.getresponse().status
    finally:
        conn.close()


def test_headers_one_byte_at_a_time_are_cut_at_the_header_timeout(strict: GatewayThread) -> None:
    """Each byte used to restart nothing and the deadline was an hour: a slowloris client
    kept its connection as long as it liked."""
    header = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 60 + b"\r\n\r\n"
    sock = connect(strict.port)
    sent = 0
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for byte in header:  # 90 bytes, one every 0.5 s: 45 s, far past the timeout
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.5)
        assert sent < len(header), "the gateway read the whole trickled header"
        assert closed_by_gateway(sock)
    finally:
        sock.close()


def test_a_body_that_never_comes_is_cut_at_the_body_timeout(strict: GatewayThread) -> None:
    with connect(strict.port) as sock:
        sock.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"code": "'
        )
        assert closed_by_gateway(sock), "the gateway kept waiting for the body"


def test_connections_that_never_send_are_closed(strict: GatewayThread) -> None:
    socks = [connect(strict.port) for _ in range(10)]
    try:
        assert all(closed_by_gateway(sock) for sock in socks)
    finally:
        for sock in socks:
            sock.close()
    assert wait_for(lambda: open_connections(strict) == 0, timeout=30)


def test_an_answer_never_read_is_dropped_at_the_write_timeout(strict: GatewayThread) -> None:
    """A finished answer used to wait for its client for ever, in the gateway's memory."""
    client = strict.client()
    # ~9 MB as a record: more than the two sockets' buffers can take between them
    code = "from IPython.display import HTML, display\ndisplay(HTML('h' * 6_000_000))\n"
    record = client.run(code=code + "print('x' * 1_000_000, end='')")
    with connect(strict.port, rcvbuf=4096) as sock:
        sock.sendall(f"GET /v1/runs/{record['id']} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        # not reading: the answer sits in the gateway until it gives up on us
        assert wait_for(lambda: open_connections(strict) == 0, timeout=60), (
            "the gateway still holds the connection of a client that reads nothing"
        )
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 20):
                received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head, re.I)[1])  # type: ignore[index]
    assert len(body) < length, "the whole answer was still there"


def test_a_thousand_connections_are_capped_and_the_gateway_recovers(
    strict: GatewayThread,
) -> None:
    """1000 connections that send nothing: 40 are kept (until the header timeout), every
    other one is answered 503 at once; then the gateway answers again."""
    socks: list[socket.socket] = []
    try:
        started = time.monotonic()
        for _ in range(1000):
            socks.append(connect(strict.port))
        # a kept connection frees its place at the header timeout, for a later one
        rounds = int((time.monotonic() - started) / HEADER_TIMEOUT) + 1
        answers = []
        for sock in socks:
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    data += chunk
            answers.append(data)
    finally:
        for sock in socks:
            sock.close()
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    closed_silently = [a for a in answers if a == b""]
    kept_at_most = MAX_CONNECTIONS * rounds
    assert len(refused) >= 1000 - kept_at_most, (len(refused), len(closed_silently), rounds)
    assert len(refused) + len(closed_silently) == 1000
    assert b'"code": "capacity"' in refused[0] and b"Retry-After: 1" in refused[0]
    assert wait_for(lambda: health(strict) == 200, timeout=30)
