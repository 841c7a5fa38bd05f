"""A text buffer that keeps the head and the tail of a stream within a byte budget."""

from __future__ import annotations

import collections


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _cut_front(text: str, nbytes: int) -> str:
    """Drop about `nbytes` bytes from the front of text, on a character boundary."""
    data = text.encode("utf-8", "surrogatepass")[nbytes:]
    return data.decode("utf-8", "ignore")


def truncation_marker(dropped: int) -> str:
    return f"\n[... {dropped} bytes truncated ...]\n"


class HeadTailText:
    """Keeps the first `cap // 2` bytes and the last `cap - cap // 2` bytes of what is added.

    Memory stays within the cap however much is added; `text()` marks the cut middle.
    """

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self._head: list[str] = []
        self._head_size = 0
        self._tail: collections.deque[str] = collections.deque()
        self._tail_size = 0
        self.total = 0
        self.dropped = 0

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def add(self, text: str) -> None:
        size = _size(text)
        self.total += size
        room = self.head_cap - self._head_size
        if not self._tail and room > 0:
            if size <= room:
                self._head.append(text)
                self._head_size += size
                return
            head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
            self._head.append(head)
            self._head_size += _size(head)
            text = text[len(head) :]
            size = _size(text)
        self._tail.append(text)
        self._tail_size += size
        while self._tail_size > self.tail_cap and self._tail:
            excess = self._tail_size - self.tail_cap
            first = self._tail[0]
            first_size = _size(first)
            if first_size <= excess:
                self._tail.popleft()
                self._tail_size -= first_size
                self.dropped += first_size
            else:
                kept = _cut_front(first, excess)
                self._tail[0] = kept
                removed = first_size - _size(kept)
                self._tail_size -= removed
                self.dropped += removed

    def text(self) -> str:
        head = "".join(self._head)
        tail = "".join(self._tail)
        if self.dropped:
            return head + truncation_marker(self.dropped) + tail
        return head + tail
