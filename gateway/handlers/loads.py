"""Answers loaded from the store before their size is known (a run record, a notebook
export): a user's loads take turns, and the size of what each path answered last is
remembered, so that a request that will find no room in the answers budget waits for it
before it loads anything, not after.

Forty requests for one large record then cost one load at a time on the event loop and one
copy in memory, instead of forty of each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Hashable


class Turns:
    """One at a time per key (a user); another key never waits. A key's lock exists only
    while it is held or waited for."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._waiting: collections.Counter[Hashable] = collections.Counter()

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """`key`'s turn: inside the block nobody else of `key` is."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting[key] += 1
        try:
            async with lock:
                yield
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
                del self._locks[key]


class RecentSizes:
    """The size each of the last `capacity` keys (user, path) answered, about."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._sizes: collections.OrderedDict[Hashable, int] = collections.OrderedDict()

    def get(self, key: Hashable) -> int | None:
        return self._sizes.get(key)

    def put(self, key: Hashable, size: int) -> None:
        self._sizes[key] = size
        self._sizes.move_to_end(key)
        while len(self._sizes) > self.capacity:
            self._sizes.popitem(last=False)
