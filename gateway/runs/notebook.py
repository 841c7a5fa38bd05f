"""A run record as an nbformat v4 notebook: one code cell with the code and its outputs."""

from __future__ import annotations

from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from gateway.runs.models import RunRecord

KERNELSPECS: dict[str, dict[str, Any]] = {
    "python": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python", "file_extension": ".py", "mimetype": "text/x-python"},
    },
    "bash": {
        "kernelspec": {"name": "bash", "display_name": "Bash", "language": "bash"},
        "language_info": {"name": "bash", "file_extension": ".sh", "mimetype": "text/x-sh"},
    },
}


def notebook_metadata(language: str) -> dict[str, Any]:
    return {key: dict(value) for key, value in KERNELSPECS[language].items()}


def record_to_notebook(record: RunRecord) -> nbformat.NotebookNode:
    """The run as a notebook that opens in JupyterLab and can be replayed."""
    cell = new_code_cell(source=record.code, execution_count=1 if record.outputs else None)
    cell.outputs = [nbformat.from_dict(_for_cell(o)) for o in record.outputs]
    nb: nbformat.NotebookNode = new_notebook(
        cells=[cell], metadata=notebook_metadata(record.language)
    )
    nb.metadata["gateway"] = {
        "run_id": record.id,
        "status": record.status,
        "exit_code": record.exit_code,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
    }
    nbformat.validate(nb)
    return nb


def _for_cell(output: dict[str, Any]) -> dict[str, Any]:
    if output.get("output_type") == "execute_result":
        return {**output, "execution_count": 1}
    return output
