"""WebSocket `/v1/stream` messages: what a client sends, and the events it gets back."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from gateway.models.base import Body
from gateway.models.run import RunBody

MAX_REF_CHARS = 256
Ref = Annotated[str, Field(max_length=MAX_REF_CHARS)] | int


class RunMessage(RunBody):
    """Start a run on this connection: the fields of POST /v1/runs, a `type` and a `ref`."""

    type: Literal["run"]
    ref: Ref | None = Field(None, description="the client's name for the run, echoed back")


class CancelMessage(Body):
    """Cancel a run by its `id`, or by the `ref` of a run of this connection."""

    type: Literal["cancel"]
    id: str | None = None
    ref: Ref | None = None


class AcceptedEvent(Body):
    type: Literal["accepted"] = "accepted"
    ref: Ref | None
    id: str


class OutputEvent(Body):
    type: Literal["output"] = "output"
    ref: Ref | None
    id: str
    output: dict[str, Any] = Field(description="an nbformat v4 output")
    display_id: str | None = None
    update: bool | None = Field(None, description="true: replaces the output of `display_id`")


class OutputDroppedEvent(Body):
    type: Literal["output_dropped"] = "output_dropped"
    ref: Ref | None
    id: str
    dropped: int = Field(description="live outputs not sent to a slow client (all are in `done`)")


class DoneEvent(Body):
    type: Literal["done"] = "done"
    ref: Ref | None
    id: str
    run: dict[str, Any] = Field(description="the final run record")


class ErrorEvent(Body):
    type: Literal["error"] = "error"
    ref: Ref | None = None
    id: str | None = None
    error: dict[str, Any]
    retry_after: int | None = None
