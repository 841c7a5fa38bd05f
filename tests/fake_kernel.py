"""A scripted Jupyter kernel for the fast tests: real libzmq sockets on ipc, Jupyter's signed
messages, and behaviour each test writes down.

The protocol boundary is the kernel's messages, so this is where the fake sits (nbclient
tests its executor against scripted message sequences the same way): the gateway's ZMTP
peer, kernel client, session, collector and executor are all the real ones. A cell's code
is a script, a JSON list of steps (`script(...)`), run in order:

    ["stdout", text] / ["stderr", text]   a stream message
    ["display", data]                     display_data with this mime bundle
    ["execute_result", data]              the cell's value
    ["result", value]                     sets the kernel's `result` (read back after the
                                          last cell, as ipykernel's user expression)
    ["result_error", why]                 `result` exists but is not JSON-serialisable
    ["error", ename, evalue]              an error output; the reply says "error"
    ["mark", name]                        sets `marks[name]` (a test waits for it)
    ["wait", name]                        until the test opens `gates[name]`; an interrupt
                                          ends it with KeyboardInterrupt
    ["hang"]                              forever: interrupts are ignored
    ["flood", n]                          n bytes on stdout, in 64 KiB messages
    ["no_reply"]                          the cell sends no execute_reply (idle still comes)
    ["die", code] / ["die", code, "memory"]  the kernel process ends (killed by its
                                          memory limit, with "memory")

Code that is not a script (the gateway's own: the run's environment, preloads) is answered
"ok" at once. Everything runs as tasks on the test's event loop: no process, nothing for
the leak census to find.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from gateway.execution.value import RESULT_EXPRESSION

FLOOD_CHUNK = 64 * 1024
_CAP = re.compile(r"result_value\((\d+)\)")


def script(*steps: list[Any]) -> str:
    """A cell's code: the steps the fake kernel takes when it runs it."""
    return json.dumps(list(steps))


class Signals:
    """What a test and its kernels share: marks the kernels set, gates the test opens."""

    def __init__(self) -> None:
        self.marks: dict[str, asyncio.Event] = {}
        self.gates: dict[str, asyncio.Event] = {}

    def mark(self, name: str) -> asyncio.Event:
        return self.marks.setdefault(name, asyncio.Event())

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())


class _Interrupted(Exception):
    pass


class _Died(Exception):
    def __init__(self, code: int, oom: bool) -> None:
        self.code = code
        self.oom = oom


