"""Byte budgets: what the gateway holds in memory on someone's behalf (request bodies being
received, answers being sent, kernel messages being read), counted against a total and a
per-key share (a key is a user, or a kernel), so that no client, kernel or tenant can take
the process's memory however many connections or runs it opens.

- `try_take(n, key)` takes room at once or refuses (a request body: the caller answers 503).
- `take(n, key, timeout)` waits for room, first come first served (an answer being sent, a
  kernel message being read: the other side is slowed down, not refused).

Every taking is a `Hold`, given back exactly once by `release()` (idempotent) or by leaving
its `with` block. A single taking larger than the whole budget (or the key's share) is let
through only when nothing else of that scope is held, so a caller that bounds its own items
(a body by `max_body_bytes`, a message by the kernel message bound) always progresses, and
the total stays within the budget plus one such item.

A `Quota` is the other kind of budget: what one user may keep (records, uploads), counted
in items and bytes; a `CpuBudget` what one user may spend: CPU-seconds per rolling hour and
day, and runs started per rolling minute (`gateway.runs.quotas` holds users to it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Hashable


@dataclasses.dataclass
class _Waiter:
    nbytes: int
    key: Hashable
    future: asyncio.Future[None]


class ByteBudget:
    """At most `total` bytes held at once, and at most `per_key` by any one key (None: no
    share). `name` says what the bytes are, in logs and metrics."""

    def __init__(self, name: str, total: int, per_key: int | None = None) -> None:
        self.name = name
        self.total = total
        self.per_key = per_key
        self.used = 0
        self.peak = 0
        self.refused = 0  # try_take calls that found no room
        self._by_key: collections.Counter[Hashable] = collections.Counter()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        # a waiter is short of total room: nobody may take past it (its own share's
        # shortage holds back only its own key)
        self._starved = False

    def held_by(self, key: Hashable) -> int:
        return self._by_key.get(key, 0)

    def fits(self, nbytes: int, key: Hashable = None) -> bool:
        """Whether `nbytes` more for `key` stay within the total and the key's share."""
        total_ok = self.used == 0 or self.used + nbytes <= self.total
        held = self._by_key.get(key, 0)
        share_ok = self.per_key is None or held == 0 or held + nbytes <= self.per_key
        return total_ok and share_ok

    def try_take(self, nbytes: int, key: Hashable = None) -> Hold | None:
        """A hold of `nbytes` for `key`, or None when there is no room now."""
        if self._starved or not self.fits(nbytes, key):
            self.refused += 1
            return None
        return self._grant(nbytes, key)

    async def take(self, nbytes: int, key: Hashable = None, timeout: float | None = None) -> Hold:
        """A hold of `nbytes` for `key`, once there is room (in the order asked); raises
        TimeoutError after `timeout` seconds without room."""
        waiter = _Waiter(nbytes, key, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._wake()
        if waiter.future.done():
            return Hold(self, nbytes, key)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout)
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._give(nbytes, key)  # granted just as we gave up: hand it on
            else:
                waiter.future.cancel()
                self._discard(waiter)
            raise
        return Hold(self, nbytes, key)

    def _grant(self, nbytes: int, key: Hashable) -> Hold:
        self._add(nbytes, key)
        return Hold(self, nbytes, key)

    def _add(self, nbytes: int, key: Hashable) -> None:
        self.used += nbytes
        self._by_key[key] += nbytes
        self.peak = max(self.peak, self.used)

    def _give(self, nbytes: int, key: Hashable) -> None:
        self.used -= nbytes
        left = self._by_key[key] - nbytes
        if left > 0:
            self._by_key[key] = left
        else:
            del self._by_key[key]
        self._wake()

    def _discard(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        self._wake()

    def _wake(self) -> None:
        """Grant waiters in order while they fit; one whose own share is full does not hold
        back those of other keys behind it, one short of total room does."""
        blocked_keys: set[Hashable] = set()
        self._starved = False
        for waiter in list(self._waiters):
            if waiter.future.done():
                self._waiters.remove(waiter)
                continue
            if waiter.key in blocked_keys:
                continue
            total_ok = self.used == 0 or self.used + waiter.nbytes <= self.total
            if not total_ok:
                self._starved = True
                break
            if not self.fits(waiter.nbytes, waiter.key):
                blocked_keys.add(waiter.key)
                continue
            self._waiters.remove(waiter)
            self._add(waiter.nbytes, waiter.key)
            waiter.future.set_result(None)


class Hold:
    """Bytes taken from a budget; `release()` gives them back (once, however often it is
    called). `grow(n)` takes `n` more at once if there is room, `shrink_to(n)` gives back
    what is held past `n`."""

    def __init__(self, budget: ByteBudget, nbytes: int, key: Hashable) -> None:
        self.budget = budget
        self.nbytes = nbytes
        self.key = key
        self.released = False

    def grow(self, nbytes: int) -> bool:
        """Take `nbytes` more for the same key now; False (nothing taken) without room. As
        for a first taking, a hold that is all its key holds may grow past the key's share,
        and one that is all the budget holds past the total."""
        if self.released:
            raise RuntimeError("a released hold cannot grow")
        budget = self.budget
        room = budget.used == self.nbytes or budget.used + nbytes <= budget.total
        held = budget.held_by(self.key)
        share = budget.per_key is None or held == self.nbytes or held + nbytes <= budget.per_key
        if budget._starved or not (room and share):
            budget.refused += 1
            return False
        budget._add(nbytes, self.key)
        self.nbytes += nbytes
        return True

    def shrink_to(self, nbytes: int) -> None:
        """Give back what is held past `nbytes` (what the holder no longer needs)."""
        if not self.released and nbytes < self.nbytes:
            self.budget._give(self.nbytes - nbytes, self.key)
            self.nbytes = nbytes

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.budget._give(self.nbytes, self.key)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@dataclasses.dataclass(frozen=True)
class Quota:
    """What one user may keep: at most `count` items of at most `bytes` in all."""

    count: int
    bytes: int

    def allows(self, count: int, nbytes: int) -> bool:
        """Whether `count` items of `nbytes` in all are within the quota."""
        return count <= self.count and nbytes <= self.bytes


@dataclasses.dataclass(frozen=True)
class CpuBudget:
    """What one user may spend (None: no limit): CPU-seconds of their runs in any rolling
    hour and day, runs started in any rolling minute."""

    cpu_seconds_per_hour: float | None = None
    cpu_seconds_per_day: float | None = None
    runs_per_minute: int | None = None

    @property
    def limited(self) -> bool:
        return any(
            v is not None
            for v in (self.cpu_seconds_per_hour, self.cpu_seconds_per_day, self.runs_per_minute)
        )
