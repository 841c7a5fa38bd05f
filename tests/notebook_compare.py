"""Notebooks executed by the reference executor (nbclient), and the comparison of another
execution (the gateway's replay) with it, cell by cell.

`execute_reference` runs a notebook with nbclient on kernels of this machine: `python3` is
ipykernel of the test interpreter (without the gateway's startup extension), `bash` is our
bash kernel (kernels/bash) started directly, without the gateway. What the gateway adds is
not there: its replay is compared against this, never against its own earlier output.

`cell_differences(got, want)` compares cell by cell and names every cell that differs;
`assert_same_execution(got, want)` fails if any does. Compared: the source, the execution
count, the text of each stream (joined per name: stdout and stderr come on different pipes),
and the other outputs in order: their type, an error's name and value, each MIME type's text,
and images by their decoded size plus a pixel check that the image is no blank canvas and
draws the same marks as the reference's. Output metadata is not compared (the gateway adds
its own). Normalised in every text: ANSI colours, memory addresses, timestamps, the
measurements of `%timeit` and `%time`, and the kernel's per-cell file
(`/tmp/ipykernel_<pid>/<hash>.py` in a warning), whose folder and pid are the kernel's own.
"""

from __future__ import annotations

import base64
import gc
import io
import json
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path
from typing import Any

import nbformat

from gateway.sandbox.kernelspec import kernel_argv
from gateway.terminal import strip_colors

REPO = Path(__file__).resolve().parent.parent

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,16}")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?")
_DURATION = r"[\d.]+ (?:ns|[μµu]s|ms|s)"  # IPython writes a Greek mu
# IPython's %timeit line; the loop count is measured too unless `-n` fixes it
_TIMEIT = re.compile(
    rf"{_DURATION} ± {_DURATION} per loop \(mean ± std\. dev\. of (\d+ runs?), [\d,]+ (loops?) each\)"
)
_TIMEIT_CACHED = re.compile(  # printed when the runs' times vary enough
    r"The slowest run took [\d.]+ times longer than the fastest\. "
    r"This could mean that an intermediate result is being cached\.\n"
)
_TIME = re.compile(rf"CPU times: user {_DURATION}, sys: {_DURATION}, total: {_DURATION}")
_WALL = re.compile(rf"Wall time: {_DURATION}")
_CELL_FILE = re.compile(r"[^\s'\"]*/ipykernel_\d+/")
IMAGES = ("image/png", "image/jpeg")
VECTOR = ("image/svg+xml",)


# --- the reference executor ------------------------------------------------------------------


def _kernel_specs(folder: Path) -> None:
    """Kernel specs for nbclient: this interpreter's ipykernel, and our bash kernel."""
    specs = {
        "python3": {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3",
            "language": "python",
        },
        "bash": {
            "argv": kernel_argv("bash", sys.executable, "{connection_file}"),
            "display_name": "Bash",
            "language": "bash",
            "env": {"PYTHONPATH": str(REPO)},
        },
    }
    for name, spec in specs.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "kernel.json").write_text(json.dumps(spec))


def execute_reference(
    notebook: dict[str, Any], *, allow_errors: bool = False, timeout: float = 120
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Execute `notebook` (its outputs cleared first) with nbclient in a fresh folder; the
    executed notebook (as JSON) and the files the run left in that folder."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.reads(json.dumps(notebook), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    with tempfile.TemporaryDirectory(prefix="nbref-") as tmp:
        root = Path(tmp)
        _kernel_specs(root / "kernels")
        (root / "work").mkdir()
        kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
        manager = AsyncKernelManager(
            kernel_name=kernel,
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(root / "kernels")]),
            transport="ipc",
            ip=str(root / "k"),
        )
        client = NotebookClient(
            nb,
            km=manager,
            timeout=timeout,
            allow_errors=allow_errors,
            resources={"metadata": {"path": str(root / "work")}},
        )
        try:
            client.execute()
        except CellExecutionError:
            pass  # nbclient stops at the error, as the replay does; the notebook holds it all
        finally:  # nbclient leaves a kernel manager it was given running
            if client.kc is not None:
                client.kc.stop_channels()
            if manager.has_kernel:
                run_sync(manager.shutdown_kernel)(now=True)
            with warnings.catch_warnings():  # its zmq sockets end here, not in a later test
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()
        files = {p.name: p.read_bytes() for p in (root / "work").iterdir() if p.is_file()}
    executed: dict[str, Any] = json.loads(nbformat.writes(nb))
    return executed, files


# --- normalising -----------------------------------------------------------------------------


def text_of(value: Any) -> str:
    text = "".join(value) if isinstance(value, list) else str(value)
    text = _TIMESTAMP.sub("<TIME>", _ADDRESS.sub("0xADDR", strip_colors(text)))
    text = _TIMEIT_CACHED.sub("", text)
    text = _TIMEIT.sub(r"<T> ± <T> per loop (mean ± std. dev. of \1, <N> \2 each)", text)
    text = _TIME.sub("CPU times: user <T>, sys: <T>, total: <T>", text)
    text = _WALL.sub("Wall time: <T>", text)
    return _CELL_FILE.sub("<kernel-tmp>/ipykernel_<pid>/", text)


