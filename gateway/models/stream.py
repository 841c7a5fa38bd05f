"""WebSocket `/v1/stream` messages: what a client sends, and the events it gets back."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from gateway.models.answers import ErrorBody
from gateway.models.base import Answer, Body, component
from gateway.models.run import RunBody

MAX_REF_CHARS = 256
Ref = Annotated[str, Field(max_length=MAX_REF_CHARS)] | int
REF = f"the client's name for a run (at most {MAX_REF_CHARS} characters, or an integer)"


class RunMessage(RunBody):
    """client -> gateway: start a run. The fields of POST /v1/runs (validated the same way)
    plus `type` and `ref`; `ref` is echoed in every message about the run and must not name
    a run of this connection still in progress. `background` has no effect here."""

    type: Literal["run"]
    ref: Ref | None = Field(None, description=REF)


class CancelMessage(Body):
    """client -> gateway: cancel a run (by `id`, or by the `ref` of a run of this
    connection); its `done` message follows with `status: cancelled`. An unknown id is an
    `error` message with code not_found."""

    type: Literal["cancel"]
    id: str | None = None
    ref: Ref | None = Field(None, description=REF)


class Event(Answer):
    ref: Ref | None = Field(description=REF)
    id: str


class AcceptedEvent(Event):
    """gateway -> client: the run was admitted and has this id."""

    type: Literal["accepted"]


CLEAR_OUTPUT = {
    "type": "object",
    "required": ["output_type"],
    "properties": {"output_type": {"const": "clear_output"}, "wait": {"type": "boolean"}},
}


class OutputEvent(Event):
    """gateway -> client: one nbformat output as it is produced (a stream chunk arrives
    before the run ends). With `display_id`, `update: true` replaces the earlier display of
    that id. `{"output_type": "clear_output"}` clears what was shown. Live output stops at
    the run record's caps; the `done` record has the kept head and tail."""

    type: Literal["output"]
    output: Annotated[
        dict[str, Any],
        WithJsonSchema({"anyOf": [{"$ref": "#/components/schemas/Output"}, CLEAR_OUTPUT]}),
    ]
    display_id: str | None = None
    update: Literal[True] | None = None


class OutputDroppedEvent(Event):
    """gateway -> client: this many live outputs of the run were skipped because the client
    read too slowly (the `done` record still has them, within its caps)."""

    type: Literal["output_dropped"]
    dropped: int = Field(ge=1)


class DoneEvent(Event):
    """gateway -> client: the run ended; `run` is its full record."""

    type: Literal["done"]
    run: Annotated[dict[str, Any], component("RunRecord")]


class ErrorEvent(Answer):
    """gateway -> client: a message was malformed or refused, with the codes of the HTTP
    errors (invalid_request, unsupported_language, not_found, capacity, ...). `ref` (null
    when the message had no valid one) and `id` are echoed; `retry_after` (seconds) comes
    with `capacity`. The connection stays open."""

    type: Literal["error"]
    ref: Ref | None = Field(description=REF)
    id: str | None = None
    error: ErrorBody
    retry_after: int | None = Field(None, ge=1)
