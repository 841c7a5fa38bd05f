"""What flows down through the gateway once a body is parsed and the operator's policy is
applied: `RunRequest` (one run), `NotebookRequest` (a replay), their staged files and the
workspace a run names. Internal
(never JSON), so plain frozen dataclasses."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gateway.models.common import Language
from gateway.models.languages import entrypoint_source
from gateway.models.notebook import cell_source, is_code


@dataclasses.dataclass(frozen=True)
class StagedFile:
    """A file written into the working folder before the run (path already validated)."""

    path: str
    data: bytes


@dataclasses.dataclass(frozen=True)
class WorkspaceRef:
    """A workspace folder: `root` (trusted, the operator's) / `parts` (checked names).
    Opened only when the sandbox is created (`gateway.sandbox.workspace`)."""

    root: Path
    parts: tuple[str, ...]

    def __post_init__(self) -> None:
        for part in self.parts:
            if part in ("", ".", "..") or "/" in part or "\x00" in part:
                raise ValueError(f"not a plain folder name: {part!r}")

    @property
    def path(self) -> Path:
        """For messages only: never open this path (see `gateway.sandbox.workspace`)."""
        return self.root.joinpath(*self.parts)


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
    keep: bool = False  # keep the final state as a snapshot
    continue_from: str | None = None  # a snapshot's id to start from
    rebuild: bool = False  # replay its chain's code where it cannot be forked
    keep_files: bool = False  # keep the staged files for a later run's `files_from`
    files_from: str | None = None  # a run of the same user whose kept files are staged

    @property
    def source(self) -> str:
        """The cell that runs: the code, or the command that runs the entrypoint."""
        if self.entrypoint is None:
            return self.code or ""
        return entrypoint_source(self.language, self.entrypoint)


@dataclasses.dataclass(frozen=True)
class NotebookRequest:
    """A notebook to replay in one fresh kernel, with its outputs already cleared."""

    notebook: dict[str, Any]  # valid nbformat v4; code cells have no outputs yet
    language: Language
    timeout: float = 30.0  # for all cells together, from the first cell's start
    cell_timeout: float = 30.0  # for each cell (a cell gets at most the time left)
    allow_errors: bool = False
    files: tuple[StagedFile, ...] = ()
    return_files: tuple[str, ...] = ()
    vars: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    network: bool = False
    user: str = "anonymous"
    notes: tuple[str, ...] = ()
    keep: bool = False  # keep the final state as a snapshot
    keep_cells: bool = False  # and the state after each code cell (`keep: "cells"`)
    continue_from: str | None = None  # a snapshot's id to start from
    rebuild: bool = False  # replay its chain's code where it cannot be forked
    keep_files: bool = False  # keep the staged files for a later run's `files_from`
    files_from: str | None = None  # a run of the same user whose kept files are staged
    name: str | None = None  # the notebook's file name, for listings

    @property
    def code(self) -> str:
        """Every code cell's source, in order, as one text (kept with the record)."""
        return "\n\n".join(cell_source(c) for c in self.notebook["cells"] if is_code(c))
