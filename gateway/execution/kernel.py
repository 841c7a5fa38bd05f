"""Talk to one kernel: connect over its ipc sockets, wait until ready, run requests.

jupyter_client supplies the messaging (`AsyncKernelClient`: sockets, signing, message
shapes); its `KernelManager` is not used (DESIGN.md decision 2). Readiness is a
`kernel_info_reply` plus one iopub message, so that no output of the first request is lost
to ZMQ's slow-joiner effect.

A kernel runs untrusted code, so what it sends is hostile input (issue 8, hole 6): every
byte received on any channel counts in `received_bytes`, whatever message it belongs to
(the run's output limit is checked against it), messages are bounded in size by the
context's `MAXMSGSIZE` (see `gateway.server`), and a message that does not parse or is not
signed with the kernel's key is dropped (counted) instead of failing the run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, cast

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo

from gateway.errors import SandboxError

log = logging.getLogger(__name__)


class KernelClient:
    """A connected client for one kernel; use `connect()`."""

    def __init__(self, client: AsyncKernelClient) -> None:
        self._client = client
        self.received_bytes = 0  # everything the kernel sent, on every channel

    def close(self) -> None:
        """Close the client's sockets (idempotent)."""
        if self._client.channels_running:
            self._client.stop_channels()

    @property
    def session_id(self) -> str:
        return str(self._client.session.session)

    async def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        got_reply = got_iopub = False
        while not (got_reply and got_iopub):
            if time.monotonic() > deadline:
                raise SandboxError(f"The kernel did not become ready within {timeout:g} s.")
            if not got_reply:
                self._client.kernel_info()
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

    def execute(
        self,
        code: str,
        *,
        silent: bool = False,
        store_history: bool | None = None,
        user_expressions: dict[str, str] | None = None,
    ) -> str:
        return str(
            self._client.execute(
                code,
                silent=silent,
                store_history=not silent if store_history is None else store_history,
                user_expressions=user_expressions or {},
                allow_stdin=False,
                stop_on_error=False,
            )
        )

    async def iopub(self, timeout: float) -> dict[str, Any]:
        """The next iopub message; raises TimeoutError."""
        return await self._receive(self._client.iopub_channel.socket, timeout)

    async def shell(self, timeout: float) -> dict[str, Any]:
        """The next shell reply; raises TimeoutError."""
        return await self._receive(self._client.shell_channel.socket, timeout)

    async def _receive(self, socket: zmq.asyncio.Socket, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await socket.poll(int(remaining * 1000) + 1):
                raise TimeoutError
            frames = await socket.recv_multipart()
            self.received_bytes += sum(len(frame) for frame in frames)
            session = self._client.session
            try:
                _, signed = session.feed_identities(frames)
                msg: dict[str, Any] = session.deserialize(signed)
            except Exception as exc:  # a kernel's malformed or unsigned message: dropped
                log.debug("dropped a malformed kernel message: %r", exc)
                continue
            if isinstance(msg.get("content"), dict) and isinstance(msg.get("parent_header"), dict):
                return msg

    def interrupt(self) -> None:
        msg = self._client.session.msg("interrupt_request", {})
        self._client.control_channel.send(msg)

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


def connect(info: dict[str, Any], context: zmq.asyncio.Context) -> KernelClient:
    """A client for the kernel at `info`; its owner calls `close()`."""
    client = AsyncKernelClient(context=context)
    client.load_connection_info(cast(KernelConnectionInfo, info))
    client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=True)
    for channel in (client.shell_channel, client.iopub_channel, client.control_channel):
        channel.socket.setsockopt(zmq.LINGER, 0)
    return KernelClient(client)
