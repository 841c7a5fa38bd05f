"""Startup code of the Python kernel, loaded as an IPython extension before any user code.

It makes charts come back without the user asking: `plt.show()` and figures left open are
displayed by matplotlib's inline backend (with the chart's data in the output metadata),
and every `savefig` call also publishes the saved image with its path. A plotly figure is
displayed as its own MIME bundle (`application/vnd.plotly.v1+json` and an HTML snippet that
loads plotly.js from its CDN), with the spec of its traces in the metadata. It also holds the
two helpers the gateway calls through silent requests: `prepare` and `result_value`.
stdout and stderr keep the order the program wrote them in, within bounded buffers
(`kernels.python.streams`). No code is prepended to the user's cell.
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import io
import json
import keyword
import os
import shutil
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kernels.python import caps
from kernels.python.chartspec import PLOTLY_MIME, figure_spec, plotly_spec
from kernels.python.streams import keep_every_message, patch_out_stream

_RESERVED = frozenset({"input", "result", "output"})
_SAVED_MIME = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".svg": "image/svg+xml",
}
_MAX_PUBLISHED_BYTES = 16 * 1024 * 1024
_state = threading.local()


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


# --- vars and result ---------------------------------------------------------------------


def prepare(payload: str) -> None:
    """Apply what belongs to one run when it claims this kernel: `{"env", "vars"}`.

    `env` goes into the process environment (so subprocesses get it too; a `PYTHONPATH`
    also reaches `sys.path`, as it would have at start), then `vars` become globals.
    """
    request = json.loads(payload)
    env = request.get("env") or {}
    os.environ.update(env)
    for entry in reversed((env.get("PYTHONPATH") or "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(1, entry)
    if request.get("vars"):
        inject_vars(request["vars"])


def preload(payload: str) -> None:
    """A pooled kernel imports the slow modules ahead (names only in `sys.modules`, none in
    the user's namespace) and draws one figure, so that its first chart costs only the
    drawing."""
    import importlib

    for name in json.loads(payload):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"[gateway] could not preload {name}: {exc}", file=sys.stderr)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:  # fonts and the Agg renderer ready; nothing is displayed
        figure = pyplot.figure()
        figure.canvas.draw()
        pyplot.close(figure)


def inject_vars(values: dict[str, Any]) -> None:
    """Make each valid, unreserved key a global and every key part of the `input` dict."""
    namespace = _shell().user_ns
    namespace["input"] = dict(values)
    for key, value in values.items():
        if key.isidentifier() and not keyword.iskeyword(key) and key not in _RESERVED:
            namespace[key] = value


class _JSONResult:
    """Formatted by IPython as `application/json`, so the gateway gets the value as JSON.
    Its `text/plain` is a name only: nothing reads it, and the value a second time would
    double the reply (the whole of it counts as the kernel's output)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload

    def _repr_json_(self) -> dict[str, Any]:
        return self.payload

    def __repr__(self) -> str:
        return "<gateway result>"


def _to_json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if hasattr(value, "to_dict"):  # pandas objects
        return value.to_dict()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def result_value(max_bytes: int | None = None) -> _JSONResult:
    """`{"present", "name", "value"}` of the global `result` (else `output`), or an error;
    past `max_bytes` as JSON, its `size` instead of the value: a value the gateway would not
    keep is never sent (a 100 MB one would not fit in a kernel message)."""
    namespace = _shell().user_ns
    for name in ("result", "output"):
        if name in namespace:
            value = namespace[name]
            try:
                text = json.dumps(value, default=_to_json_default, allow_nan=False)
            except (TypeError, ValueError, RecursionError) as exc:
                return _JSONResult({"present": True, "name": name, "error": str(exc)})
            if max_bytes is not None and len(text) > max_bytes:
                return _JSONResult({"present": True, "name": name, "size": len(text)})
            return _JSONResult({"present": True, "name": name, "value": json.loads(text)})
    return _JSONResult({"present": False})


# --- charts ------------------------------------------------------------------------------


def _publish_image(mime: str, data: bytes, metadata: dict[str, Any]) -> None:
    from IPython.display import publish_display_data

    if len(data) > _MAX_PUBLISHED_BYTES:
        print(f"[gateway] a saved chart of {len(data)} bytes was not returned", file=sys.stderr)
        return
    text = (
        data.decode("utf-8", "replace")
        if mime == "image/svg+xml"
        else base64.b64encode(data).decode("ascii")
    )
    publish_display_data({mime: text, "text/plain": "<Figure>"}, metadata=metadata)


def _savefig_publisher(original: Callable[..., Any]) -> Callable[..., Any]:
    def savefig(self: Any, fname: Any, *args: Any, **kwargs: Any) -> Any:
        outcome = original(self, fname, *args, **kwargs)
        if getattr(_state, "busy", False):
            return outcome
        _state.busy = True
        try:
            _publish_saved(self, original, fname, kwargs)
        except Exception as exc:  # a chart we cannot publish must not break the user's code
            print(f"[gateway] could not return a saved chart: {exc}", file=sys.stderr)
        finally:
            _state.busy = False
        return outcome

    savefig.__wrapped__ = original  # type: ignore[attr-defined]
    savefig.__doc__ = original.__doc__
    return savefig


def _publish_saved(
    figure: Any, original: Callable[..., Any], fname: Any, kwargs: dict[str, Any]
) -> None:
    path: str | None = None
    if isinstance(fname, str | os.PathLike):
        path = os.fspath(fname)
    gateway_meta: dict[str, Any] = {"source": "savefig", "path": path}
    spec = figure_spec(figure)
    if spec is not None:
        gateway_meta["spec"] = spec
    fmt = (kwargs.get("format") or (Path(path).suffix if path else "")).lower().lstrip(".")
    mime = _SAVED_MIME.get("." + fmt)
    if path is not None and mime is not None and os.path.isfile(path):
        data = Path(path).read_bytes()
    else:  # a PDF, a buffer, an unusual format: publish a PNG rendering of the same figure
        buffer = io.BytesIO()
        original(figure, buffer, format="png", dpi=kwargs.get("dpi", "figure"))
        data, mime = buffer.getvalue(), "image/png"
    _publish_image(mime, data, {"gateway": gateway_meta})


def _patch_figure(module: ModuleType) -> None:
    figure_cls = module.Figure
    if not hasattr(figure_cls.savefig, "__wrapped__"):
        figure_cls.savefig = _savefig_publisher(figure_cls.savefig)


def _patch_inline(module: ModuleType) -> None:
    """Add the chart's data to the metadata of every figure the inline backend displays."""
    fetch = getattr(module, "_fetch_figure_metadata", None)
    if fetch is None or hasattr(fetch, "__wrapped__"):
        return

    def fetch_with_spec(fig: Any) -> Any:
        metadata = dict(fetch(fig) or {})
        gateway_meta: dict[str, Any] = {"source": "display"}
        spec = figure_spec(fig)
        if spec is not None:
            gateway_meta["spec"] = spec
        metadata["gateway"] = gateway_meta
        return metadata

    fetch_with_spec.__wrapped__ = fetch  # type: ignore[attr-defined]
    module.__dict__["_fetch_figure_metadata"] = fetch_with_spec


def _patch_plotly(module: ModuleType) -> None:
    """plotly's renderers: ours is the default (plotly's own guess in a kernel would embed
    the whole plotly.js, megabytes, in every run's first figure, or need a front end)."""
    from plotly.io._base_renderers import MimetypeRenderer

    class GatewayRenderer(MimetypeRenderer):  # type: ignore[misc]
        """The figure's JSON for front ends that draw it (JupyterLab), and an HTML snippet
        that loads plotly.js from its CDN for the ones that show HTML."""

        def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, Any]:
            import plotly.io

            html = plotly.io.to_html(
                fig_dict, include_plotlyjs="cdn", full_html=False, validate=False
            )
            figure = json.loads(plotly.io.to_json(fig_dict, validate=False, remove_uids=False))
            return {PLOTLY_MIME: figure, "text/html": html}

    module.renderers["gateway"] = GatewayRenderer()
    module.renderers.default = "gateway"


def _with_plotly_spec(data: Any, metadata: Any) -> Any:
    """`metadata` with the spec of the plotly figure in `data`, if there is one."""
    figure = data.get(PLOTLY_MIME) if isinstance(data, dict) else None
    if figure is None or (isinstance(metadata, dict) and "gateway" in metadata):
        return metadata
    gateway_meta: dict[str, Any] = {"source": "display"}
    spec = plotly_spec(figure)
    if spec is not None:
        gateway_meta["spec"] = spec
    return {**(metadata or {}), "gateway": gateway_meta}


def _with_chart_specs(publish: Callable[..., Any]) -> Callable[..., Any]:
    """The display publisher, adding the spec of a plotly figure it publishes (`fig.show()`,
    `display(fig)`: plotly displays its own bundle)."""

    def publish_with_specs(data: Any, metadata: Any = None, *args: Any, **kwargs: Any) -> Any:
        return publish(data, _with_plotly_spec(data, metadata), *args, **kwargs)

    publish_with_specs.__wrapped__ = publish  # type: ignore[attr-defined]
    return publish_with_specs


def _formatting_chart_specs(format_: Callable[..., Any]) -> Callable[..., Any]:
    """The display formatter, the same for a figure formatted as an object (a cell's value
    when plotly's own display fails, `_repr_mimebundle_`)."""

    def format_with_specs(*args: Any, **kwargs: Any) -> Any:
        data, metadata = format_(*args, **kwargs)
        return data, _with_plotly_spec(data, metadata)

    format_with_specs.__wrapped__ = format_  # type: ignore[attr-defined]
    return format_with_specs


_AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "ipykernel.iostream": patch_out_stream,
    "matplotlib.figure": _patch_figure,
    "matplotlib_inline.backend_inline": _patch_inline,
    "plotly.io._renderers": _patch_plotly,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception as exc:
            print(f"[gateway] could not patch {module.__name__}: {exc}", file=sys.stderr)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Runs a patch right after one of `_AFTER_IMPORT`'s modules is first imported."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = _AFTER_IMPORT.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def _seed_font_cache() -> None:
    """Copy a pre-built matplotlib font cache into this kernel's private config folder."""
    source, target = os.environ.get("GATEWAY_MPL_CACHE"), os.environ.get("MPLCONFIGDIR")
    if not source or not target or not os.path.isdir(source):
        return
    os.makedirs(target, exist_ok=True)
    for entry in os.scandir(source):
        if entry.name.endswith(".json") and entry.is_file():
            destination = os.path.join(target, entry.name)
            if not os.path.exists(destination):
                shutil.copyfile(entry.path, destination)


def unblock_debugpy() -> None:
    """Lift the launcher's block on `debugpy` once ipykernel has decided it has none."""
    import ipykernel.debugger  # noqa: F401  (imported while blocked, if not already)

    if "debugpy" in sys.modules and sys.modules["debugpy"] is None:
        del sys.modules["debugpy"]


def load_ipython_extension(ipython: Any) -> None:
    prepare_shell(ipython)
    attach_kernel(ipython)


def prepare_shell(ipython: Any) -> None:
    """What needs only the shell, once per shell and process-wide patches once per process.

    The forkserver's warm parent calls it when it builds the kernel's shell, before any fork
    (`kernels.python.prebuilt`); nothing here is any one kernel's own.
    """
    if getattr(ipython, "_gateway_prepared", False):
        return
    ipython._gateway_prepared = True
    caps.install(ipython)
    publisher = getattr(ipython, "display_pub", None)
    if publisher is not None and not hasattr(publisher.publish, "__wrapped__"):
        publisher.publish = _with_chart_specs(publisher.publish)
    formatter = getattr(ipython, "display_formatter", None)
    if formatter is not None and not hasattr(formatter.format, "__wrapped__"):
        formatter.format = _formatting_chart_specs(formatter.format)
    warnings.filterwarnings("ignore", message="To exit: use 'exit', 'quit', or Ctrl-D.")
    if not any(isinstance(finder, _AfterImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
    for name, patch in _AFTER_IMPORT.items():
        if name in sys.modules:
            patch(sys.modules[name])


def attach_kernel(ipython: Any) -> None:
    """What is this kernel's own: in the kernel process, once its sockets exist."""
    unblock_debugpy()
    # The kernel starts with `python -P`, so that nothing in the working folder runs while
    # it starts (our modules are imported by now); user code imports from it, as in Jupyter.
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        _seed_font_cache()
    except OSError as exc:  # only slower charts: matplotlib builds its own cache
        print(f"[gateway] no font cache: {exc}", file=sys.stderr)
    kernel = getattr(ipython, "kernel", None)
    if kernel is not None and getattr(kernel, "iopub_thread", None) is not None:
        keep_every_message(kernel.iopub_thread)
