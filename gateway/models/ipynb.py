"""A run record as an nbformat v4 notebook: for a single run, one code cell with the code
and its outputs; for a notebook replay, the executed notebook.

A replay's record keeps the notebook without its code cells' outputs in `record.notebook`
(each code cell's `outputs` is the number of its outputs); the outputs themselves are the
record's `outputs`, in order, so nothing is stored twice.
"""

from __future__ import annotations

import copy
from typing import Any

from nbformat.v4 import new_code_cell, new_notebook

from gateway.models.languages import notebook_metadata
from gateway.models.record import RunRecord


def store_notebook(record: RunRecord, notebook: dict[str, Any]) -> None:
    """Keep a (possibly executed) notebook with its record: outputs go to `record.outputs`."""
    skeleton = copy.copy(notebook)
    skeleton["cells"] = []
    outputs: list[dict[str, Any]] = []
    for cell in notebook["cells"]:
        if cell.get("cell_type") == "code":
            outputs.extend(cell["outputs"])
            cell = {**cell, "outputs": len(cell["outputs"])}
        skeleton["cells"].append(cell)
    record.notebook = skeleton
    record.outputs = outputs


def record_to_notebook(record: RunRecord) -> dict[str, Any]:
    """The run as a notebook that opens in JupyterLab and can be replayed, as plain JSON that
    shares the record's outputs (nothing is copied).

    It is not validated again: a replay's cells were validated when the notebook came in,
    the outputs are the nbformat outputs the run collected, and the rest is built here
    (tests/test_notebooks.py checks that exports validate). Validating and copying a replay
    of many cells on every export cost seconds per ten thousand cells."""
    nb: dict[str, Any]
    if record.notebook is not None:
        nb = _rebuilt(record.notebook, record.outputs)
    else:
        cell = new_code_cell(source=record.code, execution_count=1 if record.outputs else None)
        cell["outputs"] = [_for_cell(o) for o in record.outputs]
        nb = new_notebook(cells=[cell], metadata=notebook_metadata(record.language))
    nb["metadata"] = {
        **nb.get("metadata", {}),
        "gateway": {
            "run_id": record.id,
            "status": record.status,
            "exit_code": record.exit_code,
            "started_at": record.started_at,
            "finished_at": record.finished_at,
        },
    }
    return nb


def _rebuilt(skeleton: dict[str, Any], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The skeleton's cells with their outputs back, in new containers (the skeleton and
    the outputs themselves are shared, never changed)."""
    cells = []
    start = 0
    for cell in skeleton["cells"]:
        if cell.get("cell_type") == "code":
            count = int(cell["outputs"])
            cell = {**cell, "outputs": outputs[start : start + count]}
            start += count
        cells.append(cell)
    return {**skeleton, "cells": cells}


def _for_cell(output: dict[str, Any]) -> dict[str, Any]:
    if output.get("output_type") == "execute_result":
        return {**output, "execution_count": 1}
    return output
