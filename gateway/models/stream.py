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
# client -> gateway `notebook` (a replay): `gateway.models.notebook.NotebookMessage`, beside
# the body it extends (the client side imports these events, not nbformat)


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
    index: int | None = Field(
        None,
        ge=0,
        description="a notebook replay's: the place of the output's cell in the notebook's "
        "`cells` (markdown cells counted), as in `cell_started`",
    )


class OutputDroppedEvent(Event):
    """gateway -> client: this many live events of the run (outputs; in a replay also
    `cell_started` and `cell_finished`) were skipped because the client read too slowly
    (the `done` record, and a replay's `notebook`, still have them, within their caps)."""

    type: Literal["output_dropped"]
    dropped: int = Field(ge=1)


class DoneEvent(Event):
    """gateway -> client: the run ended; `run` is its full record. A notebook replay's
    `done` also has `notebook`, the executed notebook (every cell that ran with its outputs
    and execution count; after a cancel, the cells run so far)."""

    type: Literal["done"]
    run: Annotated[dict[str, Any], component("RunRecord")]
    notebook: Annotated[dict[str, Any], component("Notebook")] | None = Field(
        None,
        description="a notebook replay's executed notebook; null (with a note in `run`) when "
        "even its cells without outputs are over `max_event_bytes`: it is at GET "
        "/v1/runs/{id}/notebook",
    )


# How a cell ended (`gateway.execution.events.CellStatus`).
CellStatus = Literal["ok", "error", "timeout", "cancelled", "died", "output_limit", "exited"]
CELL_STATUS = (
    "`ok`; `error` (it raised, or a bash cell's status was not 0); `timeout` (its "
    "`cell_timeout` or the notebook's `timeout`); `cancelled`; `died` (the kernel died); "
    "`output_limit` (the run's output limit was passed); `exited` (the code ended the kernel, "
    "e.g. `sys.exit()` in a script or `Deno.exit()`)"
)
CELL_INDEX = "the cell's place in the notebook's `cells` (from 0, markdown cells counted)"
CELL_ID = "the cell's nbformat `id` (null for notebooks older than nbformat 4.5)"


class CellStartedEvent(Event):
    """gateway -> client (notebook replays): a code cell starts; its `output` events follow,
    then its `cell_finished`. Cells that do not run (markdown, `skip-execution`, the cells
    after one that stopped the replay) have no events."""

    type: Literal["cell_started"]
    index: int = Field(ge=0, description=CELL_INDEX)
    cell_id: str | None = Field(description=CELL_ID)


class CellFinishedEvent(Event):
    """gateway -> client (notebook replays): a code cell ended, with its execution count
    (`In [n]`), how it ended, how long it ran and the CPU it spent."""

    type: Literal["cell_finished"]
    index: int = Field(ge=0, description=CELL_INDEX)
    cell_id: str | None = Field(description=CELL_ID)
    execution_count: int = Field(ge=1)
    status: CellStatus = Field(description=CELL_STATUS)
    duration_ms: int = Field(ge=0)
    cpu_ms: int | None = Field(
        None,
        ge=0,
        description=(
            "the CPU time the cell's own code spent in its kernel's sandbox, as the cell's "
            "`metadata.gateway.cpu_ms` (left out where the sandbox cannot tell: a local "
            "sandbox without a cgroup)"
        ),
    )


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
