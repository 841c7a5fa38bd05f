"""The run record's `charts`: every image among the outputs, and every plotly figure, with
where it came from.

A kernel's outputs are its own word: a display may carry any metadata (user code can publish
`metadata={"gateway": ...}` of its own), so what a chart takes from it is checked (the spec
against `ChartSpec`, the path as a string) and anything else is left out, never a failure.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.models.record import ChartSpec

IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
PLOTLY_MIME = "application/vnd.plotly.v1+json"  # the figure's JSON (kernels/python/startup.py)
TITLE_CHARS = 200  # of a chart's title, kept in its output's metadata


def _gateway_meta(output: dict[str, Any]) -> dict[str, Any]:
    metadata = output.get("metadata")
    meta = metadata.get("gateway") if isinstance(metadata, dict) else None
    return meta if isinstance(meta, dict) else {}


def is_saved_chart(output: dict[str, Any]) -> bool:
    """An image our kernel published because the code called `savefig` (not a display)."""
    meta = _gateway_meta(output)
    return output.get("output_type") == "display_data" and meta.get("source") == "savefig"


def _spec(value: Any) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        return ChartSpec.model_validate(value).model_dump(mode="json", exclude_unset=True)
    except ValidationError:
        return None


def _text(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    return value if isinstance(value, str) else None


def slimmed(metadata: Any) -> tuple[Any, Any]:
    """An output's metadata as a notebook keeps it, and the chart data it carried: our
    kernels describe a chart in `metadata.gateway.spec` (every plotted point, up to 1000 a
    series: hundreds of KiB), which the record's `charts` keep; the output keeps only the
    chart's `title` there (at most `TITLE_CHARS`), so that an executed notebook is the size
    Jupyter's would be."""
    meta = metadata.get("gateway") if isinstance(metadata, dict) else None
    if not isinstance(meta, dict) or "spec" not in meta:
        return metadata, None
    kept = {key: value for key, value in meta.items() if key != "spec"}
    spec = meta["spec"]
    title = spec.get("title") if isinstance(spec, dict) else None
    if isinstance(title, str) and title:
        kept["title"] = title[:TITLE_CHARS]
    return {**metadata, "gateway": kept}, spec


def charts_from_outputs(
    outputs: list[dict[str, Any]], specs: dict[int, Any] | None = None
) -> list[dict[str, Any]]:
    """The charts among `outputs`; `specs` are the chart data the outputs carried, by
    their `id()` (`slimmed`)."""
    specs = specs or {}
    charts: list[dict[str, Any]] = []
    for output in outputs:
        if output.get("output_type") not in ("display_data", "execute_result"):
            continue
        data = output.get("data")
        if not isinstance(data, dict):
            continue
        meta = _gateway_meta(output)
        for mime in (*IMAGE_MIMES, PLOTLY_MIME):
            if mime not in data:
                continue
            value = data[mime]
            text = json.dumps(value, separators=(",", ":")) if mime == PLOTLY_MIME else _text(value)
            if text is None:
                continue
            chart: dict[str, Any] = {
                "mime": mime,
                "data": text,
                "source": "savefig" if meta.get("source") == "savefig" else "display",
            }
            if isinstance(meta.get("path"), str) and meta["path"]:
                chart["path"] = meta["path"]
            spec = _spec(specs.get(id(output), meta.get("spec")))
            if spec is not None:
                chart["spec"] = spec
            charts.append(chart)
            break
    return charts
