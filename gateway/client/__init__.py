"""The gateway's Python client: typed, blocking (`GatewayClient`) or asyncio
(`AsyncGatewayClient`), over the HTTP API and the WebSocket (docs/API.md).

    from gateway.client import GatewayClient, RateLimited

    with GatewayClient("http://127.0.0.1:8888", token="...") as client:
        record = client.run("print(6 * 7)", timeout=20)    # a TypedRunRecord
        record.stdout, record.status, record.started_at    # a datetime
        record.error.ename, record.charts[0].spec.title    # RunError, Chart: models too
        with client.stream_run("print(1)") as run:         # live events over the WebSocket
            for event in run:
                ...
        client.wait(client.start("print(2)").id)           # a background run, once done

    async with AsyncGatewayClient(url, token=token) as client:
        async with client.stream_run("print(1)") as run:
            async for event in run:
                ...

Answers are the `gateway.models` types, typed all the way down (`TypedRunRecord`: the
server's `RunRecord` with its error, charts, returned files and timestamps as their models,
`gateway.models.typed`; `RunAccepted`, `Health`, `Upload`, `TypedRunList` of `list_runs`;
`Environment`; `NotebookResult` for a replay; nbformat's `NotebookNode` for a notebook;
the run's events of `stream_run` as `gateway.models.stream` events). Error answers are
raised as the classes the server raised them as, of the gateway's one exception tree
(`gateway.errors`: `InvalidRequest` with `field`, `RateLimited` with `retry_after`, ...);
no answer at all is `Unreachable`. `gateway run` and `gateway mcp` (`gateway.commands`)
are built on it; it imports nothing of the server.
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
from gateway.client.stream import AsyncRunStream, RunStream, StreamEvent
from gateway.errors import (
    FilesGone,
    Forbidden,
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ServerError,
    SnapshotElsewhere,
    SnapshotGone,
    Unauthorized,
    Unavailable,
    UnexpectedAnswer,
    Unreachable,
)
from gateway.models.typed import TypedRunList, TypedRunRecord

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncGatewayClient",
    "AsyncRunStream",
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
    "QuotaExceeded",
    "RateLimited",
    "RunOptions",
    "RunStream",
    "ServerError",
    "Session",
    "SnapshotElsewhere",
    "SnapshotGone",
    "StreamEvent",
    "TypedRunList",
    "TypedRunRecord",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "Unreachable",
    "returned_files",
    "run_charts",
    "run_error",
]
