"""What `GatewayClient` and `AsyncGatewayClient` share, written once: the gateway's URL,
the headers (the bearer token), each call's request, how its answer becomes a model or an
error (`gateway.client.refusals`), and how `wait` paces its looks (`Waiting`). Only sending
(and sleeping) differs between the two clients, as in httpx's `BaseClient`: each public
method of theirs builds a `Call` here and sends it.

Answers are read typed all the way down: a run record is a `TypedRunRecord`
(`gateway.models.typed`: the server's `RunRecord` with its error, charts, returned files and
timestamps as their models), a notebook an nbformat `NotebookNode`.
"""

from __future__ import annotations

import dataclasses
import json
import mimetypes
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, Required, Self, TypedDict, TypeVar

import nbformat
import pydantic
from nbformat import NotebookNode

from gateway.client.refusals import error_from_answer, is_error_answer, not_the_api
from gateway.models.answers import Health, RunAccepted, Upload
from gateway.models.common import Language, Status
from gateway.models.environment import Environment
from gateway.models.typed import TypedRunList, TypedRunRecord, TypedSnapshotList, TypedUsageList
from gateway.version import __version__

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)

DEFAULT_TIMEOUT = 360.0  # seconds to wait for an answer: longer than the largest run timeout
USER_AGENT = f"kernel-gateway-client/{__version__}"

ARCHIVE_TYPES = {
    ".zip": "application/zip",
    ".tgz": "application/gzip",
    ".gz": "application/gzip",
}


class FileSpec(TypedDict, total=False):
    """A file written into the run's working folder before it runs (API.md `files`)."""

    path: Required[str]
    content: str
    encoding: Literal["utf-8", "base64"]


class RunOptions(TypedDict, total=False):
    """The fields of `POST /v1/runs` besides `code` (API.md); what is left out is the
    gateway's default."""

    language: Language
    timeout: float
    files: Sequence[FileSpec]
    entrypoint: str
    archive: str
    vars: Mapping[str, Any]
    env: Mapping[str, str]
    return_files: Sequence[str]
    network: bool
    working_dir: str
    keep: bool  # keep the kernel's final state as a snapshot (the record's `snapshot`)
    continue_from: str  # a snapshot's id to start from (the body's `from`)
    rebuild: bool  # with continue_from: replay its chain where it cannot be forked
    keep_files: bool  # keep the staged `files` with the caller's uploads (`files_given`)
    files_from: str  # stage the files this earlier run was given and kept (410 FilesGone)


class NotebookOptions(TypedDict, total=False):
    """The fields of `POST /v1/notebooks/run` besides `notebook` (API.md)."""

    timeout: float
    cell_timeout: float
    allow_errors: bool
    files: Sequence[FileSpec]
    return_files: Sequence[str]
    vars: Mapping[str, Any]
    env: Mapping[str, str]
    network: bool
    name: str  # the notebook's file name, kept in the record (`name`) and the listing
    keep_files: bool
    files_from: str


class ListQuery(TypedDict, total=False):
    """The query of `GET /v1/runs` (API.md): a page of the caller's runs, newest first."""

    limit: int
    cursor: str | None
    status: Status | None
    language: Language | None
    user: str | None


def notebook_node(value: Any) -> NotebookNode:
    """A notebook's JSON as nbformat's `NotebookNode` (a dict whose keys are attributes too:
    `nb.cells[0].outputs`), as `nbformat.read` gives it; the gateway validated it."""
    if not isinstance(value, dict):
        raise ValueError("a notebook is a JSON object")
    node: NotebookNode = nbformat.from_dict(value)
    return node


Notebook = Annotated[NotebookNode, pydantic.BeforeValidator(notebook_node)]


