"""The run record: everything a client learns about one run (`RunRecord`), as one pydantic
model whose JSON is the API's answer and whose JSON Schema is the document's `RunRecord`.

The record owns its run's life: its `status` moves only through its own methods, which
refuse a move the life does not allow (`MOVES`; a `succeeded` run never becomes `running`):

    queued --start()--> running --finish(verdict)--> succeeded | failed | timed_out
      |                    |                          | killed | cancelled
      |                    +--fail(note)--> failed   (the gateway could not run it)
      +--cancel_unstarted(note)--> cancelled         (cancelled while it waited)
      +--stop_unstarted(reason, note)--> killed      (its user's budget went meanwhile)
      +--fail(note)--> failed                        (its replica died before it ran)

The run service starts it when it holds a slot, the result builder
(`gateway.execution.result`) finishes it, the service or a store's lease recovery fails it.
Its results are filled in by the result builder only; assignments are not validated, what
it holds came from our own code. Outputs, charts, returned files and the error are plain
JSON objects (nbformat's own schema describes outputs).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, RootModel, computed_field

from gateway.models.base import component
from gateway.models.common import FINAL_STATUSES, KillReason, Language, Status, now_rfc3339

STATUS = (
    "`queued`/`running` only while a background run is in progress. `succeeded`: exit code "
    "0. `failed`: the code failed (non-zero exit, uncaught exception), or the kernel died of "
    "something else than a limit (then `exit_code` is 128+signal and a note says so), or the "
    "gateway could not run it (a note says why). `timed_out`: the timeout ended it "
    "(`kill_reason: timeout`). `killed`: a limit ended it (`kill_reason` memory, pids, "
    "cpu_quota (its user's CPU-seconds budget) or "
    "output_limit); a memory or process limit that struck before a timeout reports `killed` "
    "with that reason and `timed_out: true`. `cancelled`: `DELETE /v1/runs/{id}` or a "
    "WebSocket cancel (`kill_reason: cancelled`)."
)


class Usage(BaseModel):
    """What the run's sandbox used."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    wall_ms: int = Field(
        0, ge=0, description="from the start of the run (sandbox start included) to its end"
    )
    cpu_ms: int | None = Field(
        None,
        ge=0,
        description="CPU time of every process in the sandbox from when the run's code was "
        "sent to the kernel (the kernel's own start, and a pooled kernel's preloads, not "
        "counted), however the run ended; null when no sandbox started for the run, or "
        "where the sandbox has no cgroup",
    )
    peak_memory_bytes: int | None = Field(
        None,
        ge=0,
        description="the most memory the sandbox held at once (its cgroup's peak, the "
        "kernel's own memory included); null when no sandbox started for the run, or where "
        "the sandbox has no cgroup and its kernel had not ended",
    )

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


# --- the record's parts: kept as plain JSON at run time, described by these models --------


class RunError(BaseModel):
    """The uncaught error (Python: the exception; `SystemExit(0)` is none)."""

    ename: str
    evalue: str
    traceback: list[str] = Field(description="lines, with the kernel's ANSI colour codes")


Point = float | str | None


class ChartSeries(BaseModel):
    type: Literal["line", "bar", "scatter", "pie"]
    label: str | None
    x: list[Point] = []
    y: list[Point]
    tick_labels: list[str] = []
    labels: list[str] = []


class ChartAxes(BaseModel):
    type: str = Field(description="line, bar, scatter, pie, mixed, unknown or subplots")
    title: str | None
    x_label: str | None
    y_label: str | None
    series: list[ChartSeries]


class ChartSpec(ChartAxes):
    """The chart's data, read back when it can be (best effort, at most 1000 points per
    series): from a matplotlib figure (seaborn's too), a plotly figure's traces, a ggplot2
    plot or a base R plot's drawing. For several axes, `type` is `subplots`, the top-level
    fields describe the first axes and `axes` lists all."""

    axes: list[ChartAxes] | None = None


