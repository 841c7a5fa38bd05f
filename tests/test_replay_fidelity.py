"""Notebook replay gives each cell the outputs Jupyter would give it (issue 12).

A single run's `outputs` also carry the images the code wrote with `savefig` (agents read
them there); a replayed cell does not, since Jupyter shows nothing for a `savefig` call:
those charts are in the record's `charts` only (docs/API.md, "Replay and single runs").
"""

from __future__ import annotations

from typing import Any

from tests.support import Client


def code_cell(source: str) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "id": str(abs(hash(source)))[:8],
        "metadata": {},
        "source": source,
        "outputs": [],
        "execution_count": None,
    }


def test_a_savefig_cell_gains_no_output_but_its_chart_is_in_the_record(client: Client) -> None:
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            code_cell(
                "import matplotlib.pyplot as plt\n"
                "fig, ax = plt.subplots(); ax.plot([1, 2]); ax.set_title('saved')\n"
                "fig.savefig('my_figure.png')\n"
                "plt.close(fig)"
            ),
            code_cell("plt.plot([3, 1]); plt.title('shown')"),
        ],
    }
    response = client.request("POST", "/v1/notebooks/run", {"notebook": notebook})
    assert response.status == 200, response.body[:500]
    answer = response.json()
    saved, shown = answer["notebook"]["cells"]
    assert saved["outputs"] == []
    assert [o["output_type"] for o in shown["outputs"]] == ["execute_result", "display_data"]
    charts = answer["run"]["charts"]
    assert [(c["source"], c["spec"]["title"]) for c in charts] == [
        ("savefig", "saved"),
        ("display", "shown"),
    ]
    assert charts[0]["path"] == "my_figure.png"
    # a single run of the same code still shows the saved chart among its outputs
    single = client.run(code=notebook["cells"][0]["source"])
    assert [o["metadata"]["gateway"]["source"] for o in single["outputs"]] == ["savefig"]
