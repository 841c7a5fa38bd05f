"""What an execution runs: a `Program` of code cells in one fresh kernel.

A single run is a one-cell notebook (as in nbclient); a notebook replay is the notebook's
runnable code cells. Both go through one executor (`executor.Execution`); the few ways a
replay differs from a single run (docs/API.md, "Replay and a single run differ") are
options of the program, not a second code path:

- `keep_saved_charts`: a single run's outputs keep the images `savefig` published (agents
  read them there); a replayed cell, like Jupyter, shows nothing for a `savefig` call;
- `cell_names`: a replay's notes name each cell by its execution count ("In [2]");
- `timeout` bounds the whole program, `cell_timeout` each cell (equal for a single run).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.models.common import Language
from gateway.models.languages import notebook_metadata, traits
from gateway.models.notebook import cell_source, is_code
from gateway.models.request import NotebookRequest, RunRequest, StagedFile, WorkspaceRef

EXPECTED_ERROR_TAG = "raises-exception"
SKIP_TAG = "skip-execution"


@dataclasses.dataclass(frozen=True)
class Program:
    """Cells to run in one kernel, and everything the run needs around them."""

    language: Language
    notebook: dict[str, Any]  # nbformat v4; its runnable code cells are the program
    timeout: float
    cell_timeout: float
    allow_errors: bool = False
    files: tuple[StagedFile, ...] = ()
    archive: str | None = None  # an upload id, unpacked into the working folder first
    # the kept files of an earlier run (`files_from`): an upload id, unpacked like an archive
    given_upload: str | None = None
    given_from: str | None = None  # the run that kept them
    keep_files: bool = False  # keep what is staged with the user's uploads
    entrypoint: str | None = None  # the file a single run runs instead of code
    vars: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    return_files: tuple[str, ...] = ()
    network: bool = False
    workspace: WorkspaceRef | None = None
    memory_bytes: int | None = None
    user: str = "anonymous"
    notes: tuple[str, ...] = ()
    keep_saved_charts: bool = False
    cell_names: bool = True
    keep: bool = False  # the kernel's final state kept as a snapshot (gateway.runs.snapshots)
    keep_cells: bool = False  # and the state after each code cell (a replay's `keep: "cells"`)
    continue_from: str | None = None  # the snapshot the kernel starts from
    # a rebuilt continuation's chain (`rebuild`): code run silently before the cells, each
    # piece once, its errors ignored (the runs it replays may have failed)
    prelude: tuple[str, ...] = ()

    def runnable(self) -> list[int]:
        """Positions (in `notebook["cells"]`) of the cells that run, in order."""
        return [i for i, c in enumerate(self.notebook["cells"]) if runnable(c)]

    @property
    def reads_result(self) -> bool:
        """Whether the kernel's `result` (else `output`) is read back after the last cell."""
        return traits(self.language).reads_result


def tags(cell: Mapping[str, Any]) -> list[Any]:
    found = (cell.get("metadata") or {}).get("tags") or []
    return found if isinstance(found, list) else []


def runnable(cell: Mapping[str, Any]) -> bool:
    return is_code(cell) and bool(cell_source(cell).strip()) and SKIP_TAG not in tags(cell)


def from_run(request: RunRequest) -> Program:
    """A single run: a notebook of one code cell."""
    cell: dict[str, Any] = {
        "cell_type": "code",
        "id": "run",
        "metadata": {},
        "source": request.source,
        "outputs": [],
        "execution_count": None,
    }
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": notebook_metadata(request.language),
        "cells": [cell],
    }
    return Program(
        language=request.language,
        notebook=notebook,
        timeout=request.timeout,
        cell_timeout=request.timeout,
        allow_errors=True,
        files=request.files,
        archive=request.archive,
        entrypoint=request.entrypoint,
        vars=request.vars,
        env=request.env,
        return_files=request.return_files,
        network=request.network,
        workspace=request.working_dir,
        memory_bytes=request.memory_bytes,
        user=request.user,
        notes=request.notes,
        keep_saved_charts=True,
        cell_names=False,
        keep=request.keep,
        continue_from=request.continue_from,
        keep_files=request.keep_files,
    )


def from_notebook(request: NotebookRequest) -> Program:
    """A replay: the notebook's runnable code cells, in order."""
    return Program(
        language=request.language,
        notebook=copy.deepcopy(request.notebook),
        timeout=request.timeout,
        cell_timeout=request.cell_timeout,
        allow_errors=request.allow_errors,
        files=request.files,
        vars=request.vars,
        env=request.env,
        return_files=request.return_files,
        network=request.network,
        user=request.user,
        notes=request.notes,
        keep=request.keep,
        keep_cells=request.keep_cells,
        continue_from=request.continue_from,
        keep_files=request.keep_files,
    )
