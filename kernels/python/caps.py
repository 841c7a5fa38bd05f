"""Kernel-side caps: an ordinary program's huge error or display arrives cut, not lost.

The gateway bounds what it accepts from a kernel whatever the kernel sends (a message
over its size limit is dropped, every byte counts against the output limit). A program
that raises `ValueError('A' * 10**8)` or displays a 50 MB HTML table is not hostile,
though: here, inside the kernel, such messages are cut to what the gateway keeps, head and
tail with a marker, so that the run still gets its error and its reply.

- error values and each traceback entry: at most `MAX_TEXT` characters; a whole
  traceback at most `MAX_TRACEBACK` (the `error` message and the execute_reply alike);
- one display or result message: at most `MAX_DISPLAY` characters of data, else a
  `text/plain` note says what was not sent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

MAX_TEXT = 64 * 1024
MAX_TRACEBACK = 1024 * 1024
MAX_DISPLAY = 16 * 1024 * 1024


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """`text` within `limit` characters: its head and tail around a marker."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters truncated ...]\n{text[-half:]}"


def capped_traceback(entries: Any) -> list[str]:
    """Each entry cut; then whole entries dropped from the middle past `MAX_TRACEBACK`."""
    lines = [cut(str(entry)) for entry in (entries or [])]
    total = sum(map(len, lines))
    dropped = 0
    while total > MAX_TRACEBACK and len(lines) > 2:
        middle = len(lines) // 2
        total -= len(lines.pop(middle))
        dropped += 1
    if dropped:
        lines.insert(len(lines) // 2, f"[... {dropped} traceback entries truncated ...]")
    return lines


class _CappedValue:
    """Stands in for an exception value whose text is too long (only `str()` is used)."""

    def __init__(self, value: Any) -> None:
        self.text = cut(str(value))

    def __str__(self) -> str:
        return self.text


def _data_size(data: Any) -> int:
    if isinstance(data, dict):
        return sum(len(str(key)) + _data_size(value) for key, value in data.items())
    if isinstance(data, list | tuple):
        return sum(_data_size(item) for item in data)
    return len(str(data))


def cap_display(msg: dict[str, Any] | None) -> dict[str, Any] | None:
    """A display hook (ipykernel >= 7): one message's data within `MAX_DISPLAY`."""
    if msg is None:
        return None
    content = msg.get("content") or {}
    size = _data_size(content.get("data") or {})
    if size > MAX_DISPLAY:
        note = (
            f"[gateway] an output of {size} characters was not sent: one output may have "
            f"at most {MAX_DISPLAY}"
        )
        content["data"] = {"text/plain": note}
    return msg


def _cap_showtraceback(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def showtraceback(self: Any, etype: Any, evalue: Any, stb: Any) -> Any:
        return original(self, etype, _CappedValue(evalue), capped_traceback(stb))

    showtraceback.__wrapped__ = original
    return showtraceback


def _cap_bound_showtraceback(original: Callable[..., Any]) -> Callable[..., Any]:
    def showtraceback(etype: Any, evalue: Any, stb: Any) -> Any:
        return original(etype, _CappedValue(evalue), capped_traceback(stb))

    showtraceback.__wrapped__ = original  # type: ignore[attr-defined]
    return showtraceback


def _cap_do_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def do_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = await original(self, *args, **kwargs)
        if isinstance(reply, dict) and reply.get("status") == "error":
            reply["evalue"] = cut(str(reply.get("evalue", "")))
            reply["traceback"] = capped_traceback(reply.get("traceback"))
        return reply

    do_execute.__wrapped__ = original
    return do_execute


def install(shell: Any) -> None:
    """Cap what this kernel sends (called once, when our extension loads)."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.zmqshell import ZMQInteractiveShell

    if not hasattr(ZMQInteractiveShell._showtraceback, "__wrapped__"):
        setattr(  # noqa: B010 - a method replaced on its class
            ZMQInteractiveShell,
            "_showtraceback",
            _cap_showtraceback(ZMQInteractiveShell._showtraceback),
        )
    own = vars(shell).get("_showtraceback")  # ipykernel's app may set one per instance
    if own is not None and not hasattr(own, "__wrapped__"):
        shell._showtraceback = _cap_bound_showtraceback(own)
    if not hasattr(IPythonKernel.do_execute, "__wrapped__"):
        setattr(IPythonKernel, "do_execute", _cap_do_execute(IPythonKernel.do_execute))  # noqa: B010
    for publisher in (getattr(shell, "display_pub", None), getattr(shell, "displayhook", None)):
        register = getattr(publisher, "register_hook", None)
        if register is not None:
            register(cap_display)
