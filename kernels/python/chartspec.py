"""Read a chart's data back from a matplotlib figure: type, title, axis labels, series.

Best effort and bounded: a figure we cannot read gives None, never an exception.
"""

from __future__ import annotations

from typing import Any

MAX_POINTS = 1000


def _values(seq: Any) -> list[Any]:
    out: list[Any] = []
    for item in list(seq)[:MAX_POINTS]:
        if hasattr(item, "item"):
            item = item.item()
        if isinstance(item, float) and item != item:  # NaN is not JSON
            item = None
        out.append(item if isinstance(item, int | float | str) or item is None else str(item))
    return out


def _axes_spec(ax: Any) -> dict[str, Any]:
    series: list[dict[str, Any]] = []
    kinds: list[str] = []
    for line in ax.get_lines():
        label = line.get_label()
        series.append(
            {
                "type": "line",
                "label": None if label.startswith("_") else label,
                "x": _values(line.get_xdata()),
                "y": _values(line.get_ydata()),
            }
        )
        kinds.append("line")
    for container in getattr(ax, "containers", []):
        if type(container).__name__ == "BarContainer":
            patches = list(container)
            label = container.get_label()
            horizontal = getattr(container, "orientation", "vertical") == "horizontal"
            names = [
                t.get_text() for t in (ax.get_yticklabels() if horizontal else ax.get_xticklabels())
            ]
            series.append(
                {
                    "type": "bar",
                    "label": None if not label or label.startswith("_") else label,
                    "x": _values(
                        p.get_y() if horizontal else p.get_x() + p.get_width() / 2 for p in patches
                    ),
                    "y": _values(p.get_width() if horizontal else p.get_height() for p in patches),
                    "tick_labels": names[:MAX_POINTS],
                }
            )
            kinds.append("bar")
    for collection in ax.collections:
        if type(collection).__name__ == "PathCollection":
            offsets = collection.get_offsets()
            label = collection.get_label()
            series.append(
                {
                    "type": "scatter",
                    "label": None if not label or label.startswith("_") else label,
                    "x": _values(offsets[:, 0]) if len(offsets) else [],
                    "y": _values(offsets[:, 1]) if len(offsets) else [],
                }
            )
            kinds.append("scatter")
    wedges = [p for p in ax.patches if type(p).__name__ == "Wedge"]
    if wedges:
        texts = [t.get_text() for t in ax.texts]
        series.append(
            {
                "type": "pie",
                "label": None,
                "y": _values(w.theta2 - w.theta1 for w in wedges),
                "labels": texts[: len(wedges)],
            }
        )
        kinds.append("pie")
    kind = kinds[0] if len(set(kinds)) == 1 else ("mixed" if kinds else "unknown")
    return {
        "type": kind,
        "title": ax.get_title() or None,
        "x_label": ax.get_xlabel() or None,
        "y_label": ax.get_ylabel() or None,
        "series": series,
    }


def figure_spec(figure: Any) -> dict[str, Any] | None:
    try:
        axes = [_axes_spec(ax) for ax in figure.get_axes()]
        suptitle = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
    except Exception:
        return None
    if not axes:
        return None
    first = axes[0]
    return {
        "type": first["type"] if len(axes) == 1 else "subplots",
        "title": suptitle or first["title"],
        "x_label": first["x_label"],
        "y_label": first["y_label"],
        "series": first["series"],
        "axes": axes if len(axes) > 1 else None,
    }
