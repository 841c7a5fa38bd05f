"""What each user spends, and what they may (issue 34): CPU-seconds per rolling hour and
day, runs started per rolling minute (`CpuBudget`: the tokens file's per user, else the
operator's default), held fleet-wide through the store's usage ledger.

    admit(user)           before a run is admitted: 429 `quota` with Retry-After while
                          a CPU window is spent
    count_start(user)     once every other check passed: 429 `quota` when
                          `runs_per_minute` started in the last minute (`uncount_start`
                          when the store refuses the run after all)
    CpuMeter.tick(spent)  while it runs, every `TICK` seconds when its user has a CPU
                          budget: its CPU since the last tick goes to the ledger, which
                          answers the user's windows with it added (atomically, on any
                          replica); a window spent stops the run (`kill_reason: cpu_quota`)
    CpuMeter.close(...)   at its end: the rest of its CPU, the run itself and its peak
                          memory, which the store adds with the final record (`finish`),
                          so that the ledger holds what the records say
    charge(user, cpu_ms)  what the user's snapshots spent while kept (`runs.snapshots`):
                          the ledger's only CPU that no record holds

The bound (DESIGN.md decision 26): a run is admitted only while every window has CPU left,
and a run stops within one tick of its user's window being spent, so what a user spends is
at most the budget plus what the runs admitted could spend in one tick each (a sandbox's
CPUs times `TICK`), plus the CPU a run spends between its last tick and its end. Metering
without a budget costs no trip to the store of its own: the final record's carries it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from gateway.budget import CpuBudget
from gateway.errors import QuotaExceeded
from gateway.store.base import RecordStore, UsageRow

HOUR = 60  # minutes
DAY = 24 * 60
TICK = 0.25  # seconds between a metered run's reports to the ledger
STOP_GRACE = 1.0  # seconds a stopped run has to end before its sandbox is killed
FAILED_TICKS = 40  # reports in a row the ledger did not take (10 s): the run is stopped

T = TypeVar("T")


def minute_of(now: float) -> int:
    return int(now // 60)


def retry_after(rows: Sequence[UsageRow], now: float, window: int, budget_ms: int) -> int:
    """Whole seconds from `now` until the user's CPU in the rolling `window` (minutes) is
    under `budget_ms` again, as its oldest minutes leave it (at least 1)."""
    minute = minute_of(now)
    inside = sorted(
        (r for r in rows if minute - window < r.minute <= minute), key=lambda r: r.minute
    )
    over = sum(r.cpu_ms for r in inside) - budget_ms
    for row in inside:
        over -= row.cpu_ms
        if over < 0:
            return max(1, math.ceil((row.minute + window) * 60 - now))
    return 1


class Quotas:
    """The users' budgets and the ledger that holds them (the store's)."""

    def __init__(
        self,
        store: RecordStore,
        default: CpuBudget,
        per_user: Mapping[str, CpuBudget] | None = None,
        on_spent: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.store = store
        self.default = default
        self.per_user = dict(per_user or {})
        self.on_spent = on_spent  # (user, cpu_ms, runs): Prometheus' counters
        self._refused_until: dict[str, float] = {}  # users whose CPU is spent, until when
        self._starts_refused_until: dict[str, float] = {}  # ... whose runs per minute are

    def budget(self, user: str) -> CpuBudget:
        """The user's budget: what the tokens file says for them, field by field, else the
        operator's default."""
        own, default = self.per_user.get(user), self.default
        if own is None:
            return default
        return CpuBudget(
            cpu_seconds_per_hour=_first(own.cpu_seconds_per_hour, default.cpu_seconds_per_hour),
            cpu_seconds_per_day=_first(own.cpu_seconds_per_day, default.cpu_seconds_per_day),
            runs_per_minute=_first(own.runs_per_minute, default.runs_per_minute),
        )

    async def admit(self, user: str) -> None:
        """Before a run is admitted: 429 `quota` while a CPU window of the user's is spent,
        with the longest wait of those spent. A refusal is remembered until then (time only
        frees a window; more use only makes the wait longer), so that a user's flood of
        refused requests reads nothing from the store."""
        now = time.time()
        until = self._refused_until.get(user)
        if until is not None and now < until:
            raise _spent(self.budget(user), math.ceil(until - now))
        limits = _cpu_limits(self.budget(user))
        if not limits:
            return
        minute = minute_of(now)
        totals = await self.store.spent(user, minute, tuple(w for w, _, _ in limits))
        spent = [
            (window, limit_ms)
            for (window, limit_ms, _), total in zip(limits, totals, strict=True)
            if total >= limit_ms
        ]
        if spent:  # only now the rows, to tell when enough of them leave the windows
            rows = await self.store.usage(user, minute - DAY + 1)
            waits = [retry_after(rows, now, window, limit_ms) for window, limit_ms in spent]
            self._refused_until[user] = now + max(waits)
            raise _spent(self.budget(user), max(waits))

    async def count_start(self, user: str) -> float | None:
        """Count a run's start against `runs_per_minute` (429 `quota` past it): the time it
        was counted at, to `uncount_start` it if the run is not admitted after all. A refusal
        is remembered until the oldest start leaves the minute, as `admit`'s are."""
        per_minute = self.budget(user).runs_per_minute
        if per_minute is None:
            return None
        now = time.time()
        until = self._starts_refused_until.get(user)
        if until is None or now >= until:
            wait = await self.store.count_start(user, now, per_minute)
            if wait is None:
                return now
            until = self._starts_refused_until[user] = now + wait
        raise QuotaExceeded(
            f"You started {per_minute} runs in the last minute, as many as you may.",
            retry_after=max(1, math.ceil(until - now)),
        )

    async def uncount_start(self, user: str, counted: float | None) -> None:
        if counted is not None:
            await self.store.uncount_start(user, counted)

    def meter(self, user: str) -> CpuMeter:
        return CpuMeter(self, user)

    async def charge(self, user: str, cpu_ms: int) -> None:
        """CPU the user spent outside a run (their snapshots, idle: `runs.snapshots`)."""
        await self.store.spend(user, minute_of(time.time()), cpu_ms, ())
        if self.on_spent is not None:
            self.on_spent(user, cpu_ms, 0)


