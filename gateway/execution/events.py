"""What a run tells those who watch it, as it happens: a cell starts, a cell's output arrives
(or replaces an earlier one), a cell finishes.

The executor publishes them on the run's `RunEvents`; front ends (the WebSocket) subscribe
to it when they submit the run, before it starts. A subscriber is called on the event loop,
in order, and must not block: it queues what it sends (a slow client is the subscriber's
problem, bounded there). Nothing a subscriber does reaches back into the run: an exception
it raises is logged and the run goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Literal

log = logging.getLogger(__name__)

CellStatus = Literal["ok", "error", "timeout", "cancelled", "died", "output_limit", "exited"]


@dataclasses.dataclass(frozen=True)
class CellStarted:
    index: int  # the cell's place in the notebook (0 for a single run's code)
    cell_id: str | None


@dataclasses.dataclass(frozen=True)
class CellOutput:
    """An nbformat output of the cell `index`, as it arrived; `replaces` when it takes the
    place of an earlier output (a display update, or a clear)."""

    index: int
    output: dict[str, Any]
    display_id: str | None
    replaces: bool


@dataclasses.dataclass(frozen=True)
class CellFinished:
    index: int
    cell_id: str | None
    execution_count: int
    status: CellStatus
    duration_ms: int
    cpu_ms: int | None = None  # the cell's own CPU (None: its sandbox cannot tell)


RunEvent = CellStarted | CellOutput | CellFinished
Subscriber = Callable[[RunEvent], None]


class RunEvents:
    """The events of one run, told to each subscriber in the order they happen."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Hear this run's events from now on; returns the call that stops it."""
        self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    def publish(self, event: RunEvent) -> None:
        for subscriber in list(self._subscribers):
            try:
                subscriber(event)
            except Exception:
                log.exception("a run's subscriber failed on %s", type(event).__name__)
