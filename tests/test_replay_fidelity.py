"""Notebook replay gives each cell the outputs Jupyter would give it (issue 12).

A single run's `outputs` also carry the images the code wrote with `savefig` (agents read
them there); a replayed cell does not, since Jupyter shows nothing for a `savefig` call:
those charts are in the record's `charts` only (docs/API.md, "Replay and single runs").

A notebook's cells also see what Jupyter gives them: a display updated by its id (from any
later cell) and modules in the notebook's own folder. The whole corpus of notebooks is
compared with nbclient in test_replay_corpus.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.api import notebook_json
from tests.notebook_compare import assert_same_execution, execute_reference
from tests.support import Client

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend


def code_cell(source: str) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "id": str(abs(hash(source)))[:8],
        "metadata": {},
        "source": source,
        "outputs": [],
        "execution_count": None,
    }


def python_notebook(*sources: str) -> dict[str, Any]:
    return notebook_json(
        *(code_cell(source) for source in sources),
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )


def test_a_savefig_cell_gains_no_output_but_its_chart_is_in_the_record(client: Client) -> None:
    notebook = notebook_json(
        code_cell(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(); ax.plot([1, 2]); ax.set_title('saved')\n"
            "fig.savefig('my_figure.png')\n"
            "plt.close(fig)"
        ),
        code_cell("plt.plot([3, 1]); plt.title('shown')"),
    )
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


def test_a_display_update_reaches_every_output_with_its_id_as_in_jupyter(client: Client) -> None:
    """An `update_display_data`, or a `display_data` that reuses a display id, changes every
    earlier output with that id, in whichever cell it is: so Jupyter front ends and nbclient
    show a status display finished by a later cell. Failed before the fix (issue 12): the
    replay applied an update only to outputs of the cell that sent it, and never applied a
    repeated `display_data` to the earlier outputs."""
    nb = python_notebook(
        "status = display('working', display_id=True)\nstatus.update('half way')",
        "status.update('done, said a later cell')",
        "display('first', display_id='shared')\ndisplay('second', display_id='shared')",
    )
    want, _ = execute_reference(nb)
    response = client.request("POST", "/v1/notebooks/run", {"notebook": nb})
    assert response.status == 200, response.body[:500]
    got = response.json()["notebook"]
    shown = [[o["data"]["text/plain"] for o in cell["outputs"]] for cell in got["cells"]]
    handle = "<DisplayHandle display_id=shared>"  # the last expression's value, as in Jupyter
    assert shown == [["'done, said a later cell'"], [], ["'second'", "'second'", handle]]
    assert_same_execution(got, want)


def test_a_notebook_imports_modules_from_its_own_folder(client: Client) -> None:
    """In Jupyter the kernel's working folder is on `sys.path`: a notebook imports the helper
    module it wrote (`%%writefile`) or that came with it (`files`). Failed before the fix
    (issue 12): the kernel starts under `python -P`, and IPython >= 9.7 then leaves the
    working folder off `sys.path` (it honours `sys.flags.safe_path`)."""
    nb = python_notebook(
        "%%writefile written_helper.py\nVALUE = 40",
        "import staged_helper\nimport written_helper\nprint(written_helper.VALUE + staged_helper.VALUE)",
    )
    files = [{"path": "staged_helper.py", "content": "VALUE = 2\n"}]
    response = client.request("POST", "/v1/notebooks/run", {"notebook": nb, "files": files})
    assert response.status == 200, response.body[:500]
    answer = response.json()
    assert answer["run"]["status"] == "succeeded", answer["run"]["error"]
    assert answer["run"]["stdout"] == "Writing written_helper.py\n42\n"


def test_an_executed_notebook_is_the_size_jupyters_would_be(client: Client) -> None:
    """Issue 33, item 7: a chart's plotted points stay in the record's `charts`, where
    agents read them; the notebook's outputs keep what Jupyter would write (and the chart's
    title), not every point again."""
    points = 1000
    notebook = python_notebook(
        "import matplotlib.pyplot as plt\n"
        f"xs = list(range({points}))\n"
        "for k in range(3): plt.plot(xs, [x * k * 0.5 for x in xs], label=f's{k}')\n"
        "plt.title('many points'); plt.show()",
        "plt.bar(['a', 'b'], [3, 4]); plt.title('bars')",
    )
    response = client.request("POST", "/v1/notebooks/run", {"notebook": notebook})
    assert response.status == 200, response.body[:500]
    answer = response.json()
    charts = answer["run"]["charts"]
    assert [c["spec"]["title"] for c in charts] == ["many points", "bars"]
    assert [len(s["y"]) for s in charts[0]["spec"]["series"]] == [points] * 3
    outputs = [o for cell in answer["notebook"]["cells"] for o in cell["outputs"]]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2
    for output, title in zip(images, ["many points", "bars"], strict=True):
        assert output["metadata"].get("gateway", {}).get("title") == title
        assert "spec" not in output["metadata"].get("gateway", {})
    # the notebook as downloaded: its images and little else
    run_id = answer["run"]["id"]
    stored = client.request("GET", f"/v1/runs/{run_id}/notebook")
    assert stored.status == 200
    png_bytes = sum(len(o["data"]["image/png"]) for o in images)
    assert len(stored.body) < png_bytes + 20_000, (len(stored.body), png_bytes)
    assert b'"series"' not in stored.body
    # a single run's outputs are slim too; its record keeps the points
    record = client.request("POST", "/v1/runs", {"code": notebook["cells"][0]["source"]}).json()
    assert len(record["charts"][0]["spec"]["series"][0]["y"]) == points
    assert all("spec" not in o.get("metadata", {}).get("gateway", {}) for o in record["outputs"])
