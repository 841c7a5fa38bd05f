"""The data that flows down (`RunRequest`) and back up (`RunRecord`) through the gateway."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.models.common import FINAL_STATUSES, KillReason, Language, Status, now_rfc3339
from gateway.sandbox.workspace import WorkspaceRef


@dataclasses.dataclass(frozen=True)
class StagedFile:
    """A file written into the working folder before the run (path already validated)."""

    path: str
    data: bytes


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """A validated request to run code once in a fresh kernel."""

    language: Language
    code: str | None = None
    entrypoint: str | None = None
    timeout: float = 30.0
    files: tuple[StagedFile, ...] = ()
    archive: str | None = None
    vars: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    return_files: tuple[str, ...] = ()
    background: bool = False
    network: bool = False
    working_dir: WorkspaceRef | None = None
    user: str = "anonymous"
    notes: tuple[str, ...] = ()
    memory_bytes: int | None = None  # a lower memory limit than the operator's, if any

    @property
    def source(self) -> str:
        """The cell that runs: the code, or the command that runs the entrypoint."""
        if self.entrypoint is None:
            return self.code or ""
        from gateway.models.languages import entrypoint_source

        return entrypoint_source(self.language, self.entrypoint)


@dataclasses.dataclass
class Usage:
    wall_ms: int = 0
    cpu_ms: int | None = None
    peak_memory_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RunRecord:
    """Everything a client learns about one run; `to_json` is the API's run record."""

    id: str
    language: Language
    user: str = "anonymous"
    status: Status = "queued"
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    output_truncated: bool = False
    outputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    result: Any = None
    error: dict[str, Any] | None = None
    charts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    files: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    timed_out: bool = False
    kill_reason: KillReason | None = None
    usage: Usage = dataclasses.field(default_factory=Usage)
    started_at: str | None = None
    finished_at: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    code: str = ""
    created_at: str = dataclasses.field(default_factory=now_rfc3339)
    notebook: dict[str, Any] | None = None  # the cells, without outputs (runs/notebook.py)
    result_note: str | None = None  # why the code's `result` was not returned (a fact, kept)

    @property
    def success(self) -> bool:
        return self.status == "succeeded"

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "language": self.language,
            "status": self.status,
            "success": self.success,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "output": self.output,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "output_truncated": self.output_truncated,
            "outputs": self.outputs,
            "result": self.result,
            "error": self.error,
            "charts": self.charts,
            "files": self.files,
            "timed_out": self.timed_out,
            "kill_reason": self.kill_reason,
            "usage": self.usage.to_json(),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "notes": self.notes,
        }

    def to_storage(self) -> dict[str, Any]:
        """`to_json` plus what only the gateway needs (owner, code, creation time)."""
        return {
            **self.to_json(),
            "user": self.user,
            "code": self.code,
            "created_at": self.created_at,
            "notebook": self.notebook,
            "result_note": self.result_note,
        }

    @classmethod
    def from_storage(cls, data: dict[str, Any]) -> RunRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["usage"] = Usage(**data.get("usage") or {})
        return cls(**values)
