"""Talk to one kernel: connect over its ipc sockets, wait until ready, run requests.

jupyter_client supplies the messaging (`AsyncKernelClient`); its `KernelManager` is not
used (DESIGN.md decision 2). Readiness is a `kernel_info_reply` plus one iopub message, so
that no output of the first request is lost to ZMQ's slow-joiner effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo

from gateway.errors import SandboxError


class KernelDied(Exception):
    """The kernel process went away while we waited for it."""


class KernelClient:
    """A connected client for one kernel; use `connect()`."""

    def __init__(self, client: AsyncKernelClient) -> None:
        self._client = client

    @property
    def session_id(self) -> str:
        return str(self._client.session.session)

    async def wait_ready(self, timeout: float, alive: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        got_reply = got_iopub = False
        while not (got_reply and got_iopub):
            if time.monotonic() > deadline:
                raise SandboxError(f"The kernel did not become ready within {timeout:g} s.")
            if not alive():
                raise KernelDied("The kernel exited while starting.")
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
        self, code: str, *, silent: bool = False, user_expressions: dict[str, str] | None = None
    ) -> str:
        return str(
            self._client.execute(
                code,
                silent=silent,
                store_history=not silent,
                user_expressions=user_expressions or {},
                allow_stdin=False,
                stop_on_error=False,
            )
        )

    async def iopub(self, timeout: float) -> dict[str, Any]:
        """The next iopub message; raises TimeoutError."""
        try:
            msg: dict[str, Any] = await self._client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        return msg

    async def shell(self, timeout: float) -> dict[str, Any]:
        """The next shell reply; raises TimeoutError."""
        try:
            msg: dict[str, Any] = await self._client.get_shell_msg(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
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


@contextlib.asynccontextmanager
async def connect(
    info: dict[str, Any], context: zmq.asyncio.Context
) -> AsyncIterator[KernelClient]:
    """A client for the kernel at `info`, with its sockets always closed on exit."""
    client = AsyncKernelClient(context=context)
    client.load_connection_info(cast(KernelConnectionInfo, info))
    client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=True)
    for channel in (client.shell_channel, client.iopub_channel, client.control_channel):
        channel.socket.setsockopt(zmq.LINGER, 0)
    try:
        yield KernelClient(client)
    finally:
        client.stop_channels()
        await asyncio.sleep(0)
