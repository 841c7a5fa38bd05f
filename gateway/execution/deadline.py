"""`Deadline`: a program's time, whole and per cell, in one place (DESIGN.md decision 4).

A program may run for `timeout` seconds in all, and each of its cells for `cell_timeout`
(a single run's one cell: the same). The executor asks it, before each cell, whether any
time is left and until when the cell may run (`next_cell`); the session runs the cell
until then (at that instant: interrupt, a grace to flush, kill), and the result builder
says in its notes which of the two bounds stopped it (`CellTime.by_cell`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class CellTime:
    """One cell's time: it may run until `until` (a `time.monotonic()` instant), which is
    `cell_timeout` after its start when `by_cell`, else the program's own end."""

    until: float
    by_cell: bool

    @property
    def seconds(self) -> float:
        return max(0.0, self.until - time.monotonic())


class Deadline:
    """The program's deadline, counted from when it is made."""

    def __init__(
        self,
        timeout: float,
        cell_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self.cell_timeout = cell_timeout
        self._clock = clock
        self.end = clock() + timeout

    def left(self) -> float:
        return self.end - self._clock()

    @property
    def passed(self) -> bool:
        return self.left() <= 0

    def next_cell(self) -> CellTime:
        """The time of a cell that starts now."""
        now = self._clock()
        if now + self.cell_timeout <= self.end:
            return CellTime(until=now + self.cell_timeout, by_cell=True)
        return CellTime(until=self.end, by_cell=False)
