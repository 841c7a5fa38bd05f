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


def _is_error_bar(line: Any) -> bool:
    """A two-point segment at one x (or one y): the error bar seaborn draws over a bar."""
    x, y = list(line.get_xdata()), list(line.get_ydata())
    return len(x) == 2 and len(y) == 2 and (x[0] == x[1] or y[0] == y[1])


def _axes_spec(ax: Any) -> dict[str, Any]:
    series: list[dict[str, Any]] = []
    kinds: list[str] = []
    has_bars = any(type(c).__name__ == "BarContainer" for c in getattr(ax, "containers", []))
    for line in ax.get_lines():
        if len(line.get_xdata()) == 0:
            continue  # a legend's handle (seaborn), not data
        if has_bars and _is_error_bar(line):
            continue
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


# --- plotly ----------------------------------------------------------------------------------

PLOTLY_MIME = "application/vnd.plotly.v1+json"
# plotly's typed arrays in a figure's JSON (`{"dtype": "f8", "bdata": base64}`)
_TYPED = {"f8": "d", "f4": "f", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I"}


def _plotly_values(value: Any) -> list[Any]:
    if isinstance(value, dict) and "bdata" in value and value.get("dtype") in _TYPED:
        import array
        import base64

        decoded = array.array(_TYPED[value["dtype"]])
        raw = base64.b64decode(value["bdata"])
        raw = raw[: len(raw) - len(raw) % decoded.itemsize]
        decoded.frombytes(raw[: MAX_POINTS * decoded.itemsize])
        value = decoded.tolist()
    if isinstance(value, list | tuple):
        return _values(value)
    return []


def _plotly_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("text")
    return value if isinstance(value, str) and value else None


def _plotly_trace(trace: Any) -> dict[str, Any] | None:
    if not isinstance(trace, dict):
        return None
    kind = trace.get("type", "scatter")
    name = trace.get("name")
    label = name if isinstance(name, str) and name else None
    if kind == "pie":
        return {
            "type": "pie",
            "label": label,
            "y": _plotly_values(trace.get("values")),
            "labels": [str(v) for v in _plotly_values(trace.get("labels"))],
        }
    if kind in ("scatter", "scattergl"):
        mode = str(trace.get("mode") or "lines")
        series_type = "line" if "lines" in mode else "scatter"
    elif kind == "bar":
        series_type = "bar"
    else:
        return None
    x, y = _plotly_values(trace.get("x")), _plotly_values(trace.get("y"))
    if kind == "bar" and trace.get("orientation") == "h":
        x, y = y, x
    if not y and x:  # a trace given only x counts its index as x
        x, y = list(range(len(x))), x
    return {"type": series_type, "label": label, "x": x, "y": y}


def plotly_spec(figure: Any) -> dict[str, Any] | None:
    """The chart spec of a plotly figure's JSON (its traces: line, scatter, bar, pie);
    None for a figure with none of those."""
    try:
        if not isinstance(figure, dict):
            return None
        layout = figure.get("layout")
        if not isinstance(layout, dict):
            layout = {}
        traces = [_plotly_trace(t) for t in (figure.get("data") or [])[:100]]
        series = [t for t in traces if t is not None]
        if not series:
            return None
        kinds = {s["type"] for s in series}
        xaxis, yaxis = layout.get("xaxis") or {}, layout.get("yaxis") or {}
        return {
            "type": kinds.pop() if len(kinds) == 1 else "mixed",
            "title": _plotly_text(layout.get("title")),
            "x_label": _plotly_text(xaxis.get("title")) if isinstance(xaxis, dict) else None,
            "y_label": _plotly_text(yaxis.get("title")) if isinstance(yaxis, dict) else None,
            "series": series,
            "axes": None,
        }
    except Exception:
        return None
