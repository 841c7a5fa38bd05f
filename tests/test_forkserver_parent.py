"""The gateway's side of the forkserver's protocol (gateway/sandbox/forkserver/parent.py),
against a scripted parent at the socket: the messages a warm parent may send, in the orders
it may send them. The real parent is tested with real kernels (test_attacks_forkserver.py
and the suite on the forkserver backend)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from gateway.sandbox.forkserver.parent import Parent

# A parent that answers one spawn and at once tells that kernel's end: both messages may be
# read by the gateway before `spawn` has taken the answer.
QUICK_DEATH = r"""
import json, os, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
socket.send_fds(sock, [json.dumps({"ready": os.getpid()}).encode()], [])
data, fds, _, _ = socket.recv_fds(sock, 65536, 16)
request = json.loads(data)
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]  # work, sockets, pidfd
socket.send_fds(sock, [json.dumps({"id": request["id"], "pid": 4242}).encode()], held)
socket.send_fds(sock, [json.dumps({"exit": 4242, "status": 7}).encode()], [])
sock.recv(1)  # until the gateway closes its end
"""


class Scripted(Parent):
    def command(self, fd: int, program: int, seccomp: int) -> list[str]:
        return [sys.executable, "-c", QUICK_DEATH, str(fd)]


def test_a_kernel_that_ends_before_its_spawn_returns_still_tells_its_status(
    tmp_path: Path,
) -> None:
    async def scenario() -> int | None:
        for name in ("p", "f"):  # the program and the filter, which the parent is handed
            (tmp_path / name).write_bytes(b"")
        parent = Scripted("bash", tmp_path, tmp_path / "p", tmp_path / "f", (), tmp_path / "log")
        try:
            pid, handed, exited = await parent.spawn([])
            for fd in handed:
                os.close(fd)
            assert pid == 4242 and len(handed) == 3
            return await asyncio.wait_for(exited, 10)
        finally:
            await parent.close()

    assert asyncio.run(scenario()) == 7