class ScriptedKernel:
    """One kernel: its sockets bound at `prefix`-1 ... -5 (the ipc connection info), serving
    until it dies or is stopped. `on_exit(code, oom)` is told when it ends by itself."""

    def __init__(
        self,
        prefix: str,
        key: str,
        signals: Signals,
        on_exit: Callable[[int, bool], None],
        cpu_ms_per_request: int = 10,
    ) -> None:
        self.session = Session(key=key.encode(), signature_scheme="hmac-sha256")
        self.signals = signals
        self.on_exit = on_exit
        self.context = zmq.asyncio.Context()
        self.shell = self._bind(zmq.ROUTER, f"{prefix}-1")
        self.iopub = self._bind(zmq.XPUB, f"{prefix}-2")
        self.control = self._bind(zmq.ROUTER, f"{prefix}-4")
        self.executed: list[str] = []  # every code it was asked to run, in order
        self.result: dict[str, Any] = {"present": False}
        self.count = 0
        self.cpu_ms = 0  # what `usage()` reports: grows with every request
        self.cpu_ms_per_request = cpu_ms_per_request
        self.interrupts = 0  # interrupt requests it got
        self.frozen = False
        self.alive = True
        self._interrupt: asyncio.Event | None = None  # set by an interrupt while a step waits
        self._tasks = [
            asyncio.create_task(self._serve_shell()),
            asyncio.create_task(self._serve_control()),
            asyncio.create_task(self._welcome()),
        ]

    def _bind(self, kind: int, address: str) -> zmq.asyncio.Socket:
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(f"ipc://{address}")
        return socket

    # --- life ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """End the kernel (a kill from outside): its tasks end, its sockets close."""
        if not self.alive:
            return
        self.alive = False
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)
        for socket in (self.shell, self.iopub, self.control):
            socket.close(0)
        self.context.term()

    async def _die(self, code: int, oom: bool) -> None:
        await self.stop()
        self.on_exit(code, oom)

    async def _welcome(self) -> None:
        """A status for every new subscriber, as ipykernel's iopub welcome: the client is
        ready as soon as its subscription has arrived."""
        while True:
            frames = await self.iopub.recv_multipart()
            if frames and frames[0][:1] == b"\x01":
                self._publish("status", {"execution_state": "starting"}, {})

    # --- messages -----------------------------------------------------------------------

    def _publish(self, kind: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        self.session.send(self.iopub, kind, content, parent=parent)

    def _reply(
        self, socket: zmq.asyncio.Socket, kind: str, content: dict[str, Any], request: Any
    ) -> None:
        self.session.send(socket, kind, content, parent=request["msg"], ident=request["idents"])

    async def _receive(self, socket: zmq.asyncio.Socket) -> dict[str, Any]:
        frames = await socket.recv_multipart()
        idents, signed = self.session.feed_identities(frames)
        return {"idents": idents, "msg": self.session.deserialize(signed)}

    async def _serve_control(self) -> None:
        while True:
            request = await self._receive(self.control)
            kind = request["msg"]["header"]["msg_type"]
            if kind == "interrupt_request":
                self.interrupts += 1
                self._reply(self.control, "interrupt_reply", {"status": "ok"}, request)
                if self._interrupt is not None:
                    self._interrupt.set()

    async def _serve_shell(self) -> None:
        while True:
            request = await self._receive(self.shell)
            msg = request["msg"]
            self.cpu_ms += self.cpu_ms_per_request
            kind = msg["header"]["msg_type"]
            self._publish("status", {"execution_state": "busy"}, msg)
            if kind == "kernel_info_request":
                content = {"status": "ok", "protocol_version": "5.3", "implementation": "fake"}
                self._reply(self.shell, "kernel_info_reply", content, request)
            elif kind == "execute_request":
                try:
                    reply = await self._execute(msg)
                except _Died as death:
                    await self._die(death.code, death.oom)
                    return
                if reply is not None:
                    self._reply(self.shell, "execute_reply", reply, request)
            self._publish("status", {"execution_state": "idle"}, msg)

    # --- running a cell -----------------------------------------------------------------

    async def _execute(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Run one request's script; its execute_reply content (None: no reply)."""
        content = msg["content"]
        code = str(content.get("code", ""))
        self.executed.append(code)
        if not content.get("silent"):
            self.count += 1
            self._publish("execute_input", {"code": code, "execution_count": self.count}, msg)
        try:
            steps = json.loads(code)
        except ValueError:
            steps = []  # the gateway's own code: nothing to show
        if not isinstance(steps, list):
            steps = []
        reply: dict[str, Any] = {"status": "ok", "execution_count": self.count}
        send_reply = True
        try:
            for step in steps:
                if step[0] == "no_reply":
                    send_reply = False
                else:
                    await self._step(step, msg)
        except _Interrupted:
            reply = self._error(msg, "KeyboardInterrupt", "")
        except _ErrorStep as error:
            reply = self._error(msg, error.ename, error.evalue)
        if reply["status"] == "ok":
            reply["user_expressions"] = self._evaluate(content.get("user_expressions") or {})
        else:
            reply["user_expressions"] = {}
        return reply if send_reply else None

    def _error(self, msg: dict[str, Any], ename: str, evalue: str) -> dict[str, Any]:
        error = {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
        self._publish("error", error, msg)
        return {"status": "error", "execution_count": self.count, **error}

    async def _step(self, step: list[Any], msg: dict[str, Any]) -> None:
        kind = step[0]
        if kind in ("stdout", "stderr"):
            self._publish("stream", {"name": kind, "text": step[1]}, msg)
        elif kind == "display":
            self._publish("display_data", {"data": step[1], "metadata": {}}, msg)
        elif kind == "execute_result":
            content = {"data": step[1], "metadata": {}, "execution_count": self.count}
            self._publish("execute_result", content, msg)
        elif kind == "result":
            self.result = {"present": True, "name": "result", "value": step[1]}
        elif kind == "result_error":
            self.result = {"present": True, "name": "result", "error": step[1]}
        elif kind == "error":
            raise _ErrorStep(step[1], step[2])
        elif kind == "mark":
            self.signals.mark(step[1]).set()
        elif kind == "wait":
            await self._interruptible(self.signals.gate(step[1]).wait())
        elif kind == "hang":
            await asyncio.Event().wait()
        elif kind == "flood":
            left = int(step[1])
            while left > 0:
                chunk = min(left, FLOOD_CHUNK)
                self._publish("stream", {"name": "stdout", "text": "x" * chunk}, msg)
                left -= chunk
                await asyncio.sleep(0)  # let the reader in, as a real kernel's pipe would
        elif kind == "die":
            raise _Died(int(step[1]), len(step) > 2 and step[2] == "memory")
        else:
            raise ValueError(f"unknown step {step!r}")

    async def _interruptible(self, waiting: Any) -> None:
        self._interrupt = asyncio.Event()
        task = asyncio.ensure_future(waiting)
        interrupted = asyncio.ensure_future(self._interrupt.wait())
        try:
            await asyncio.wait([task, interrupted], return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                raise _Interrupted
        finally:
            self._interrupt = None
            for future in (task, interrupted):
                future.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(task, interrupted, return_exceptions=True)

    def _evaluate(self, expressions: dict[str, Any]) -> dict[str, Any]:
        """ipykernel's user expressions: here only the gateway's `result`, within its cap."""
        evaluated: dict[str, Any] = {}
        for name, expression in expressions.items():
            if name != RESULT_EXPRESSION:
                evaluated[name] = {"status": "error", "ename": "NameError", "evalue": name}
                continue
            value = self.result
            cap = _CAP.search(str(expression))
            size = len(json.dumps(value["value"])) if "value" in value else 0
            if cap and size > int(cap[1]):  # only its size, as the kernel-side code does
                value = {"present": True, "name": value["name"], "size": size}
            data = {"application/json": value, "text/plain": repr(value)}
            evaluated[name] = {"status": "ok", "data": data, "metadata": {}}
        return evaluated


class _ErrorStep(Exception):
    def __init__(self, ename: str, evalue: str) -> None:
        self.ename = ename
        self.evalue = evalue
