"""The replay corpus (issue 12): notebooks of notebooks/corpus/ (NumPy and matplotlib
chapters in the manner of a data-science book, tests/corpus.py) replayed with
`POST /v1/notebooks/run` on one backend (conftest.OneBackend: forkserver's kernels run in the
Docker image's files), and compared cell by cell with nbclient's execution
of them in this session (notebook_compare.py): error verdict and name, outputs and their
types, stream text, text/plain, HTML, images by size and marks. A failure names every
differing cell.

The whole corpus costs about 2 minutes per backend here, plus 1.5 minutes of nbclient
executions: the test replays its REPRESENTATIVE notebooks (all of them with
GATEWAY_REPLAY_CORPUS=all), and bench/replay_corpus.py all of them, with the recorded result
in bench/README.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import corpus
from tests.notebook_compare import cell_differences, execute_reference
from tests.support import Client

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend

EXPECTED_ERROR_TAG = "raises-exception"


class References:
    """nbclient's execution of each corpus notebook, made on first use and kept for the
    session: each test pays for its own notebook's, the second backend for none."""

    def __init__(self) -> None:
        self.executed: dict[str, dict[str, Any]] = {}

    def get(self, name: str) -> dict[str, Any]:
        if name not in self.executed:
            self.executed[name] = execute_reference(corpus.read(name))[0]
        return self.executed[name]


@pytest.fixture(scope="session")
def references() -> References:
    return References()


def tags(cell: dict[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def test_the_corpus_is_stored_clean_and_big_enough() -> None:
    """Stored without outputs (the reference is made in the session, never kept), Python
    notebooks, and as large as issue 12 asks: 15+ notebooks, 250+ code cells, a few that
    raise on purpose."""
    names = corpus.names()
    cells = [cell for name in names for cell in corpus.code_cells(corpus.read(name))]
    assert len(names) >= 15 and len(cells) >= 250, (len(names), len(cells))
    assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in cells)
    assert all(corpus.read(n)["metadata"]["kernelspec"]["name"] == "python3" for n in names)
    assert sum(EXPECTED_ERROR_TAG in tags(cell) for cell in cells) >= 5
    assert set(corpus.REPRESENTATIVE) <= set(names)


@pytest.mark.slow
@pytest.mark.parametrize("name", corpus.selected())
def test_corpus_notebook_replays_cell_by_cell_like_nbclient(
    client: Client, backend: str, name: str, references: References
) -> None:
    want = references.get(name)
    for index, cell in enumerate(want["cells"]):  # the corpus does what it is meant to
        if cell["cell_type"] == "code":
            errors = [o["ename"] for o in cell["outputs"] if o["output_type"] == "error"]
            assert cell["execution_count"] is not None, f"nbclient: cell {index} did not run"
            assert bool(errors) == (EXPECTED_ERROR_TAG in tags(cell)), (
                f"nbclient: cell {index} raised {errors}, tags {tags(cell)}"
            )
    answer = corpus.replay(client, corpus.read(name))
    differences = cell_differences(answer["notebook"], want)
    total = len(corpus.code_cells(want))
    assert not differences, (
        f"{name} on {backend}: {len(differences)} of {total} code cells differ from nbclient:\n"
        + "\n".join(differences)
    )
    assert answer["run"]["status"] == "succeeded", answer["run"]["notes"]
