"""A chart's data travels in the record, not in its output (issue 33, item 7): the output
collector takes `metadata.gateway.spec` out of each display as it arrives (and out of a
display's update), keeping the chart's title, and hands the data to the record's `charts`.
The collector alone, fed the messages a kernel sends: no kernel needed."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.execution.charts import TITLE_CHARS, charts_from_outputs
from gateway.execution.collector import Caps, OutputCollector

pytestmark = pytest.mark.fast

PNG = "iVBORw0KGgo="


def spec(title: str, points: int) -> dict[str, Any]:
    series = {"type": "line", "label": None, "x": list(range(points)), "y": list(range(points))}
    return {"type": "line", "title": title, "x_label": None, "y_label": None, "series": [series]}


def message(kind: str, meta: dict[str, Any], display_id: str | None = None) -> dict[str, Any]:
    content: dict[str, Any] = {"data": {"image/png": PNG}, "metadata": meta}
    if display_id is not None:
        content["transient"] = {"display_id": display_id}
    return {"header": {"msg_type": kind}, "content": content}


def collector(live: list[dict[str, Any]]) -> OutputCollector:
    caps = Caps(stream_bytes=10_000, display_bytes=10_000_000, limit_bytes=10**9)
    return OutputCollector(caps, listener=lambda output, _id, _update: live.append(output))


def test_a_displays_chart_data_goes_to_the_record_not_its_output() -> None:
    live: list[dict[str, Any]] = []
    cell = collector(live)
    cell.add(message("display_data", {"gateway": {"source": "display", "spec": spec("t", 500)}}))
    (output,) = cell.outputs()
    assert output["metadata"] == {"gateway": {"source": "display", "title": "t"}}
    assert live == [output]  # what streams live is slim as well
    (chart,) = charts_from_outputs([output], cell.chart_specs())
    assert chart["spec"]["title"] == "t" and len(chart["spec"]["series"][0]["y"]) == 500


def test_an_updated_display_carries_its_new_charts_data() -> None:
    cell = collector([])
    cell.add(message("display_data", {"gateway": {"spec": spec("first", 3)}}, "d1"))
    cell.add(message("update_display_data", {"gateway": {"spec": spec("second", 4)}}, "d1"))
    (output,) = cell.outputs()
    assert output["metadata"] == {"gateway": {"title": "second"}}
    (chart,) = charts_from_outputs([output], cell.chart_specs())
    assert chart["spec"]["title"] == "second" and len(chart["spec"]["series"][0]["y"]) == 4


def test_a_title_is_cut_and_other_metadata_kept() -> None:
    cell = collector([])
    meta = {"gateway": {"source": "savefig", "path": "a.png", "spec": spec("x" * 5000, 1)}}
    cell.add(message("display_data", {**meta, "image/png": {"width": 10}}))
    (output,) = cell.outputs()
    assert output["metadata"]["image/png"] == {"width": 10}
    gateway = output["metadata"]["gateway"]
    assert gateway == {"source": "savefig", "path": "a.png", "title": "x" * TITLE_CHARS}


def test_a_display_without_chart_data_is_untouched() -> None:
    cell = collector([])
    cell.add(message("display_data", {"isolated": True}))
    (output,) = cell.outputs()
    assert output["metadata"] == {"isolated": True}
    assert cell.chart_specs() == {}
