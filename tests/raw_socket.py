"""A plain TCP connection to a gateway on this machine, for tests that speak HTTP byte by byte
(half-sent bodies, answers left unread) where a client library would hide what they test."""

from __future__ import annotations

import socket


def connect(port: int, rcvbuf: int | None = None, timeout: float = 30) -> socket.socket:
    """A socket connected to 127.0.0.1:`port`; `rcvbuf` sets its receive buffer first (small:
    what the test does not read stays at the gateway); `timeout` bounds each call."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    return sock
