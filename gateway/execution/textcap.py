"""The one head/tail buffer: keeps the head and the tail of a stream within a byte budget.

`HeadTail` holds pieces of any kind that know their size in bytes; `HeadTailText` holds
text (a run's stdout, stderr, output), the collector holds a cell's outputs with it (stream
text counts against the budget, rich outputs ride along where they arrived).
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

T = TypeVar("T")


def utf8_size(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def utf8_head(text: str, nbytes: int) -> str:
    """The longest start of `text` within `nbytes` bytes of UTF-8."""
    return text.encode("utf-8", "surrogatepass")[:nbytes].decode("utf-8", "ignore")


def utf8_drop_front(text: str, nbytes: int) -> str:
    """`text` without its first `nbytes` bytes of UTF-8 (and the rest of a character they
    cut into)."""
    return text.encode("utf-8", "surrogatepass")[nbytes:].decode("utf-8", "ignore")


def truncation_marker(dropped: int) -> str:
    return f"\n[... {dropped} bytes truncated ...]\n"


class HeadTail(Generic[T]):
    """Keeps the first `cap // 2` bytes and the last `cap - cap // 2` bytes of the pieces
    added, in order; memory stays within the cap however much is added.

    A piece of size 0 stays where it arrived (in the tail once there is one) and is lost,
    counted in `lost`, when the tail's trimming reaches it. Subclasses say what a piece's
    size is and how to cut one; `join` may merge a piece into the one before it."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head: list[T] = []
        self.tail: collections.deque[T] = collections.deque()
        self.head_size = 0
        self.tail_size = 0
        self.total = 0  # bytes added
        self.dropped = 0  # bytes cut from the middle
        self.lost = 0  # pieces of size 0 cut with the middle

    # --- what a piece is ------------------------------------------------------------------

    def size(self, piece: T) -> int:
        raise NotImplementedError

    def take(self, piece: T, nbytes: int) -> tuple[T, T]:
        """The first at most `nbytes` bytes of `piece`, and the rest."""
        raise NotImplementedError

    def drop_front(self, piece: T, nbytes: int) -> T:
        """`piece` without (at least) its first `nbytes` bytes."""
        raise NotImplementedError

    def join(self, last: T, piece: T) -> bool:
        """Merge `piece` into `last` in place; False when they stay two pieces."""
        return False

    # --- the buffer -----------------------------------------------------------------------

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def pieces(self) -> list[T]:
        return [*self.head, *self.tail]

    def add(self, piece: T, size: int | None = None) -> None:
        """Add `piece` (`size`: its size when the caller knows it already)."""
        size = self.size(piece) if size is None else size
        self.total += size
        if size == 0:
            self._append(self.tail if self.tail else self.head, piece)
            return
        room = self.head_cap - self.head_size
        if not self.tail and room > 0:
            if size <= room:
                self._append(self.head, piece)
                self.head_size += size
                return
            front, piece = self.take(piece, room)
            self._append(self.head, front)
            self.head_size += self.size(front)
            size = self.size(piece)
        self._append(self.tail, piece)
        self.tail_size += size
        while self.tail_size > self.tail_cap and self.tail:
            first = self.tail[0]
            first_size = self.size(first)
            excess = self.tail_size - self.tail_cap
            if first_size <= excess:
                self.tail.popleft()
                self.tail_size -= first_size
                self.dropped += first_size
                if first_size == 0:
                    self.lost += 1
            else:
                kept = self.drop_front(first, excess)
                self.tail[0] = kept
                removed = first_size - self.size(kept)
                self.tail_size -= removed
                self.dropped += removed

    def _append(self, pieces: list[T] | collections.deque[T], piece: T) -> None:
        if not (pieces and self.join(pieces[-1], piece)):
            pieces.append(piece)


class HeadTailText(HeadTail[str]):
    """Text: `text()` is the head and the tail, the cut middle marked."""

    def size(self, piece: str) -> int:
        return utf8_size(piece)

    def take(self, piece: str, nbytes: int) -> tuple[str, str]:
        head = utf8_head(piece, nbytes)
        return head, piece[len(head) :]

    def drop_front(self, piece: str, nbytes: int) -> str:
        return utf8_drop_front(piece, nbytes)

    def text(self) -> str:
        head = "".join(self.head)
        tail = "".join(self.tail)
        if self.dropped:
            return head + truncation_marker(self.dropped) + tail
        return head + tail
