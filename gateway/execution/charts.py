"""The run record's `charts`: every image among the outputs, with where it came from."""

from __future__ import annotations

from typing import Any

IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")


def is_saved_chart(output: dict[str, Any]) -> bool:
    """An image our kernel published because the code called `savefig` (not a display)."""
    meta = (output.get("metadata") or {}).get("gateway") or {}
    return output.get("output_type") == "display_data" and meta.get("source") == "savefig"


def charts_from_outputs(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    charts: list[dict[str, Any]] = []
    for output in outputs:
        if output.get("output_type") not in ("display_data", "execute_result"):
            continue
        data = output.get("data", {})
        meta = (output.get("metadata") or {}).get("gateway") or {}
        for mime in IMAGE_MIMES:
            if mime not in data:
                continue
            value = data[mime]
            chart: dict[str, Any] = {
                "mime": mime,
                "data": "".join(value) if isinstance(value, list) else value,
                "source": "savefig" if meta.get("source") == "savefig" else "display",
            }
            if meta.get("path"):
                chart["path"] = meta["path"]
            if meta.get("spec"):
                chart["spec"] = meta["spec"]
            charts.append(chart)
            break
    return charts
