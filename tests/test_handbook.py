"""The Python Data Science Handbook's chapters 4 and 5 run with no module missing (issue 23):
a subset of their notebooks (notebooks/handbook/, the code cells only) replayed on one
backend whose kernels have the scientific stack (the Docker image's default profile).

What may still fail are the book's own errors: matplotlib styles renamed since, datasets
downloaded from the internet (runs have no network), APIs newer libraries changed, and the
cells that use their results. bench/handbook.py replays both chapters whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import kernel_environment
from tests.support import REPO, GatewayThread

# the promise is the image's (its default profile's modules): Docker's kernels and forkserver's
# run in the same image files, so one backend shows it (conftest.OneBackend)
pytestmark = [pytest.mark.slow, pytest.mark.one_backend]

HANDBOOK = REPO / "notebooks" / "handbook"
# what chapters 4 and 5 import, by the name each is installed under
STACK = ("matplotlib", "pandas", "seaborn", "scipy", "scikit-learn", "scikit-image", "ipywidgets")
MISSING = ("ModuleNotFoundError", "ImportError")
# the first cell of each that imports what it is there for, and must run
IMPORTS = {
    "04.12-Three-Dimensional-Plotting.ipynb": "from mpl_toolkits import mplot3d",
    "04.14-Visualization-With-Seaborn.ipynb": "import seaborn as sns",
    "05.02-Introducing-Scikit-Learn.ipynb": "from sklearn.linear_model import LinearRegression",
    "05.07-Support-Vector-Machines.ipynb": "from sklearn.svm import SVC",
    "05.14-Image-Features.ipynb": "from skimage import data, color, feature",
}


def test_the_subset_is_the_folder() -> None:
    assert sorted(p.name for p in HANDBOOK.glob("*.ipynb")) == sorted(IMPORTS)


@pytest.mark.parametrize("name", sorted(IMPORTS))
def test_a_handbook_notebook_misses_no_module(gateway: GatewayThread, name: str) -> None:
    kernel_environment.require(gateway, "python", *STACK)
    notebook = json.loads((HANDBOOK / name).read_text(encoding="utf-8"))
    response = gateway.client().request(
        "POST",
        "/v1/notebooks/run",
        {"notebook": notebook, "allow_errors": True, "timeout": 280, "cell_timeout": 200},
        timeout=300,
    )
    assert response.status == 200, response.body[:2000]
    answer = response.json()
    cells = [c for c in answer["notebook"]["cells"] if c["cell_type"] == "code"]
    errors = [(i, o) for i, c in enumerate(cells) for o in c["outputs"] if _is_error(o)]
    missing = [f"cell {i}: {o['ename']}: {o['evalue']}" for i, o in errors if o["ename"] in MISSING]
    assert not missing, missing
    # every cell ran (allow_errors), and the cell that imports the chapter's library worked
    assert all(c["execution_count"] is not None for c in cells)
    importing = next(c for c in cells if IMPORTS[name] in "".join(c["source"]))
    assert not any(_is_error(o) for o in importing["outputs"]), importing["outputs"]
    assert answer["run"]["charts"], "no chart came back"


def _is_error(output: dict[str, Any]) -> bool:
    return output.get("output_type") == "error"
