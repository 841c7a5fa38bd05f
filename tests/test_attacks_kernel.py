"""A hostile kernel against the gateway's own memory (issue 20, row 1): one iopub message of a
hundred 8 MiB frames, and one whose last frame never comes. libzmq read a whole multipart
message into the gateway before anything saw it (`MAXMSGSIZE` bounds a frame, `RCVHWM`
counts messages), so the first took a gateway to gigabytes and the second held it there until
the run's deadline. Now a frame's size is read before its body, nothing past the run's output
limit is read at all, and the run is killed for `output_limit`.

Measured on a gateway in a process of its own (its resident memory is its alone), with
another client's `/v1/health` answered while the attack runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import GatewayProcess, watching

pytestmark = [pytest.mark.attack, pytest.mark.serial]  # times answers, measures memory

MiB = 1024 * 1024
FRAMES = 100  # of 8 MiB: 800 MiB in one message, far past the 64 MiB output limit

# User code that reaches the kernel's own iopub socket and sends one message of FRAMES
# frames of one reused 8 MiB buffer (the kernel's memory limit does not stop it), from the
# iopub thread, as ipykernel itself sends.
MANY_FRAMES = f"""
import time, zmq
thread = get_ipython().kernel.iopub_thread
chunk = bytearray(8 * 1024 * 1024)
def flood():
    socket = thread.socket
    socket.send(b"", zmq.SNDMORE)
    for _ in range({FRAMES}):
        socket.send(chunk, zmq.SNDMORE, copy=False)
    socket.send(b"end")
thread.schedule(flood)
time.sleep(3600)
"""
# libzmq keeps an unfinished message in the sender, so a message that never ends needs raw
# writes: user code finds the descriptor of the gateway's iopub connection (a unix socket
# named after the iopub port, `...-2`) and writes ZMTP frames that all say "more follows".
NEVER_ENDS = f"""
import os, socket, time
for name in os.listdir("/proc/self/fd"):
    try:
        conn = socket.socket(fileno=os.dup(int(name)))
    except OSError:
        continue
    try:
        if conn.family == socket.AF_UNIX and str(conn.getsockname()).endswith("-2"):
            conn.getpeername()  # an accepted connection, not the listening socket
            break
    except OSError:
        pass
    conn.close()
conn.setblocking(True)  # libzmq made it non-blocking
chunk = bytes(8 * 1024 * 1024)
more = bytes([0x03]) + len(chunk).to_bytes(8, "big")  # MORE | LONG, 8 MiB
for _ in range({FRAMES}):
    conn.sendall(more + chunk)
time.sleep(3600)
"""


@pytest.fixture
def gateway_process(backend_name: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    server = GatewayProcess(backend_name, tmp_path)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.parametrize("code", [MANY_FRAMES, NEVER_ENDS], ids=["many-frames", "never-ends"])
def test_a_message_of_many_large_frames_is_never_held(
    gateway_process: GatewayProcess, code: str
) -> None:
    client = gateway_process.client
    assert client.run(code="print('warm')")["status"] == "succeeded"
    with watching(gateway_process.pid, gateway_process.port) as watch:
        record = client.run(code=code, timeout=120)
    assert record["status"] == "killed", record["notes"]
    assert record["kill_reason"] == "output_limit"
    # one message's bound (18 MiB) and the reading buffers, not the 800 MiB sent
    assert watch.growth < 96 * MiB, watch.report()
    assert watch.worst_health < 1.0 and not watch.failures, watch.report()
    assert client.run(code="print('after')")["stdout"] == "after\n"
