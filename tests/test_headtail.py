"""The one head/tail buffer (`gateway/execution/textcap.py`), for text and for a cell's
outputs: whatever is added, the head and the tail are exact pieces of it, nothing is counted
twice or lost unmarked, and memory stays within the cap."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.execution.collector import Caps, OutputCollector
from gateway.execution.textcap import HeadTailText
from tests.api import truncation_marker

pytestmark = pytest.mark.fast


def utf8_size(text: str) -> int:
    return len(text.encode())


def utf8_head(text: str, nbytes: int) -> str:
    """The longest start of `text` made of whole characters within `nbytes` bytes of UTF-8."""
    size = 0
    for index, character in enumerate(text):
        size += len(character.encode())
        if size > nbytes:
            return text[:index]
    return text


# multi-byte characters too, so that cuts fall inside them
TEXTS = st.lists(st.text(alphabet="ab\né€😀", max_size=40), max_size=30)


@given(cap=st.integers(0, 80), pieces=TEXTS)
def test_text_keeps_an_exact_head_and_tail(cap: int, pieces: list[str]) -> None:
    buffer = HeadTailText(cap)
    for piece in pieces:
        buffer.add(piece)
    whole = "".join(pieces)
    head, tail = "".join(buffer.head), "".join(buffer.tail)
    assert buffer.total == utf8_size(whole)
    assert head == utf8_head(whole, cap // 2)
    assert whole.endswith(tail)
    assert utf8_size(head) + buffer.dropped + utf8_size(tail) == buffer.total
    assert utf8_size(tail) <= cap - cap // 2
    if buffer.truncated:
        assert utf8_size(tail) > cap - cap // 2 - 4  # at most a cut character short
        assert buffer.text() == head + truncation_marker(buffer.dropped) + tail
    else:
        assert buffer.text() == whole


def stream(text: str, name: str = "stdout") -> dict[str, Any]:
    return {"header": {"msg_type": "stream"}, "content": {"name": name, "text": text}}


def display(text: str) -> dict[str, Any]:
    content = {"data": {"text/plain": text}, "metadata": {}}
    return {"header": {"msg_type": "display_data"}, "content": content}


def test_outputs_keep_the_streams_head_and_tail_and_count_a_lost_display() -> None:
    collector = OutputCollector(Caps(stream_bytes=20, display_bytes=10_000, limit_bytes=10**9))
    for message in [
        stream("0123456789"),
        display("in the head"),
        stream("abc", "stderr"),
        stream("defghij", "stderr"),
        display("cut with the middle"),
        stream("x" * 30),
        display("in the tail"),
        stream("yz"),
    ]:
        collector.add(message)
    texts = [(o.get("name"), o.get("text") or o["data"]["text/plain"]) for o in collector.outputs()]
    assert texts == [
        ("stdout", "0123456789"),
        (None, "in the head"),
        ("stderr", truncation_marker(52 - 10 - 10)),
        ("stdout", "x" * 8),
        (None, "in the tail"),
        ("stdout", "yz"),
    ]
    assert any(
        note.startswith("1 rich output(s) were not returned") for note in collector.final_notes()
    )


def test_a_held_error_comes_after_the_streams_that_arrive_before_the_fences() -> None:
    """Deno prints from another thread than the one that reports the error: `before` may
    arrive after the error, and the collector of a fenced kernel puts it back in order."""
    error = {"ename": "TypeError", "evalue": "bad", "traceback": ["TypeError: bad"]}
    caps = Caps(stream_bytes=1000, display_bytes=10_000, limit_bytes=10**9)
    for hold, expected in ((True, ["stream", "error"]), (False, ["error", "stream"])):
        collector = OutputCollector(caps, hold_error=hold)
        collector.add({"header": {"msg_type": "error"}, "content": error})
        collector.add(stream("before\n"))
        collector.release_error()
        assert [o["output_type"] for o in collector.outputs()] == expected
        assert collector.error is not None and collector.error["evalue"] == "bad"
