"""The gateway's Python client: typed, blocking (`GatewayClient`) or asyncio
(`AsyncGatewayClient`), over the HTTP API and the WebSocket (docs/API.md).

    from gateway.client import GatewayClient, RateLimited

    with GatewayClient("http://127.0.0.1:8888", token="...") as client:
        record = client.run("print(6 * 7)", timeout=20)    # a gateway.models RunRecord
        record.stdout, record.status, record.charts

    async with AsyncGatewayClient(url, token=token) as client:
        async with client.stream_run("print(1)") as run:   # live events over the WebSocket
            async for event in run:
                ...

Answers are the `gateway.models` types (`RunRecord`, `RunAccepted`, `Health`, `Upload`,
`RunList` of `list_runs`; `Environment`; `NotebookResult` for a replay). Error answers are
raised as the classes the server raised them as, of the gateway's one exception tree
(`gateway.errors`: `InvalidRequest` with `field`, `RateLimited` with `retry_after`, ...);
no answer at all is `Unreachable`. The package is also
the home of `gateway run` (`run.py`) and `gateway mcp` (`mcp.py`); it imports nothing of the
server.
"""

from gateway.client.base import (
    DEFAULT_TIMEOUT,
    FileSpec,
    ListQuery,
    NotebookOptions,
    NotebookResult,
    RunOptions,
)
from gateway.client.clients import AsyncGatewayClient, GatewayClient
from gateway.client.parts import returned_files, run_charts, run_error
from gateway.client.sessions import AsyncSession, Session
from gateway.client.stream import RunStream, StreamEvent
from gateway.errors import (
    FilesGone,
    Forbidden,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    SnapshotElsewhere,
    SnapshotGone,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
    Unreachable,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncGatewayClient",
    "AsyncSession",
    "FileSpec",
    "FilesGone",
    "Forbidden",
    "GatewayClient",
    "GatewayError",
    "InvalidRequest",
    "ListQuery",
    "NotFound",
    "NotebookOptions",
    "NotebookResult",
    "PayloadTooLarge",
    "RateLimited",
    "RunOptions",
    "RunStream",
    "ServerError",
    "Session",
    "SnapshotElsewhere",
    "SnapshotGone",
    "StreamEvent",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "Unreachable",
    "returned_files",
    "run_charts",
    "run_error",
]