class Chart(BaseModel):
    """An image the run produced: `plt.show()`, a figure left open at the end of the run, a
    `savefig` call (with the path it saved to), any PNG/JPEG/SVG display (an R plot too),
    or a plotly figure (its JSON)."""

    model_config = ConfigDict(extra="forbid")

    mime: Literal["image/png", "image/jpeg", "image/svg+xml", "application/vnd.plotly.v1+json"]
    data: str = Field(
        description="base64 for PNG/JPEG, the text for SVG, the figure's JSON text for plotly"
    )
    source: Literal["display", "savefig"]
    path: str | None = Field(None, description="the path given to `savefig`")
    spec: ChartSpec | None = None


class ReturnedFileContent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    size: int = Field(ge=0)
    encoding: Literal["utf-8", "base64"] = Field(
        description="utf-8 when the bytes are valid UTF-8, else base64"
    )
    content: str


class ReturnedFileError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    size: int | None = Field(description="the size when known (a file over a limit), else null")
    error: str = Field(
        description=(
            'Why it was not returned: "not found", "is a folder", "outside the working '
            'folder", "not a regular file", "larger than the limit of N bytes", "the total '
            'size limit of returned files was reached", "grew past the size limit", "no file '
            "matches\" (a glob), or the operating system's reason."
        )
    )


class ReturnedFile(RootModel[ReturnedFileContent | ReturnedFileError]):
    """One `return_files` match, in the order asked; a glob gives one entry per match
    (folders skipped). Read after the run, also after a timeout; links are followed only
    while they stay inside the working folder."""


class IllegalMove(RuntimeError):
    """A status move its run's life does not allow: a bug of the gateway, never the user's."""


