"""`RunSlots`: this gateway's run slots (`max_concurrent_runs`), shared fairly between users.

Two rules, so that one user's runs never keep another user's run waiting for long:

- **a share per user**: a user holds at most `per_user` slots at once
  (`RunServiceConfig.slots_per_user`: `max_running_per_user`; by default, with a tokens
  file, one fewer than the slots: one is always left for somebody else, who then never
  waits for another user's runs to end; single-user, every slot), however many runs they
  have queued;
- **fair order**: when a slot is free, it goes to the waiting run of the user who holds
  the fewest slots now, the earliest of theirs first; between users holding as many, the
  run that has waited longest.

A run waits in `acquire` until it holds a slot (True) or its `cancel` is set first
(False, and it holds none); it gives its slot back with `release` exactly once. A slot is
handed to a waiter when it is granted, not when the waiter wakes up, so no one can take
it in between; a waiter cancelled after its grant gives it straight back.

Runs that wait in the store's queue instead (background runs, on a shared store:
`gateway/runs/claims.py`) come in through free slots only, after every waiter here: a run
admitted here takes a free slot at once (`take`); the claims loop `reserve`s a free slot
(no waiter may then be granted it), asks the store for a run, then `assign`s the slot to
that run's user or gives it back (`unreserve`). `on_free` is called whenever a slot is
left free after the waiters here had theirs.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
from collections.abc import Callable, Mapping


@dataclasses.dataclass
class _Waiter:
    user: str
    order: int  # arrival: earlier waits first among equals
    granted: asyncio.Future[object]


class RunSlots:
    """`total` run slots, at most `per_user` of them held by one user."""

    def __init__(self, total: int, per_user: int) -> None:
        self.total = total
        self.per_user = max(1, min(per_user, total))
        self._held: collections.Counter[str] = collections.Counter()
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._reserved = 0  # free slots promised to a claim of the store's queue
        self.on_free: Callable[[], None] | None = None

    @property
    def running(self) -> int:
        """Slots held now."""
        return self._held.total()

    @property
    def waiting(self) -> int:
        """Runs waiting for a slot."""
        return len(self._waiting)

    def held_by(self, user: str) -> int:
        return self._held[user]

    @property
    def held(self) -> Mapping[str, int]:
        """Slots held now, by user (a copy)."""
        return dict(self._held)

    @property
    def free(self) -> int:
        """Slots neither held nor reserved."""
        return self.total - self.running - self._reserved

    def take(self, user: str) -> bool:
        """A free slot for `user` now, if one is free and they are below their share (no
        waiter here could have it: `_grant` already gave free slots to those eligible)."""
        if self.free <= 0 or self._held[user] >= self.per_user:
            return False
        self._held[user] += 1
        return True

    def reserve(self) -> bool:
        """Promise a free slot to a claim of the store's queue; False when none is free."""
        if self.free <= 0:
            return False
        self._reserved += 1
        return True

    def assign(self, user: str) -> None:
        """The reserved slot is `user`'s now (the claimed run's)."""
        self._unreserve()
        self._held[user] += 1

    def unreserve(self) -> None:
        """The claim found nothing: the reserved slot is free again."""
        self._unreserve()
        self._grant(claims=False)  # not the claims loop again: it just found nothing

    def _unreserve(self) -> None:
        if self._reserved <= 0:
            raise RuntimeError("no run slot is reserved")
        self._reserved -= 1

    async def acquire(self, user: str, cancel: asyncio.Event) -> bool:
        """Wait for a slot for `user`: True once held, False (none held) on cancel."""
        if cancel.is_set():
            return False
        waiter = _Waiter(user, next(self._arrivals), asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()
        if waiter.granted.done():  # a slot was free
            return True
        cancelled: asyncio.Future[object] = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait([waiter.granted, cancelled], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the waiting task itself was cancelled
            self._forget(waiter)
            raise
        finally:
            cancelled.cancel()  # nothing awaited after the grant: no await may lose a slot
        if cancel.is_set():
            self._forget(waiter)
            return False
        return True

    def _forget(self, waiter: _Waiter) -> None:
        """A waiter that will not run: out of the queue, or its slot given back."""
        if waiter.granted.done():
            self.release(waiter.user)
        else:
            self._waiting.remove(waiter)
            waiter.granted.cancel()

    def release(self, user: str) -> None:
        """Give back a slot `user` held, and hand it on."""
        if self._held[user] <= 0:
            raise RuntimeError(f"user {user!r} holds no run slot")
        self._held[user] -= 1
        if not self._held[user]:
            del self._held[user]
        self._grant()

    def _grant(self, claims: bool = True) -> None:
        """Hand free slots to waiters: the user holding fewest first, then arrival; a slot
        still free after them is the store queue's (`on_free`, unless not `claims`)."""
        while self.free > 0:
            eligible = [w for w in self._waiting if self._held[w.user] < self.per_user]
            if not eligible:
                if claims and self.on_free is not None:
                    self.on_free()
                return
            chosen = min(eligible, key=lambda w: (self._held[w.user], w.order))
            self._waiting.remove(chosen)
            self._held[chosen.user] += 1
            chosen.granted.set_result(None)
