"""`GET /v1/runs`: a caller's runs, newest first, a page at a time; each run as a short
summary (`RunSummary`), kept by the stores beside the record so that a page never reads
the records themselves (each may be 64 MiB)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gateway.models.base import Answer
from gateway.models.common import Language, Status

FIRST_LINE_CHARS = 200
MAX_LIMIT = 100
DEFAULT_LIMIT = 20


class RunSummary(Answer):
    """One run of a listing: what a history shows; the whole record is at GET
    /v1/runs/{id} (a replay's notebook at GET /v1/runs/{id}/notebook)."""

    id: str
    status: Status
    language: Language
    kind: Literal["run", "notebook"] = Field(
        description="`run`: POST /v1/runs, a tool or a WebSocket `run`; `notebook`: a replay"
    )
    created_at: str = Field(
        json_schema_extra={"format": "date-time"}, description="when it was submitted"
    )
    started_at: str | None = Field(json_schema_extra={"format": "date-time"})
    finished_at: str | None = Field(json_schema_extra={"format": "date-time"})
    first_line: str = Field(
        description=f"the first line of its code (a replay: of its first code cell), at most "
        f"{FIRST_LINE_CHARS} characters; for an `entrypoint`, the command that ran it"
    )
    exit_code: int | None
    name: str | None = Field(
        None, description="a replay: the notebook's file name, when its request gave one"
    )
    continued_from: str | None = Field(
        None,
        description=(
            "the snapshot it started from (`from`), whose id names the run that kept it "
            "(`snap_<hex of that run's id>_...`): a front end shows a chain as one notebook"
        ),
    )


class RunList(Answer):
    """A page of the caller's runs, newest first (by submission; ties by id)."""

    runs: list[RunSummary]
    next: str | None = Field(
        description="pass as `cursor` for the next page (with the same `status`, `language` "
        "and `user`); null on the last page. Opaque: its form may change"
    )


def first_line(code: str) -> str:
    """The first non-empty line of `code`, at most `FIRST_LINE_CHARS` characters (only
    the head of `code` is looked at, however long it is)."""
    head = code[: FIRST_LINE_CHARS * 8]
    for line in head.splitlines():
        if line.strip():
            return line.strip()[:FIRST_LINE_CHARS]
    return ""


def summary_json(fields: dict[str, Any]) -> dict[str, Any]:
    """A summary from a record's stored fields (`RunRecord.to_storage()`, or a shallow view
    of it): small whatever the record's size."""
    return {
        "id": fields["id"],
        "status": fields["status"],
        "language": fields["language"],
        "kind": "notebook" if fields.get("kind") == "notebook" else "run",
        "created_at": fields["created_at"],
        "started_at": fields.get("started_at"),
        "finished_at": fields.get("finished_at"),
        "first_line": first_line(str(fields.get("code") or "")),
        "exit_code": fields.get("exit_code"),
        "name": fields.get("name"),
        "continued_from": fields.get("continued_from"),
    }