# Each move, and the statuses it may start from; a final status moves no more.
MOVES: dict[str, frozenset[str]] = {
    "start": frozenset({"queued"}),
    "cancel_unstarted": frozenset({"queued"}),
    "stop_unstarted": frozenset({"queued"}),
    "fail": frozenset({"queued", "running"}),
    "finish": frozenset({"running"}),
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How a run that ran ended (`gateway.execution.result.judge`): its final status and
    what goes with it."""

    status: Status
    exit_code: int | None = None
    kill_reason: KillReason | None = None
    timed_out: bool = False
    notes: tuple[str, ...] = ()
    keep_error: bool = True  # False: the error was `sys.exit(0)`, which is no error


# The gateway's own fields: stored with the record, never sent.
PRIVATE_FIELDS = frozenset(
    {"user", "code", "created_at", "notebook", "result_note", "kind", "files_upload"}
)


class SnapshotInfo(BaseModel):
    """A run's final state, kept (`keep`): what later runs start from (`from`)."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    id: str = Field(description="give it as `from` to start a run from this state")
    expires_at: str = Field(
        description="when it goes if no run starts from it before (each start renews it)",
        json_schema_extra={"format": "date-time"},
    )
    bytes: int = Field(
        ge=0, description="its own memory, counted against its owner's snapshot bytes"
    )
    instance: str = Field(
        "", description="the gateway instance that holds it (a run `from` it goes there)"
    )
    cell: int | None = Field(
        None,
        description=(
            'a replay kept with `keep: "cells"`: the position, in the notebook\'s `cells`, of '
            "the code cell after which this state was kept; null for a run's final state"
        ),
    )
    gone: str | None = Field(
        None,
        description=(
            "null while it is kept; once it went, why (expired, evicted, deleted, its "
            "gateway stopped), as the 410 snapshot_gone says it"
        ),
    )


class FilesGiven(BaseModel):
    """The files a run was given (`files`, and those of `files_from`), as they were staged."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    count: int = Field(ge=0)
    bytes: int = Field(ge=0)
    kept: bool = Field(
        description=(
            "kept with the caller's uploads (`keep_files`): a later run can stage them again "
            "with `files_from: <this run's id>` until they go (past the upload quota, or "
            "after `upload_ttl`), which it is then told (410 files_gone)"
        )
    )


class SnapshotList(BaseModel):
    """GET /v1/snapshots: the caller's snapshots, least recently used first."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    snapshots: list[SnapshotInfo]


class RunRecord(BaseModel):
    """Everything known about one run. The same object is the answer of POST /v1/runs,
    GET and DELETE /v1/runs/{id}, the `run` of a WebSocket `done` message and of
    POST /v1/notebooks/run."""

    model_config = ConfigDict(extra="ignore", json_schema_serialization_defaults_required=True)

    id: str
    language: Language
    status: Status = Field("queued", description=STATUS)
    exit_code: int | None = Field(
        None,
        description=(
            "0 on success; Python: 1 for an uncaught exception, n for `sys.exit(n)`; bash: "
            "the script's `$?`; 128+signal when the kernel died; null when the run timed "
            "out, was killed or cancelled, or has not finished"
        ),
    )
    stdout: str = ""
    stderr: str = ""
    output: str = Field("", description="stdout and stderr as they arrived")
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    output_truncated: bool = Field(
        False,
        description=(
            "Each of stdout, stderr and output is kept up to the operator's cap (default 1 "
            "MiB): the first and the last half of the cap are kept and `[... N bytes "
            "truncated ...]` marks the cut. Output far past the cap (default 64 MiB in all) "
            "kills the run (`kill_reason: output_limit`)."
        ),
    )
    outputs: list[Annotated[dict[str, Any], component("Output")]] = Field(default_factory=list)
    result: Any = Field(
        None,
        description=(
            "Python: the value of the global `result`, else of `output`, after the run, when "
            "it is JSON-serialisable (numpy values and arrays, pandas objects are converted "
            "with `tolist()`/`to_dict()`); else null and a note. Also null with a note when "
            "its JSON is larger than `result_cap_bytes` (default 4 MiB) or nested more than "
            "`max_json_depth` levels deep. Null for bash and for runs that did not finish."
        ),
    )
    error: Annotated[dict[str, Any], component("RunError")] | None = Field(
        None,
        description=(
            "The uncaught error. Its `evalue` and its `traceback` (in all) are each cut to "
            "`error_cap_bytes` (default 256 KiB) as they arrive, head and tail kept, and its "
            "`ename` to 1 KiB; the error output in `outputs` is the same cut error."
        ),
    )
    charts: list[Annotated[dict[str, Any], component("Chart")]] = Field(default_factory=list)
    files: list[Annotated[dict[str, Any], component("ReturnedFile")]] = Field(default_factory=list)
    timed_out: bool = False
    kill_reason: KillReason | None = None
    usage: Usage = Field(default_factory=Usage)
    snapshot: SnapshotInfo | None = Field(
        None, description="the kernel's final state, kept as asked (`keep`); null otherwise"
    )
    snapshots: list[SnapshotInfo] = Field(
        default_factory=list,
        description=(
            'a replay with `keep: "cells"`: the state after each code cell that ran, in '
            "order (the last is also `snapshot`); empty otherwise"
        ),
    )
    continued_from: str | None = Field(
        None, description="the snapshot this run started from (`from`)"
    )
    continued_by: Literal["fork", "replay"] | None = Field(
        None,
        description=(
            "how a run `from` a snapshot got its state: `fork`, a copy-on-write copy of the "
            "snapshot's kernel; `replay`, its chain's code run again in a fresh kernel "
            "(`rebuild: true`, when the snapshot was gone or elsewhere); null for a run "
            "from nothing"
        ),
    )
    name: str | None = Field(
        None, description="a replay: the notebook's file name, as its request gave it"
    )
    files_given: FilesGiven | None = Field(
        None, description="the files the run was given; null when it was given none"
    )
    started_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    finished_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    notes: list[str] = Field(
        default_factory=list,
        description=(
            "sentences about anything clamped, truncated or not returned; each at most 1000 "
            "characters, at most 100 of them"
        ),
    )
    # --- the gateway's own (PRIVATE_FIELDS): stored, never sent
    user: str = Field("anonymous", exclude=True)
    code: str = Field("", exclude=True)
    created_at: str = Field(default_factory=now_rfc3339, exclude=True)
    # a replay's cells without outputs (`gateway.models.ipynb`)
    notebook: dict[str, Any] | None = Field(None, exclude=True)
    # why the code's `result` was not returned, as a fact (the tools report it their way)
    result_note: str | None = Field(None, exclude=True)
    # what was asked: a run (code or an entrypoint) or a notebook replay (GET /v1/runs)
    kind: Literal["run", "notebook"] = Field("run", exclude=True)
    # the upload that keeps the files it was given (`files_given.kept`)
    files_upload: str | None = Field(None, exclude=True)
    _started: float | None = PrivateAttr(None)  # monotonic, for `usage.wall_ms`

    # --- its life -----------------------------------------------------------------------

    def start(self) -> None:
        """It holds a run slot: `running`, from now (the sandbox's start included)."""
        self._move("start", "running")
        self.started_at = now_rfc3339()
        self._started = time.monotonic()

    def cancel_unstarted(self, note: str) -> None:
        """Cancelled while it waited for a slot: it never ran."""
        self._move("cancel_unstarted", "cancelled")
        self.kill_reason = "cancelled"
        self.notes.append(note)
        self._end()

    def stop_unstarted(self, reason: KillReason, note: str) -> None:
        """A limit of its user's ended it as it was about to start (`cpu_quota`: the budget
        was spent while it waited): `killed`, and it never ran."""
        self._move("stop_unstarted", "killed")
        self.kill_reason = reason
        self.notes.append(note)
        self._end()

    def fail(self, note: str) -> None:
        """The gateway could not run it (no kernel, files refused, an error of its own), or
        its replica died: `failed`, with the reason as a note."""
        self._move("fail", "failed")
        self.exit_code = None
        self.notes.append(note)
        self._end()

    def finish(self, verdict: Verdict) -> None:
        """It ran: its final status, as the result builder judged it."""
        if verdict.status not in FINAL_STATUSES:
            raise IllegalMove(f"run {self.id}: a verdict of {verdict.status!r} is not final")
        self._move("finish", verdict.status)
        self.exit_code = verdict.exit_code
        self.kill_reason = verdict.kill_reason
        self.timed_out = verdict.timed_out
        self.notes.extend(verdict.notes)
        if not verdict.keep_error:
            self.error = None
        self._end()

    def _move(self, move: str, status: Status) -> None:
        if self.status not in MOVES[move]:
            raise IllegalMove(f"run {self.id}: {move}() of a {self.status} run (to {status})")
        self.status = status

    def _end(self) -> None:
        self.finished_at = now_rfc3339()
        if self._started is not None:
            self.usage.wall_ms = int((time.monotonic() - self._started) * 1000)

    @computed_field(description='`status == "succeeded"`')  # type: ignore[prop-decorator]
    @property
    def success(self) -> bool:
        return self.status == "succeeded"

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def to_json(self) -> dict[str, Any]:
        """The API's run record. Its values are the record's own (no deep copy: a record
        may hold 64 MiB of outputs, and this runs on the event loop)."""
        data = {name: getattr(self, name) for name in PUBLIC_FIELDS}
        data["success"] = self.success
        data["usage"] = self.usage.to_json()
        data["snapshot"] = None if self.snapshot is None else self.snapshot.model_dump()
        data["snapshots"] = [s.model_dump() for s in self.snapshots]
        data["files_given"] = None if self.files_given is None else self.files_given.model_dump()
        return data

    def to_storage(self) -> dict[str, Any]:
        """`to_json` plus what only the gateway needs (owner, code, creation time)."""
        return {**self.to_json(), **{name: getattr(self, name) for name in PRIVATE_FIELDS}}

    @classmethod
    def from_storage(cls, data: dict[str, Any]) -> RunRecord:
        return cls.model_validate(data)


PUBLIC_FIELDS: tuple[str, ...] = tuple(
    name for name in RunRecord.model_fields if name not in PRIVATE_FIELDS
)
