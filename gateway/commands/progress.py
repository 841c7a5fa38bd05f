"""How `gateway run` shows a notebook replay as it goes: a progress line per cell,
`[12/40] cell 12 · 0.8 s`, and the first error's traceback as soon as it comes.

On a terminal the line is redrawn in place by tqdm (the client extra, `pip install
'kernel-gateway[client]'`): tqdm has no dependencies of its own and writes exactly the text
it is given (nothing in a run's output is read as markup), and `tqdm.write` prints above
the line without breaking it. When stdout is not a terminal, or tqdm is not installed,
each finished cell is one plain line. Everything shown of the run went through the
command's `show` (terminal-safe unless `--raw`).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any, TextIO

from gateway.models.stream import CellFinishedEvent, CellStartedEvent

Show = Callable[[str], str]


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the client extra is not installed: plain lines
        return None
    return tqdm


class CellProgress:
    """Plain lines: one per finished cell, on stdout."""

    def __init__(self, total: int, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    @staticmethod
    def line(done: int, total: int, event: CellFinishedEvent) -> str:
        text = f"[{done}/{total}] cell {event.index + 1} · {event.duration_ms / 1000:.1f} s"
        return text if event.status == "ok" else f"{text} · {event.status}"

    def started(self, event: CellStartedEvent) -> None:
        """A cell started (plain lines say nothing until it finishes)."""

    def finished(self, event: CellFinishedEvent) -> None:
        self.done += 1
        self.write(self.line(self.done, self.total, event), self.out)

    def write(self, text: str, file: TextIO) -> None:
        """Print whole lines (an error's traceback, a note) without breaking the display."""
        file.write(text if text.endswith("\n") else text + "\n")
        file.flush()

    def close(self) -> None:
        """The replay ended: leave the display as it is."""


class TerminalProgress(CellProgress):
    """One line redrawn in place by tqdm, on a terminal."""

    def __init__(self, total: int, tqdm: Any, out: TextIO | None = None) -> None:
        super().__init__(total, out)
        self._tqdm = tqdm
        # a terminal that says it has no columns (a pty nobody sized) gets $COLUMNS or 80
        sized = _columns(self.out) > 0
        self._bar = tqdm(
            total=total,
            file=self.out,
            bar_format="[{n_fmt}/{total_fmt}] {desc}",
            desc="starting",
            dynamic_ncols=sized,
            ncols=None if sized else shutil.get_terminal_size().columns,
            leave=True,
        )

    def started(self, event: CellStartedEvent) -> None:
        self._bar.set_description_str(f"cell {event.index + 1} · running", refresh=True)

    def finished(self, event: CellFinishedEvent) -> None:
        self.done += 1
        description = self.line(self.done, self.total, event).split("] ", 1)[1]
        self._bar.set_description_str(description, refresh=False)
        self._bar.update(1)

    def write(self, text: str, file: TextIO) -> None:
        self._tqdm.write(text.rstrip("\n"), file=file)

    def close(self) -> None:
        self._bar.close()


def _columns(file: TextIO) -> int:
    try:
        return os.get_terminal_size(file.fileno()).columns
    except (OSError, ValueError):
        return 0


def cell_progress(total: int) -> CellProgress:
    """The display for this stdout: tqdm's line on a terminal (when installed), else plain
    lines."""
    tqdm = _tqdm() if sys.stdout.isatty() else None
    return CellProgress(total) if tqdm is None else TerminalProgress(total, tqdm)
