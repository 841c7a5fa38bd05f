"""Helpers every test module shares: the API's error shape, token files, waiting for a
background run, and runs that take a pooled kernel on purpose."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.support import Client, Response, wait_for

_ANY = object()

FINAL = ("succeeded", "failed", "timed_out", "killed", "cancelled")


def assert_error(
    response: Response,
    status: int,
    code: str,
    *mentions: str,
    field: Any = _ANY,
) -> dict[str, Any]:
    """The API's error answer: JSON `{"error": {code, message, field?}}` with this status and
    code, a non-empty message naming each of `mentions`, and (if given) this `field`."""
    assert response.status == status, (response.status, response.body[:1000])
    assert (response.headers["Content-Type"] or "").startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) <= {"code", "message", "field"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"], error
    for mention in mentions:
        assert mention in error["message"], error
    if field is not _ANY:
        assert error.get("field") == field, error
    return error


def poll_run(
    client: Client,
    run_id: str,
    until: Callable[[dict[str, Any]], bool] = lambda r: r["status"] in FINAL,
    timeout: float = 60,
) -> dict[str, Any]:
    """GET the run until `until(record)` holds (by default: it is final); the record then."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.request("GET", f"/v1/runs/{run_id}")
        assert response.status == 200, response.body[:500]
        record: dict[str, Any] = response.json()
        if until(record):
            return record
        assert time.monotonic() < deadline, f"gave up waiting after {timeout} s: {record}"
        time.sleep(0.1)


def notebook_json(*cells: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """An nbformat 4.5 notebook (as JSON) of these cells."""
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": metadata or {}, "cells": list(cells)}


def code_cell_json(cell_id: str, source: str, tags: list[str] | None = None) -> dict[str, Any]:
    """A code cell (as JSON), never run."""
    return {
        "cell_type": "code",
        "id": cell_id,
        "metadata": {"tags": tags} if tags else {},
        "source": source,
        "outputs": [],
        "execution_count": None,
    }


def code_notebook(*cells: tuple[str, list[str]]) -> dict[str, Any]:
    """An nbformat 4.5 notebook (as JSON) of code cells `c0`, `c1`, ... given as
    (source, tags), never run."""
    return notebook_json(
        *(code_cell_json(f"c{i}", source, tags) for i, (source, tags) in enumerate(cells))
    )


def truncation_marker(dropped: int) -> str:
    """What stands for the middle a cap cut out of a text (API.md, the run record's
    `*_truncated`): a line of its own naming the bytes of UTF-8 left out."""
    return f"\n[... {dropped} bytes truncated ...]\n"


def submit(client: Client, body: dict[str, Any]) -> str:
    """POST a background run; its id."""
    response = client.request("POST", "/v1/runs", {**body, "background": True})
    assert response.status == 202, response.body[:1000]
    return str(response.json()["id"])


# --- the warm pools, as /v1/health tells them ----------------------------------------------


def pools(client: Client) -> dict[str, Any]:
    pools: dict[str, Any] = client.request("GET", "/v1/health").json()["pools"]
    return pools


def full(client: Client) -> bool:
    return all(p["ready"] == p["size"] for p in pools(client).values())


KERNEL = {"python": "ipykernel", "bash": "bash", "javascript": "deno", "typescript": "deno"}


def take(client: Client, code: str, language: str = "python", **body: Any) -> dict[str, Any]:
    """A run that takes a ready pooled kernel (waits for the pool to be full first)."""
    assert wait_for(lambda: full(client), timeout=120), pools(client)
    kind = KERNEL[language]
    hits = pools(client)[kind]["hits"]
    record = client.run(code=code, language=language, **body)
    assert pools(client)[kind]["hits"] == hits + 1, "the run did not take a pooled kernel"
    return record
