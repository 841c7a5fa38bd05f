"""The HTTP server: tornado's, with a cap on open connections, and the timeouts that keep a
slow or greedy client from holding the gateway's connections and memory.

- `header_timeout`: a connection must deliver a request's complete headers within this
  many seconds of being opened or of its previous answer, however it trickles them (one
  byte a second is cut at the deadline, not kept alive by each byte). So it is also how
  long an idle keep-alive connection is kept.
- `body_timeout`: the whole body must arrive within this many seconds of the headers.
- `write_timeout`: a client must take a finished answer within this many seconds (see
  `BaseHandler.finish`), else the connection is closed and the answer dropped.
- `max_connections`: a connection past the cap is answered 503 at once and closed, so that
  a flood of idle connections costs the gateway no more than the cap in sockets. An
  upgraded WebSocket no longer counts here; `max_streams_per_user` bounds those.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import tornado.httpserver
import tornado.iostream

log = logging.getLogger(__name__)

_REFUSAL = json.dumps(
    {
        "error": {
            "code": "capacity",
            "message": "The gateway has too many open connections; try again shortly.",
        }
    }
).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json; charset=utf-8\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_REFUSAL)).encode() + b"\r\n\r\n" + _REFUSAL
)


class GatewayHTTPServer(tornado.httpserver.HTTPServer):
    """`HTTPServer` that keeps at most `max_connections` connections open (0: no cap)."""

    def initialize(self, *args: Any, max_connections: int = 0, **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self.open_connections = 0
        self.refused_connections = 0

    def handle_stream(self, stream: tornado.iostream.IOStream, address: tuple[Any, ...]) -> None:
        if self.max_connections and self.open_connections >= self.max_connections:
            self.refused_connections += 1
            if self.refused_connections in (1, 10, 100) or self.refused_connections % 1000 == 0:
                log.warning(
                    "%d connections refused so far: %d are open (max_connections)",
                    self.refused_connections,
                    self.open_connections,
                )
            _refuse(stream)
            return
        self.open_connections += 1
        super().handle_stream(stream, address)

    def on_close(self, server_conn: object) -> None:
        self.open_connections -= 1
        super().on_close(server_conn)


def _refuse(stream: tornado.iostream.IOStream) -> None:
    """Answer 503 and close once it is written (a small write: the socket takes it)."""

    def close(written: Any) -> None:
        written.exception()  # retrieved: a client gone already is no error
        stream.close()

    try:
        stream.write(REFUSAL).add_done_callback(close)
    except tornado.iostream.StreamClosedError:
        stream.close()