def _output(output: dict[str, Any]) -> dict[str, Any]:
    kind = output["output_type"]
    if kind == "error":
        return {"output_type": kind, "ename": output["ename"], "evalue": output["evalue"]}
    data = {
        mime: ("<image>" if mime in IMAGES else text_of(value))
        for mime, value in output.get("data", {}).items()
    }
    return {"output_type": kind, "data": data}


def cells_of(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    """Each cell as what it shows: source, execution count, streams, other outputs."""
    cells = []
    for cell in notebook["cells"]:
        shown: dict[str, Any] = {"cell_type": cell["cell_type"], "source": text_of(cell["source"])}
        if cell["cell_type"] == "code":
            streams: dict[str, str] = {}
            rich = []
            for output in cell["outputs"]:
                if output["output_type"] == "stream":
                    streams[output["name"]] = streams.get(output["name"], "") + text_of(
                        output["text"]
                    )
                else:
                    rich.append(output)
            shown.update(execution_count=cell["execution_count"], streams=streams, outputs=rich)
        cells.append(shown)
    return cells


# --- images -------------------------------------------------------------------------------------


def decode_image(mime: str, value: Any) -> Any:
    """A PIL image of a base64 PNG/JPEG output value."""
    from PIL import Image

    data = base64.b64decode("".join(value) if isinstance(value, list) else value)
    image = Image.open(io.BytesIO(data))
    image.load()
    assert image.format == {"image/png": "PNG", "image/jpeg": "JPEG"}[mime], image.format
    return image


def ink(image: Any) -> Any:
    """The pixels that differ from the background (the corner pixel's colour), as a mask."""
    from PIL import ImageChops

    rgb = image.convert("RGB")
    background = rgb.getpixel((0, 0))
    from PIL import Image

    difference = ImageChops.difference(rgb, Image.new("RGB", rgb.size, background))
    return difference.convert("L").point(lambda v: 255 if v > 24 else 0)


def ink_fraction(image: Any) -> float:
    mask = ink(image)
    return float(mask.histogram()[255]) / (mask.size[0] * mask.size[1])


def assert_drawn(image: Any, what: str = "image") -> None:
    """Not a blank canvas: some marks, in more than one colour."""
    colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 2, f"{what} has {len(colours or [])} colours"
    assert ink_fraction(image) > 0.005, f"{what} is blank ({ink_fraction(image):.4f} inked)"


def assert_same_image(got: Any, want: Any, what: str = "image") -> None:
    """Same size, drawn, and mostly the same marks where the reference has them."""
    from PIL import ImageChops

    assert got.size == want.size, f"{what}: {got.size} != reference {want.size}"
    assert_drawn(got, what)
    both = ImageChops.multiply(ink(got), ink(want)).histogram()[255]
    either = ImageChops.lighter(ink(got), ink(want)).histogram()[255]
    overlap = both / max(1, either)
    assert overlap > 0.8, f"{what}: only {overlap:.2f} of the marks agree with the reference"


# --- comparing --------------------------------------------------------------------------------


def assert_same_execution(
    got: dict[str, Any],
    want: dict[str, Any],
    *,
    extra: Callable[[dict[str, Any]], bool] = lambda output: False,
) -> None:
    """`got` shows what the reference execution `want` shows, cell by cell. Outputs for which
    `extra(output)` holds are additions of the executor under test, left out here."""
    differences = cell_differences(got, want, extra=extra)
    assert not differences, "\n".join(differences)


def cell_differences(
    got: dict[str, Any],
    want: dict[str, Any],
    *,
    extra: Callable[[dict[str, Any]], bool] = lambda output: False,
) -> list[str]:
    """One line for each cell of `got` that does not show what the reference execution
    `want` shows (`cell <index>: <what differs>`), none when they agree. Outputs for which
    `extra(output)` holds are additions of the executor under test, left out here."""
    got_cells, want_cells = cells_of(got), cells_of(want)
    if len(got_cells) != len(want_cells):
        return [f"{len(got_cells)} cells, the reference has {len(want_cells)}"]
    found = []
    for index, (mine, theirs) in enumerate(zip(got_cells, want_cells, strict=True)):
        difference = _cell_difference(mine, theirs, extra)
        if difference is not None:
            found.append(f"cell {index}: {difference}")
    return found


def _cell_difference(
    mine: dict[str, Any], theirs: dict[str, Any], extra: Callable[[dict[str, Any]], bool]
) -> str | None:
    mine_outputs = [o for o in mine.pop("outputs", []) if not extra(o)]
    theirs_outputs = theirs.pop("outputs", [])
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            return f"{key} {_clip(mine.get(key))} != reference {_clip(theirs.get(key))}"
    shown_mine = [_output(o) for o in mine_outputs]
    shown_theirs = [_output(o) for o in theirs_outputs]
    for number, (a, b) in enumerate(zip_longest(shown_mine, shown_theirs)):
        if a != b:
            return (
                f"output {number} {_clip(a)} != reference {_clip(b)} "
                f"({len(shown_mine)} outputs, the reference {len(shown_theirs)})"
            )
    for number, (out_got, out_want) in enumerate(zip(mine_outputs, theirs_outputs, strict=True)):
        for mime in IMAGES:
            if mime in out_want.get("data", {}):
                try:
                    assert_same_image(
                        decode_image(mime, out_got["data"][mime]),
                        decode_image(mime, out_want["data"][mime]),
                        f"output {number}, {mime}",
                    )
                except AssertionError as exc:
                    return str(exc)
    return None


def _clip(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