class NotebookResult(pydantic.BaseModel):
    """The answer of `POST /v1/notebooks/run`: the executed notebook (nbformat v4, as a
    `NotebookNode`) and the run record of the whole replay."""

    model_config = pydantic.ConfigDict(extra="ignore", arbitrary_types_allowed=True)

    notebook: Notebook
    run: TypedRunRecord


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One call of the API: the request to send, and how its answer is read."""

    method: str
    path: str
    read: Callable[[int, bytes], T]  # (status, body) of an answer in `answers` -> the value
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    answers: frozenset[int] = frozenset({200, 201, 202})

    def answer(self, status: int, body: bytes, retry_after: str | None) -> T:
        """The call's value for this answer, or the error it is."""
        if status >= 400 and (status not in self.answers or is_error_answer(body)):
            raise error_from_answer(status, body, retry_after)
        if status in self.answers:
            return self.read(status, body)
        raise not_the_api(status, f"HTTP {status}")


def model_reader(model: type[M]) -> Callable[[int, bytes], M]:
    def read(status: int, body: bytes) -> M:
        try:
            return model.model_validate_json(body)
        except pydantic.ValidationError as exc:
            raise not_the_api(status, f"not a {model.__name__}: {_first_problem(exc)}") from None

    return read


def json_object(status: int, body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise not_the_api(status, "not a JSON object")
    return value


def read_notebook(status: int, body: bytes) -> NotebookNode:
    try:
        return notebook_node(json_object(status, body))
    except ValueError:
        raise not_the_api(status, "not a notebook") from None


def text(status: int, body: bytes) -> str:
    return body.decode("utf-8", "replace")


def _first_problem(exc: pydantic.ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _plain(value: Any) -> Any:
    """Sequences and mappings as JSON lists and objects."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(item) for item in value]
    return value


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class BaseGatewayClient:
    """The configuration of a client and the calls of the API, without any I/O."""

    def __init__(
        self, url: str, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Expected an http:// or https:// URL, not {url!r}.")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def headers(self) -> dict[str, str]:
        """Sent with every request, the WebSocket handshake included."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    @property
    def stream_url(self) -> str:
        """`ws://` (or `wss://`) address of `/v1/stream` on this gateway."""
        parts = urllib.parse.urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path + "/v1/stream", "", ""))

    # --- runs -------------------------------------------------------------------------

    def _run(self, code: str | None, options: RunOptions) -> Call[TypedRunRecord]:
        body = run_body(code, options)
        return Call("POST", "/v1/runs", model_reader(TypedRunRecord), json=body)

    def _start(self, code: str | None, options: RunOptions) -> Call[RunAccepted]:
        body = {**run_body(code, options), "background": True}
        return Call("POST", "/v1/runs", model_reader(RunAccepted), json=body)

    def _get_run(self, run_id: str) -> Call[TypedRunRecord]:
        return Call("GET", f"/v1/runs/{_quote(run_id)}", model_reader(TypedRunRecord))

    def _cancel(self, run_id: str) -> Call[TypedRunRecord]:
        return Call("DELETE", f"/v1/runs/{_quote(run_id)}", model_reader(TypedRunRecord))

    def _list_runs(self, query: ListQuery) -> Call[TypedRunList]:
        params = {k: str(v) for k, v in query.items() if v is not None}
        path = "/v1/runs" + ("?" + urllib.parse.urlencode(params) if params else "")
        return Call("GET", path, model_reader(TypedRunList))

    def _notebook(self, run_id: str) -> Call[NotebookNode]:
        return Call("GET", f"/v1/runs/{_quote(run_id)}/notebook", read_notebook)

    def _run_notebook(
        self, notebook: Mapping[str, Any], options: NotebookOptions
    ) -> Call[NotebookResult]:
        body = notebook_body(notebook, options)
        return Call("POST", "/v1/notebooks/run", model_reader(NotebookResult), json=body)

    # --- the WebSocket's messages -----------------------------------------------------

    def _run_message(self, code: str | None, options: RunOptions) -> dict[str, Any]:
        return {"type": "run", "ref": "run", **run_body(code, options)}

    def _notebook_message(
        self, notebook: Mapping[str, Any], options: NotebookOptions
    ) -> dict[str, Any]:
        return {"type": "notebook", "ref": "notebook", **notebook_body(notebook, options)}

    # --- uploads and operations -------------------------------------------------------

    def _upload(self, archive: str | os.PathLike[str] | bytes, filename: str) -> Call[Upload]:
        if isinstance(archive, bytes):
            data, name = archive, filename
        else:
            path = Path(archive)
            data, name = path.read_bytes(), filename or path.name
        media = ARCHIVE_TYPES.get(Path(name).suffix.lower()) or (
            mimetypes.guess_type(name)[0] if name else None
        )
        headers = {"Content-Type": media or "application/octet-stream"}
        return Call("POST", "/v1/uploads", model_reader(Upload), content=data, headers=headers)

    def _health(self) -> Call[Health]:
        # 503 with a Health body is an answer (`store_unavailable`: not ready for runs);
        # 503 with an error body is an error (too many connections)
        return Call("GET", "/v1/health", model_reader(Health), answers=frozenset({200, 503}))

    def _environment(self) -> Call[Environment]:
        return Call("GET", "/v1/environment", model_reader(Environment))

    def _metrics(self) -> Call[str]:
        return Call("GET", "/metrics", text, headers={"Accept": "text/plain"})

    def _openapi(self) -> Call[dict[str, Any]]:
        return Call("GET", "/openapi.json", json_object)

    # --- snapshots --------------------------------------------------------------------

    def _list_snapshots(self) -> Call[TypedSnapshotList]:
        return Call("GET", "/v1/snapshots", model_reader(TypedSnapshotList))

    def _usage(self, user: str | None) -> Call[TypedUsageList]:
        query = "" if user is None else "?" + urllib.parse.urlencode({"user": user})
        return Call("GET", "/v1/usage" + query, model_reader(TypedUsageList))

    def _delete_snapshot(self, snapshot_id: str) -> Call[None]:
        path = f"/v1/snapshots/{_quote(snapshot_id)}"
        return Call("DELETE", path, _nothing, answers=frozenset({204}))