class CpuMeter:
    """One run's spending, reported to the ledger as it goes and at its end."""

    def __init__(self, quotas: Quotas, user: str) -> None:
        self.quotas = quotas
        self.user = user
        self.reported = 0  # CPU milliseconds already in the ledger
        self.limits = _cpu_limits(quotas.budget(user))

    @property
    def watching(self) -> bool:
        """Whether the run reports as it goes (its user has a CPU budget)."""
        return bool(self.limits)

    async def tick(self, spent_ms: int) -> str | None:
        """The run has spent `spent_ms` so far: report what is new; the window (`hour`,
        `day`) its user has spent, if any."""
        delta = spent_ms - self.reported
        if delta <= 0:
            return None
        totals = await self.quotas.store.spend(
            self.user, minute_of(time.time()), delta, tuple(w for w, _, _ in self.limits)
        )
        self.reported = spent_ms
        for (_, limit_ms, label), total in zip(self.limits, totals, strict=True):
            if total >= limit_ms:
                return label
        return None

    def close(self, spent_ms: int | None, peak_memory_bytes: int | None) -> UsageRow:
        """The run ended: what the ledger still lacks of it (the rest of its CPU, the run,
        its peak memory), for the store to add with its final record (`finish`), then
        `counted`."""
        rest = max(0, (spent_ms or 0) - self.reported)
        self.reported += rest
        return UsageRow(self.user, minute_of(time.time()), rest, 1, peak_memory_bytes or 0)

    def counted(self) -> None:
        """The ledger has the whole run: Prometheus' counters too."""
        if self.quotas.on_spent is not None:
            self.quotas.on_spent(self.user, self.reported, 1)


def _cpu_limits(budget: CpuBudget) -> list[tuple[int, int, str]]:
    """(window in minutes, milliseconds, its name) of each CPU budget set."""
    found = []
    if budget.cpu_seconds_per_hour is not None:
        found.append((HOUR, math.ceil(budget.cpu_seconds_per_hour * 1000), "hour"))
    if budget.cpu_seconds_per_day is not None:
        found.append((DAY, math.ceil(budget.cpu_seconds_per_day * 1000), "day"))
    return found


def _first(own: T | None, default: T | None) -> T | None:
    return default if own is None else own


def _spent(budget: CpuBudget, wait: int) -> QuotaExceeded:
    windows = [
        f"{seconds:g} CPU-seconds of a rolling {name}"
        for seconds, name in (
            (budget.cpu_seconds_per_hour, "hour"),
            (budget.cpu_seconds_per_day, "day"),
        )
        if seconds is not None
    ]
    return QuotaExceeded(
        f"Your runs spent their budget ({' or '.join(windows)}); GET /v1/usage says what they "
        f"spent. Try again in {wait} s.",
        retry_after=wait,
    )
