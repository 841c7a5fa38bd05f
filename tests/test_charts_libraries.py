"""Charts beyond matplotlib (issue 23): seaborn's come back with the same chart specs (it draws
with matplotlib), a plotly figure as its own MIME bundle (its JSON and HTML) with a spec of
its traces; on every backend whose kernels have the library (the Docker image's
datascience profile; the local backend where the venv has it). And a chart's metadata from a
kernel is its word: what does not fit the API's chart is left out, never a failed run."""

from __future__ import annotations

import json

import pytest

from tests import kernel_environment
from tests.support import Client, GatewayThread

PLOTLY = "application/vnd.plotly.v1+json"


@pytest.fixture
def seaborn(gateway: GatewayThread) -> Client:
    kernel_environment.require(gateway, "python", "seaborn")
    return gateway.client()


@pytest.fixture
def plotly(gateway: GatewayThread) -> Client:
    kernel_environment.require(gateway, "python", "plotly", "nbformat")
    return gateway.client()


def test_seaborn_charts_have_matplotlibs_specs(seaborn: Client) -> None:
    code = (
        "import seaborn as sns, pandas as pd, matplotlib.pyplot as plt\n"
        "df = pd.DataFrame({'g': ['a', 'a', 'b', 'b'], 'x': [1, 2, 3, 4], 'y': [2, 4, 3, 5]})\n"
        "sns.barplot(data=df, x='g', y='y')\nplt.title('means')\nplt.show()\n"
        "sns.scatterplot(data=df, x='x', y='y', hue='g')\nplt.show()\n"
        "sns.lineplot(data=df, x='x', y='y')\nplt.show()\n"
    )
    record = seaborn.run(code=code)
    assert record["status"] == "succeeded", record["error"]
    bars, points, line = (chart["spec"] for chart in record["charts"])
    # the bar chart is the bars alone (seaborn's error bars are no series of their own)
    assert (bars["type"], bars["title"], bars["x_label"], bars["y_label"]) == (
        "bar",
        "means",
        "g",
        "y",
    )
    (series,) = bars["series"]
    assert series["y"] == [3, 4] and series["tick_labels"] == ["a", "b"]
    # the scatter is its points alone (the legend's handles hold no data)
    assert points["type"] == "scatter"
    assert [(s["x"], s["y"]) for s in points["series"]] == [([1, 2, 3, 4], [2, 4, 3, 5])]
    assert line["type"] == "line" and line["series"][0]["y"] == [2, 4, 3, 5]


def test_a_plotly_figure_is_its_own_bundle_with_a_spec(plotly: Client) -> None:
    code = (
        "import plotly.express as px, plotly.graph_objects as go\n"
        "px.line(x=[1, 2, 3], y=[2, 4, 3], title='trend', labels={'x': 'day', 'y': 'n'}).show()\n"
        "go.Figure([go.Bar(x=['a', 'b'], y=[3, 5], name='votes')],\n"
        "          layout={'title': {'text': 'bars'}})\n"
    )
    record = plotly.run(code=code)
    assert record["status"] == "succeeded", record["error"]
    shown, value = record["outputs"]
    for output in (shown, value):
        assert output["output_type"] == "display_data"
        assert {PLOTLY, "text/html"} <= set(output["data"])
        assert "plotly" in output["data"]["text/html"].lower()
    line, bars = record["charts"]
    assert (line["mime"], line["source"]) == (PLOTLY, "display")
    figure = json.loads(line["data"])
    assert figure["layout"]["title"]["text"] == "trend"
    assert line["spec"] == {
        "type": "line",
        "title": "trend",
        "x_label": "day",
        "y_label": "n",
        "series": [{"type": "line", "label": None, "x": [1, 2, 3], "y": [2, 4, 3]}],
        "axes": None,
    }
    assert (bars["spec"]["type"], bars["spec"]["title"]) == ("bar", "bars")
    assert bars["spec"]["series"] == [
        {"type": "bar", "label": "votes", "x": ["a", "b"], "y": [3, 5]}
    ]


def test_plotly_traces_from_numpy_and_a_pie(plotly: Client) -> None:
    """numpy arrays reach the figure's JSON as plotly's base64 typed arrays."""
    code = (
        "import numpy as np, plotly.graph_objects as go\n"
        "go.Figure([go.Scatter(x=np.arange(4), y=np.linspace(0, 1.5, 4), mode='markers'),\n"
        "           go.Pie(labels=['u', 'v'], values=[1, 3])])\n"
    )
    record = plotly.run(code=code)
    (chart,) = record["charts"]
    scatter, pie = chart["spec"]["series"]
    assert chart["spec"]["type"] == "mixed"
    assert (scatter["type"], scatter["x"], scatter["y"]) == (
        "scatter",
        [0, 1, 2, 3],
        [0, 0.5, 1, 1.5],
    )
    assert (pie["type"], pie["y"], pie["labels"]) == ("pie", [1, 3], ["u", "v"])


@pytest.mark.attack
def test_a_displays_own_gateway_metadata_never_fails_the_run(client: Client) -> None:
    """User code may publish any metadata: `metadata.gateway` as a string made the gateway
    fail the whole run ('the gateway failed while running this'). What does not fit the
    API's chart (a path that is no string, a spec of another shape) is left out of it."""
    code = (
        "from IPython.display import publish_display_data\n"
        "png = 'iVBORw0KGgo='\n"
        "publish_display_data({'image/png': png}, metadata={'gateway': 'nonsense'})\n"
        "publish_display_data({'image/png': png},\n"
        "    metadata={'gateway': {'source': 'savefig', 'path': 5, 'spec': {'type': []}}})\n"
        "print('still here')\n"
    )
    record = client.run(code=code)
    assert (record["status"], record["stdout"]) == ("succeeded", "still here\n")
    assert record["charts"] == [
        {"mime": "image/png", "data": "iVBORw0KGgo=", "source": "display"},
        {"mime": "image/png", "data": "iVBORw0KGgo=", "source": "savefig"},
    ]


@pytest.mark.attack
def test_an_output_nbformat_refuses_loses_nothing_after_it(client: Client) -> None:
    """A display nbformat refuses (an image that is a number) stopped the gateway reading the
    cell's output: everything printed after it was lost, and the run still 'succeeded'."""
    code = (
        "from IPython.display import publish_display_data\n"
        "print('before')\n"
        "publish_display_data({'image/png': 12345})\n"
        "print('after')\n"
        "publish_display_data({'text/plain': 'shown'})\n"
    )
    record = client.run(code=code)
    assert (record["status"], record["stdout"]) == ("succeeded", "before\nafter\n")
    assert record["outputs"][-1]["data"] == {"text/plain": "shown"}
    assert record["charts"] == []
    assert any("not a valid nbformat output" in note for note in record["notes"])
