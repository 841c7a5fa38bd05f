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


def charts_from_outputs(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
            spec = _spec(meta.get("spec"))
            if spec is not None:
                chart["spec"] = spec
            charts.append(chart)
            break
    return charts
