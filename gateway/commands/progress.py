"""How `gateway run` shows a notebook replay as it goes: a progress line per cell,
`[12/40] In [12] · 812 ms`, and the first error's traceback as soon as it comes.

A code cell is named as Jupyter names it, by its execution count (`In [12]`; `In [*]` while
it runs), and a duration is in milliseconds under a second and in seconds, to a tenth, from
one on (`42 ms`, `1.3 s`): the page says both the same way.

On a terminal the line is redrawn in place by tqdm (the client extra, `pip install
'kernel-gateway[client]'`): tqdm has no dependencies of its own and writes exactly the text
it is given (nothing in a run's output is read as markup), and `tqdm.write` prints above
the line without breaking it. When stdout is not a terminal, or is one that reports a size
of 0x0 (a pseudo-terminal nobody sized: `script`, `docker exec -t`, some CI runners; tqdm
draws nothing there), or tqdm is not installed, each finished cell is one plain line.
Everything shown of the run went through the command's `show` (terminal-safe unless
`--raw`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from gateway.models.record import Usage
from gateway.models.stream import CellFinishedEvent, CellStartedEvent


def duration(ms: int) -> str:
    """`42 ms` under a second, `1.3 s` from one on: every duration `gateway run` and the MCP
    server write (the page writes them the same way, issue 33)."""
    if ms < 1000:
        return f"{ms} ms"
    return f"{ms / 1000:.1f} s"


def spent(usage: Usage) -> str:
    """What a run used, for a summary line: `CPU 812 ms, peak memory 85 MiB` (what the
    sandbox could not tell is left out)."""
    parts = []
    if usage.cpu_ms is not None:
        parts.append(f"CPU {duration(usage.cpu_ms)}")
    if usage.peak_memory_bytes is not None:
        parts.append(f"peak memory {usage.peak_memory_bytes / 2**20:.0f} MiB")
    return ", ".join(parts)


def cell_name(execution_count: int | None) -> str:
    """A code cell as Jupyter names it: `In [3]`, or `In [*]` before it has a count."""
    return f"In [{'*' if execution_count is None else execution_count}]"


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
        text = (
            f"[{done}/{total}] {cell_name(event.execution_count)} · {duration(event.duration_ms)}"
        )
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
    """One line redrawn in place by tqdm, on a terminal that reports its size."""

    def __init__(self, total: int, tqdm: Any, out: TextIO | None = None) -> None:
        super().__init__(total, out)
        self._tqdm = tqdm
        self._bar = tqdm(
            total=total,
            file=self.out,
            bar_format="[{n_fmt}/{total_fmt}] {desc}",
            desc="starting",
            dynamic_ncols=True,
            leave=True,
        )

    def started(self, event: CellStartedEvent) -> None:
        self._bar.set_description_str(f"{cell_name(None)} · running", refresh=True)

    def finished(self, event: CellFinishedEvent) -> None:
        self.done += 1
        description = self.line(self.done, self.total, event).split("] ", 1)[1]
        self._bar.set_description_str(description, refresh=False)
        self._bar.update(1)

    def write(self, text: str, file: TextIO) -> None:
        self._tqdm.write(text.rstrip("\n"), file=file)

    def close(self) -> None:
        self._bar.close()


def sized_terminal(file: TextIO) -> bool:
    """Whether `file` is a terminal that says how large it is (neither side 0)."""
    try:
        if not file.isatty():
            return False
        size = os.get_terminal_size(file.fileno())
    except (OSError, ValueError):
        return False
    return size.columns > 0 and size.lines > 0


def cell_progress(total: int, out: TextIO | None = None) -> CellProgress:
    """The display for `out` (stdout): tqdm's line on a terminal that reports its size (when
    tqdm is installed), else plain lines."""
    out = out or sys.stdout
    tqdm = _tqdm() if sized_terminal(out) else None
    return CellProgress(total, out) if tqdm is None else TerminalProgress(total, tqdm, out)