def _nothing(status: int, body: bytes) -> None:
    return None


class Waiting:
    """How `wait(run_id)` paces its looks at a background run (`GET /v1/runs/{id}`; the API
    has no long poll): soon at first, then less and less often, at most `LONGEST` seconds
    apart, and never sooner than a `Retry-After` asks; `TimeoutError` past `timeout`."""

    FIRST, GROWTH, LONGEST = 0.05, 1.5, 1.0

    def __init__(self, run_id: str, timeout: float | None) -> None:
        self.run_id = run_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._delay = self.FIRST

    def pause(self, retry_after: float | None = None) -> float:
        """Seconds to sleep before the next look; `TimeoutError` when none is left."""
        delay = self._delay if retry_after is None else max(retry_after, self._delay)
        self._delay = min(self._delay * self.GROWTH, self.LONGEST)
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"The run {self.run_id} was not done after {self.timeout:g} s; it goes on "
                    "(wait again, or cancel it)."
                )
            delay = min(delay, left)
        return delay


def run_body(code: str | None, options: RunOptions) -> dict[str, Any]:
    """The JSON body of a run (`POST /v1/runs`, or a WebSocket `run` message's fields)."""
    body: dict[str, Any] = _plain(options)
    if "continue_from" in body:  # `from` is a Python keyword: not an option's name
        body["from"] = body.pop("continue_from")
    if code is not None:
        body["code"] = code
    return body


def notebook_body(notebook: Mapping[str, Any], options: NotebookOptions) -> dict[str, Any]:
    """The JSON body of a replay (`POST /v1/notebooks/run`, or a WebSocket `notebook`
    message's fields)."""
    return {"notebook": _plain(notebook), **_plain(options)}


class AsyncClosing:
    """Closed by `aclose()`, which leaving an `async with` block calls, however it is left."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
