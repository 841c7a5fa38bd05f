"""A small typed, blocking client for the gateway's HTTP API (standard library only).

Used by the command line, the MCP server and the tests:

    client = GatewayClient("http://127.0.0.1:8888", token="...")
    record = client.run("print(1)")            # the run record, a dict (API.md)
    client.get_run(record["id"]), client.notebook(record["id"])

Every error answer of the gateway (`{"error": {code, message, field?}}`) is raised as a
`GatewayClientError`; a gateway that cannot be reached is one too, with `status` 0 and
code `unreachable`. The client holds no connection between calls, so one instance may be
shared between threads. Async code calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import http.client
import json
import mimetypes
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_TIMEOUT", "GatewayClient", "GatewayClientError"]

DEFAULT_TIMEOUT = 360.0  # seconds to wait for an answer: longer than the largest run timeout

_ARCHIVE_TYPES = {
    ".zip": "application/zip",
    ".tgz": "application/gzip",
    ".gz": "application/gzip",
}


class GatewayClientError(Exception):
    """An error answer of the gateway, or no answer at all (`status` 0)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


class GatewayClient:
    """Blocking calls to one gateway at `url` (`http://host:port`, optionally with a prefix)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Expected an http:// or https:// URL, not {url!r}.")
        self.url = url
        self.token = token
        self.timeout = timeout
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")

    def __repr__(self) -> str:
        return f"GatewayClient({self.url!r})"

    # --- runs -------------------------------------------------------------------------

    def run(self, code: str, language: str = "python", **fields: Any) -> dict[str, Any]:
        """`POST /v1/runs`: run code in a fresh kernel and return its run record.

        `fields` are the other request fields of API.md (`timeout`, `files`,
        `return_files`, `vars`, `env`, `background`, ...). With `background=True` the
        answer is `{id, status}`: poll `get_run`.
        """
        body = {"code": code, "language": language, **fields}
        return self._object(self.request("POST", "/v1/runs", body))

    def get_run(self, run_id: str) -> dict[str, Any]:
        """`GET /v1/runs/{id}`: the run record (status `queued` or `running` while it runs)."""
        return self._object(self.request("GET", f"/v1/runs/{_quote(run_id)}"))

    def cancel(self, run_id: str) -> dict[str, Any]:
        """`DELETE /v1/runs/{id}`: cancel a queued or running run; its record afterwards."""
        return self._object(self.request("DELETE", f"/v1/runs/{_quote(run_id)}"))

    def notebook(self, run_id: str) -> dict[str, Any]:
        """`GET /v1/runs/{id}/notebook`: the run as an nbformat v4 notebook (a dict)."""
        return self._object(self.request("GET", f"/v1/runs/{_quote(run_id)}/notebook"))

    def run_notebook(self, nb: Mapping[str, Any], **opts: Any) -> dict[str, Any]:
        """`POST /v1/notebooks/run`: run every code cell of `nb` in one fresh kernel.

        `opts` are `timeout`, `cell_timeout`, `allow_errors`, `files`, `return_files`;
        without any, the notebook itself is the body.
        """
        body: Any = {"notebook": dict(nb), **opts} if opts else dict(nb)
        return self._object(self.request("POST", "/v1/notebooks/run", body))

    # --- uploads and operations -------------------------------------------------------

    def upload(self, archive: str | os.PathLike[str] | bytes, filename: str = "") -> dict[str, Any]:
        """`POST /v1/uploads`: send a .zip or .tar.gz (a path, or its bytes); `{id, ...}`.

        The media type comes from the file name (`filename` for bytes): `application/zip`
        for .zip, `application/gzip` for .tar.gz/.tgz, else `application/octet-stream`.
        """
        if isinstance(archive, bytes):
            data, name = archive, filename
        else:
            path = Path(archive)
            data, name = path.read_bytes(), filename or path.name
        media = _ARCHIVE_TYPES.get(Path(name).suffix.lower()) or (
            mimetypes.guess_type(name)[0] if name else None
        )
        headers = {"Content-Type": media or "application/octet-stream"}
        return self._object(self.request("POST", "/v1/uploads", data=data, headers=headers))

    def health(self) -> dict[str, Any]:
        """`GET /v1/health`: `{status, backend, kernels: {running, pooled}, version}`."""
        return self._object(self.request("GET", "/v1/health"))

    def metrics(self) -> str:
        """`GET /metrics`: the Prometheus text."""
        answer = self.request("GET", "/metrics")
        return answer if isinstance(answer, str) else json.dumps(answer)

    def openapi(self) -> dict[str, Any]:
        """`GET /openapi.json`: the OpenAPI 3.1 document of the API."""
        return self._object(self.request("GET", "/openapi.json"))

    # --- the one place that speaks HTTP -----------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send one request; the decoded JSON answer (text for non-JSON answers).

        `body` is sent as JSON; `data` as raw bytes (set `Content-Type` in `headers`).
        Raises `GatewayClientError` for any status of 400 or more, or no answer.
        """
        all_headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            all_headers["Content-Type"] = "application/json"
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        all_headers.update(headers or {})
        connection_class = (
            http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        )
        connection = connection_class(
            self._host, self._port, timeout=self.timeout if timeout is None else timeout
        )
        try:
            connection.request(method, self._prefix + path, body=data, headers=all_headers)
            response = connection.getresponse()
            status, payload = response.status, response.read()
            content_type = response.getheader("Content-Type", "")
            retry_after = response.getheader("Retry-After")
        except (OSError, http.client.HTTPException) as exc:
            raise GatewayClientError(
                0, "unreachable", f"No answer from the gateway at {self.url}: {exc}"
            ) from exc
        finally:
            connection.close()
        decoded = _decode(payload, content_type)
        if status >= 400:
            raise _error_from(status, decoded, retry_after)
        return decoded

    @staticmethod
    def _object(answer: Any) -> dict[str, Any]:
        if not isinstance(answer, dict):
            raise GatewayClientError(0, "bad_answer", "The gateway did not answer a JSON object.")
        return answer


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _decode(payload: bytes, content_type: str) -> Any:
    media = content_type.split(";")[0].strip().lower()
    text = payload.decode("utf-8", "replace")
    if media == "application/json" or media.endswith("+json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def _error_from(status: int, answer: Any, retry_after: str | None) -> GatewayClientError:
    error = answer.get("error") if isinstance(answer, dict) else None
    try:
        retry = float(retry_after) if retry_after is not None else None
    except ValueError:
        retry = None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        field = error.get("field")
        return GatewayClientError(
            status,
            error["code"],
            str(error.get("message", "")),
            field if isinstance(field, str) else None,
            retry,
        )
    text = answer if isinstance(answer, str) else json.dumps(answer)
    return GatewayClientError(status, "http_error", f"HTTP {status}: {text[:500]}", None, retry)
