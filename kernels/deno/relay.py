"""Deno's Jupyter kernel behind the gateway's five ipc sockets.

`deno jupyter --kernel` speaks ZMQ over TCP only (an `ipc` connection file makes it exit
before `kernel_info`), while the gateway reaches every sandbox through unix sockets in a
folder it mounts (DESIGN.md decision 3: the sandbox has no network the host can reach).
So, inside the sandbox, this relay:

1. reads the gateway's ipc connection file and picks five free ports on 127.0.0.1 of the
   sandbox's own network namespace (nothing outside the sandbox can reach them);
2. starts Deno with a TCP connection file for those ports (same key), in a private
   temporary folder, removed once Deno listens;
3. waits until Deno listens on all five (`/proc/net/tcp`, no connection is made), and only
   then binds the five unix sockets the gateway waits for: a socket file that exists is a
   kernel that answers. The gateway then takes the socket folder away (`sockets.py`);
   bound sockets keep accepting;
4. forwards every connection the gateway opens to Deno's port of that channel, byte for
   byte (ZMTP frames the same way over unix and TCP sockets: nothing is parsed);
5. exits with Deno's exit status (a signal is raised again), so `Deno.exit(n)` is the
   sandbox's exit status too.

Standard library only: it runs in the kernel image's Python, as the sandbox user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

CHANNELS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
LOOPBACK = "127.0.0.1"
LISTEN_POLL = 0.01  # seconds between looks at /proc/net/tcp while Deno starts
CHUNK = 65536
_TCP_LISTEN = "0A"


def deno_binary() -> str:
    """The `deno` next to this Python (the `deno` wheel installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "deno"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("deno")
    if found is None:
        raise SystemExit("kernels.deno: no `deno` binary next to Python or on PATH")
    return found


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on the loopback now (nothing else in the sandbox runs
    before the kernel, so nothing takes them before Deno binds them)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def listening_ports() -> set[int]:
    """Ports on 127.0.0.1 in LISTEN state in this network namespace."""
    ports: set[int] = set()
    with contextlib.suppress(OSError), open("/proc/net/tcp", encoding="ascii") as table:
        next(table, None)
        for line in table:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _TCP_LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            if address == "0100007F":
                ports.add(int(port, 16))
    return ports


def deno_environment() -> dict[str, str]:
    env = dict(os.environ)
    home = env.get("HOME") or tempfile.gettempdir()
    env.setdefault("DENO_DIR", os.path.join(home, ".deno"))
    env["NO_COLOR"] = "1"
    env["DENO_NO_UPDATE_CHECK"] = "1"
    env["DENO_NO_PROMPT"] = "1"
    return env


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


def _forwarder(port: int) -> Any:
    async def forward(unix_reader: asyncio.StreamReader, unix_writer: asyncio.StreamWriter) -> None:
        try:
            tcp_reader, tcp_writer = await asyncio.open_connection(LOOPBACK, port)
        except OSError:
            unix_writer.close()
            return
        try:
            await asyncio.gather(_pump(unix_reader, tcp_writer), _pump(tcp_reader, unix_writer))
        except asyncio.CancelledError:
            # Deno exited and the relay is ending: asyncio's unix server would log a
            # cancelled connection handler as an error in the kernel's log
            pass
        finally:
            tcp_writer.close()
            unix_writer.close()

    return forward


class Relay:
    """Deno and the five unix sockets in front of it."""

    def __init__(self, connection_file: str) -> None:
        with open(connection_file, encoding="utf-8") as f:
            self.info: dict[str, Any] = json.load(f)
        if self.info.get("transport") != "ipc":
            raise SystemExit("kernels.deno: the gateway's connection file must use ipc")
        self.ports = dict(zip(CHANNELS, free_ports(len(CHANNELS)), strict=True))
        self.process: asyncio.subprocess.Process | None = None

    def _deno_connection(self, folder: str) -> str:
        info = {**self.info, **self.ports, "transport": "tcp", "ip": LOOPBACK}
        path = os.path.join(folder, "connection.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(info, f)
        return path

    async def run(self) -> int:
        folder = tempfile.mkdtemp(prefix="deno-kernel-")
        try:
            connection = self._deno_connection(folder)
            self.process = await asyncio.create_subprocess_exec(
                deno_binary(),
                "jupyter",
                "--kernel",
                "--conn",
                connection,
                stdin=asyncio.subprocess.DEVNULL,
                env=deno_environment(),
            )
            if not await self._until_listening():
                return await self.process.wait()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        servers = [
            await asyncio.start_unix_server(
                _forwarder(self.ports[channel]), path=f"{self.info['ip']}-{self.info[channel]}"
            )
            for channel in CHANNELS
        ]
        try:
            return await self.process.wait()
        finally:
            for server in servers:
                server.close()

    async def _until_listening(self) -> bool:
        """True once Deno listens on every port; False if it exited first."""
        assert self.process is not None
        wanted = set(self.ports.values())
        while not wanted <= listening_ports():
            if self.process.returncode is not None:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), LISTEN_POLL)
        return True


def exit_like(status: int) -> int:
    """Exit the way Deno did: with its code, or by the signal that ended it."""
    if status >= 0:
        return status
    signum = -status
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum  # if the signal did not end us


def main(connection_file: str) -> int:
    # interrupts are for the kernel (Deno ignores them: the gateway kills at the deadline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = asyncio.run(Relay(connection_file).run())
    return exit_like(status)
