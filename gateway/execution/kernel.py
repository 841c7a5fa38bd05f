"""Talk to one kernel: connect to its ipc sockets, wait until it is ready, run requests.

The messages are Jupyter's, signed and parsed by jupyter_client's `Session`; the sockets are
our own ZMTP peers (`zmtp.py`), so that every byte a kernel sends is bounded as it arrives.
jupyter_client's `KernelManager` is not used (DESIGN.md decision 2), nor, since a kernel is
hostile input, libzmq's receive path (DESIGN.md decision 18). Readiness is a
`kernel_info_reply` plus one iopub message, so that no output of the first request is lost
before the subscription took.

What a kernel sends counts in `received_bytes` on every channel, whatever message it claims
to belong to (the run's output limit is checked against it, and the run sets the meter's
ceiling to that limit, so nothing past it is even read: `OverLimit`); a message larger than
the wire's bound is dropped unread (counted); a message that does not parse or is not
signed with the kernel's key is dropped (counted) instead of failing the run. A large
message is parsed and its signature checked off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from jupyter_client.session import Session

from gateway.budget import ByteBudget
from gateway.errors import SandboxError
from gateway.execution.zmtp import (
    Channel,
    Dropped,
    Meter,
    OverLimit,
    SocketType,
    ZmtpError,
    open_channel,
)
from gateway.offload import SMALL, offload

log = logging.getLogger(__name__)

__all__ = ["KernelClient", "OverLimit", "Wire"]

# The channels the gateway uses (no stdin: input() is refused; no heartbeat: a kernel's
# death is watched by its sandbox), their connection-file ports and ZMTP roles.
CHANNELS: dict[str, tuple[str, SocketType]] = {
    "shell": ("shell_port", "DEALER"),
    "iopub": ("iopub_port", "SUB"),
    "control": ("control_port", "DEALER"),
}
KERNEL_INFO_EVERY = 0.5  # seconds between kernel_info requests while a kernel starts


@dataclasses.dataclass
class Wire:
    """What every kernel connection of one gateway shares: the largest message a kernel may
    send (a larger one is dropped unread), and the budget of kernel message bytes held in
    the gateway at once (past it, reading waits: the kernels are slowed down)."""

    max_message_bytes: int
    budget: ByteBudget
    open_channels: int = 0


class KernelClient:
    """A client for the kernel at `info` (connection info, ipc transport); `wait_ready()`
    connects it, `close()` closes it."""

    def __init__(self, info: dict[str, Any], wire: Wire) -> None:
        if info.get("transport") != "ipc":
            raise SandboxError("The kernel's connection info is not on the ipc transport.")
        self._info = info
        self._wire = wire
        self.session = Session(
            key=str(info["key"]).encode(), signature_scheme=info["signature_scheme"]
        )
        self.meter = Meter()
        self._channels: dict[str, Channel] = {}
        self._pending: dict[str, asyncio.Future[list[bytes] | Dropped]] = {}
        self._parsing = asyncio.Lock()  # one off-loop parse at a time: Session is not shared

    @property
    def received_bytes(self) -> int:
        """Everything the kernel sent, on every channel."""
        return self.meter.total

    @property
    def over_limit(self) -> bool:
        return self.meter.exceeded

    @property
    def session_id(self) -> str:
        return str(self.session.session)

    def close(self) -> None:
        """Close every channel (idempotent)."""
        for pending in self._pending.values():
            if pending.done() and not pending.cancelled():
                pending.exception()  # a channel the kernel closed: known, and no error
            pending.cancel()
        self._pending.clear()
        for channel in self._channels.values():
            channel.close()
            self._wire.open_channels -= 1
        self._channels.clear()

    # --- connecting -------------------------------------------------------------------

    async def connect(self, timeout: float) -> None:
        """Open the channels, retrying while the kernel has not bound its sockets yet."""
        deadline = time.monotonic() + timeout
        for name, (port, socket_type) in CHANNELS.items():
            if name in self._channels:
                continue
            path = f"{self._info['ip']}-{self._info[port]}"
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxError(f"The kernel did not become ready within {timeout:g} s.")
                try:
                    channel = await asyncio.wait_for(
                        open_channel(
                            path,
                            socket_type,
                            self.meter,
                            self._wire.budget,
                            self._wire.max_message_bytes,
                            key=id(self),
                        ),
                        remaining,
                    )
                except (OSError, ZmtpError, TimeoutError):
                    await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
                    continue
                self._channels[name] = channel
                self._wire.open_channels += 1
                break

    async def wait_ready(self, timeout: float) -> None:
        """Connect, then wait until the kernel has answered `kernel_info` and iopub has
        delivered a message, asking again every `KERNEL_INFO_EVERY` s until both happened
        (as Jupyter Server's "nudge" does): a status published before the iopub subscription
        reached the kernel goes nowhere. Deno behind its relay, under load, answered the
        first request before the subscription had crossed the relay, and a start that asked
        once waited out the whole timeout (2 of ~330 starts of 10 at once beside 4 busy
        loops)."""
        deadline = time.monotonic() + timeout
        await self.connect(timeout)
        got_reply = got_iopub = False
        asked = 0.0
        while not (got_reply and got_iopub):
            now = time.monotonic()
            if now > deadline:
                raise SandboxError(f"The kernel did not become ready within {timeout:g} s.")
            if now - asked >= KERNEL_INFO_EVERY:
                self.kernel_info()
                asked = now
            with contextlib.suppress(TimeoutError):
                await self.iopub(timeout=0.05)
                got_iopub = True
            if not got_reply:
                with contextlib.suppress(TimeoutError):
                    reply = await self.shell(timeout=0.05)
                    got_reply = reply["header"]["msg_type"] == "kernel_info_reply"
        # drain what the kernel_info requests left on iopub
        while True:
            try:
                await self.iopub(timeout=0.01)
            except TimeoutError:
                break

    # --- requests ---------------------------------------------------------------------

    def _send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        msg = self.session.msg(msg_type, content)
        self._channels[channel].send(self.session.serialize(msg))
        return str(msg["header"]["msg_id"])

    def kernel_info(self) -> str:
        return self._send("shell", "kernel_info_request", {})

    def execute(
        self,
        code: str,
        *,
        silent: bool = False,
        store_history: bool | None = None,
        user_expressions: dict[str, str] | None = None,
    ) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent if store_history is None else store_history,
            "user_expressions": user_expressions or {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        return self._send("shell", "execute_request", content)

    def interrupt(self) -> None:
        self._send("control", "interrupt_request", {})

    async def run_silent(
        self, code: str, timeout: float, user_expressions: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run gateway code (not the user's) and return its execute_reply content."""
        msg_id = self.execute(code, silent=True, user_expressions=user_expressions)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            reply = await self.shell(remaining)
            if reply["parent_header"].get("msg_id") == msg_id:
                content: dict[str, Any] = reply["content"]
                return content

    # --- receiving --------------------------------------------------------------------

    async def iopub(self, timeout: float) -> dict[str, Any]:
        """The next iopub message; raises TimeoutError, or OverLimit past the ceiling."""
        return await self._receive("iopub", timeout)

    async def discard_iopub(self) -> None:
        """Read and drop iopub messages until cancelled (for a kernel that waits in a pool).

        Our kernels' iopub sockets wait for a slow reader instead of dropping output
        (XPUB_NODROP, kernels/python/streams.py): unread, a waiting kernel would stop answering
        after 1,000 messages. Cancelling is safe at any point: a receive under way is left
        for the next reader, at worst one message of the wait is lost."""
        while True:
            with contextlib.suppress(TimeoutError):
                await self._receive("iopub", timeout=3600)

    async def shell(self, timeout: float) -> dict[str, Any]:
        """The next shell reply; raises TimeoutError, or OverLimit past the ceiling."""
        return await self._receive("shell", timeout)

    async def _receive(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        channel = self._channels.get(name)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if channel is None or (channel.broken and name not in self._pending):
                if self.meter.exceeded:
                    raise OverLimit
                await asyncio.sleep(remaining)  # a closed channel: nothing will come
                raise TimeoutError
            # A receive that times out is left running, not cancelled (that would leave the
            # stream mid-message): the next call takes its message.
            pending = self._pending.get(name)
            if pending is None:
                pending = self._pending[name] = asyncio.ensure_future(channel.receive())
            done, _ = await asyncio.wait({pending}, timeout=remaining)
            if not done:
                raise TimeoutError
            del self._pending[name]
            try:
                frames = pending.result()
            except ZmtpError as exc:
                log.debug("kernel channel %s closed: %s", name, exc)
                continue
            if isinstance(frames, Dropped):
                log.debug("dropped a kernel message over the bound: %r", frames)
                continue
            try:
                msg = await self._parse(frames)
            except Exception as exc:  # a kernel's malformed or unsigned message: dropped
                log.debug("dropped a malformed kernel message: %r", exc)
                continue
            finally:
                channel.release()
            if isinstance(msg.get("content"), dict) and isinstance(msg.get("parent_header"), dict):
                return msg

    async def _parse(self, frames: list[bytes]) -> dict[str, Any]:
        if sum(len(frame) for frame in frames) <= SMALL:
            return self._deserialize(frames)
        async with self._parsing:
            return await offload(self._deserialize, frames)

    def _deserialize(self, frames: list[bytes]) -> dict[str, Any]:
        _, signed = self.session.feed_identities(frames)
        msg: dict[str, Any] = self.session.deserialize(signed)
        return msg
