"""Fences: lines the gateway has a kernel write through its own stdout and stderr, to know
that everything printed before them has arrived.

Deno's kernel publishes what the code prints from another thread, so a cell's output can
reach iopub after the cell's `idle` status (measured: 3000 `console.log` lines all came
after it). Once a cell has replied, the session asks the kernel (a silent request, see
`kernels/deno/prelude.js`) to write a fence `\\x1egw-fence:<token>:end:<n>` to both
streams: the streams are pipes, so a fence arrives after all the output written before
it. `Deno.exit(n)` writes `...:exit:<n>` the same way before it ends the process, so the
program's exit is seen after its last output.

`CellFences` reads a cell's stream texts: it takes the fences out (a fence split across
two messages is held back until its end arrives) and says when both streams are fenced.
The token is random per kernel: code that prints a fence of its own cannot guess it, and
could only end its own run early anyway.
"""

from __future__ import annotations

import secrets

MARK = "\x1egw-fence:"
STREAMS = ("stdout", "stderr")


def new_token() -> str:
    return secrets.token_hex(12)


class CellFences:
    """The fences in one cell's stdout and stderr."""

    def __init__(self, token: str) -> None:
        self.prefix = f"{MARK}{token}:"
        self.end_label: str | None = None  # set once the end fence has been asked for
        self.ended: set[str] = set()
        self.exits: dict[str, int] = {}
        self._held = dict.fromkeys(STREAMS, "")

    def expect_end(self, label: str) -> None:
        self.end_label = label

    @property
    def finished(self) -> bool:
        """Both streams fenced: by the end fence, or by the program's exit."""
        return self.exit_code is not None or self.ended >= set(STREAMS)

    @property
    def exit_code(self) -> int | None:
        """The code `Deno.exit` was called with, once both streams carry its fence."""
        if set(self.exits) >= set(STREAMS):
            return self.exits["stdout"]
        return None

    def feed(self, stream: str, text: str) -> str:
        """The text without fences (a possible fence's start is held back)."""
        if stream not in self._held:
            return text
        data = self._held[stream] + text
        self._held[stream] = ""
        kept: list[str] = []
        while (start := data.find(self.prefix)) >= 0:
            end = data.find("\n", start)
            if end < 0:
                break
            kept.append(data[:start])
            self._saw(stream, data[start + len(self.prefix) : end])
            data = data[end + 1 :]
        start = data.find(self.prefix)
        if start < 0:
            start = _partial_suffix(data, self.prefix)
        kept.append(data[:start])
        self._held[stream] = data[start:]
        return "".join(kept)

    def release(self, stream: str) -> str:
        """What was held back, when no more text will come."""
        held, self._held[stream] = self._held[stream], ""
        return held

    def _saw(self, stream: str, label: str) -> None:
        kind, _, value = label.partition(":")
        if label == self.end_label:
            self.ended.add(stream)
        elif kind == "exit" and value.isdigit():
            self.exits[stream] = int(value) % 256


def _partial_suffix(data: str, prefix: str) -> int:
    """Where a suffix of `data` that is a proper prefix of `prefix` starts (len if none).
    The prefix holds its first character once, so only the last one in reach counts."""
    start = data.rfind(prefix[0], max(0, len(data) - len(prefix) + 1))
    if start >= 0 and prefix.startswith(data[start:]):
        return start
    return len(data)
