"""The replay corpus: notebooks/corpus/, notebooks written for this project in the manner of a
data-science book's NumPy and matplotlib chapters (issue 12). They are stored without outputs;
their reference is what nbclient makes of them in the same session (notebook_compare.py).

bench/replay_corpus.py replays all of it on both backends (counts and times recorded in
bench/README.md); tests/test_replay_corpus.py replays the REPRESENTATIVE notebooks, or all of
them with GATEWAY_REPLAY_CORPUS=all (the whole corpus costs about 2 minutes per backend in
pytest, plus 1.5 minutes of nbclient executions).
"""

from __future__ import annotations

import json
import os
from typing import Any

import nbformat

from tests.notebook_compare import REPO
from tests.support import Client

CORPUS = REPO / "notebooks" / "corpus"
# Generous for a busy 2-core machine: the slowest notebook takes about 10 s.
REPLAY_OPTIONS: dict[str, Any] = {"timeout": 240, "cell_timeout": 120}
# Kernel-side packages whose versions decide what a cell shows.
PACKAGES = (
    "ipykernel",
    "ipython",
    "jupyter_client",
    "matplotlib",
    "matplotlib-inline",
    "numpy",
    "pandas",
    "pillow",
    "pyzmq",
)


# Between them, every feature of the corpus: what each adds to the ones before it.
REPRESENTATIVE = (
    "01_numpy_arrays.ipynb",  # array reprs, print, `_`, %who, a tagged ValueError
    "02_numpy_ufuncs.ipynb",  # %timeit, %time, %%time, %precision, a warning on stderr
    "03_numpy_aggregations.ipynb",  # pandas HTML, Markdown, a display updated by a later cell
    "05_numpy_masks.ipynb",  # masks, `and` on arrays: two tagged errors
    "08_numpy_structured.ipynb",  # structured dtypes, record arrays, DataFrames
    "09_mpl_basics_savefig.ipynb",  # savefig (a cell that only saves), Image, !ls, a helper module
    "12_mpl_errorbars.ipynb",  # a figure updated in place, inline SVG, pandas plotting
    "14_mpl_histograms.ipynb",  # retina PNGs, hist's tuple as a result
    "17_mpl_subplots.ipynb",  # a figure as a cell's result, GridSpec, mosaics, an IndexError
    "21_mpl_3d.ipynb",  # mplot3d
)


def names() -> list[str]:
    return sorted(path.name for path in CORPUS.glob("*.ipynb"))


def selected() -> list[str]:
    """The notebooks the test replays: REPRESENTATIVE, or all with GATEWAY_REPLAY_CORPUS=all."""
    return names() if os.environ.get("GATEWAY_REPLAY_CORPUS") == "all" else list(REPRESENTATIVE)


def read(name: str) -> dict[str, Any]:
    notebook: dict[str, Any] = json.loads((CORPUS / name).read_text(encoding="utf-8"))
    nbformat.validate(nbformat.from_dict(notebook))
    return notebook


def code_cells(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def replay(client: Client, notebook: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/notebooks/run of `notebook`: the answer, `{notebook, run}`."""
    response = client.request(
        "POST", "/v1/notebooks/run", {"notebook": notebook, **REPLAY_OPTIONS}, timeout=300
    )
    assert response.status == 200, response.body[:2000]
    answer: dict[str, Any] = response.json()
    return answer


VERSIONS_CODE = (
    "import importlib.metadata as m, platform\n"
    "print(platform.python_version())\n"
    f"for name in {PACKAGES!r}:\n"
    "    print(name, m.version(name))"
)


def kernel_versions(client: Client) -> dict[str, str]:
    """Python and package versions inside the kernel of `client`'s backend."""
    record = client.run(code=VERSIONS_CODE)
    assert record["status"] == "succeeded", record
    python, *lines = record["stdout"].splitlines()
    return {"python": python, **dict(line.split(" ", 1) for line in lines)}
