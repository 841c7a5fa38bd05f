"""The gateway's ZMTP peer (gateway/execution/zmtp.py) and the kernel client over it, against
real libzmq sockets (pyzmq: what ipykernel and our bash kernel are) and, for what libzmq
never sends (a message trickled frame by frame, garbage), a raw unix socket speaking ZMTP
by hand: the protocol boundary, nothing of the gateway mocked."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio
from jupyter_client.session import Session

from gateway.budget import ByteBudget
from gateway.execution.kernel import KernelClient, Wire
from gateway.execution.zmtp import (
    MAX_FRAMES,
    Channel,
    Dropped,
    Meter,
    OverLimit,
    ZmtpError,
    open_channel,
)

pytestmark = pytest.mark.fast

MiB = 1024 * 1024
KEY = "a" * 64


class Peers:
    """The far ends a scenario starts (libzmq sockets, hand-written servers), all closed at
    its end, their handlers cancelled and awaited."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.context = zmq.asyncio.Context()
        self.sockets: list[zmq.asyncio.Socket] = []
        self.servers: list[asyncio.Server] = []
        self.handlers: set[asyncio.Task[Any]] = set()
        self.finished = asyncio.Event()  # hand-written peers hold their connection until then

    def libzmq(self, kind: int, name: str) -> zmq.asyncio.Socket:
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(f"ipc://{self.folder / name}")
        self.sockets.append(socket)
        return socket

    async def close(self) -> None:
        self.finished.set()
        for server in self.servers:
            server.close()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        for server in self.servers:
            await server.wait_closed()
        for socket in self.sockets:
            socket.close()
        self.context.term()


def run(scenario: Callable[[Peers], Awaitable[None]]) -> None:
    async def main(folder: Path) -> None:
        peers = Peers(folder)
        try:
            await scenario(peers)
        finally:
            await peers.close()

    with tempfile.TemporaryDirectory(prefix="zmtp-") as folder:
        asyncio.run(main(Path(folder)))


async def routed(router: zmq.asyncio.Socket) -> bytes:
    """The routing id of the first peer that sends the ROUTER something."""
    frames = await asyncio.wait_for(router.recv_multipart(), 5)
    return bytes(frames[0])


async def dealer_to_router(
    peers: Peers, budget: ByteBudget
) -> tuple[zmq.asyncio.Socket, Channel, bytes]:
    """A libzmq ROUTER on "shell", our DEALER to it (a bound of 1 MiB a message) that said
    hi, and the DEALER's routing id at the ROUTER."""
    router = peers.libzmq(zmq.ROUTER, "shell")
    dealer = await open_channel(str(peers.folder / "shell"), "DEALER", Meter(), budget, MiB, 1)
    dealer.send([b"hi"])
    return router, dealer, await routed(router)


# --- the channel against libzmq -----------------------------------------------------------


def test_dealer_and_sub_talk_to_libzmq_router_and_xpub() -> None:
    async def scenario(peers: Peers) -> None:
        folder = peers.folder
        router = peers.libzmq(zmq.ROUTER, "shell")
        xpub = peers.libzmq(zmq.XPUB, "iopub")
        budget = ByteBudget("test", 64 * MiB)
        meter = Meter()
        dealer = await open_channel(str(folder / "shell"), "DEALER", meter, budget, MiB, key=1)
        sub = await open_channel(str(folder / "iopub"), "SUB", meter, budget, MiB, key=1)
        dealer.send([b"hello", b"x" * 1000])  # one short and one long frame
        frames = await asyncio.wait_for(router.recv_multipart(), 5)
        assert frames[1:] == [b"hello", b"x" * 1000]
        await router.send_multipart([frames[0], b"reply", b"y" * 300])
        assert await asyncio.wait_for(dealer.receive(), 5) == [b"reply", b"y" * 300]
        # the SUB subscribed to everything: the XPUB hears it, then publishes to it
        assert await asyncio.wait_for(xpub.recv(), 5) == b"\x01"
        await xpub.send_multipart([b"topic", b"news"])
        assert await asyncio.wait_for(sub.receive(), 5) == [b"topic", b"news"]
        # every byte read is counted, framing included: two greetings, the frames' bodies
        # and their headers, at least
        assert meter.total >= 2 * 64 + len(b"reply" + b"y" * 300 + b"topic" + b"news") + 4 * 2
        dealer.release()
        sub.release()
        assert budget.used == 0
        for channel in (dealer, sub):
            channel.close()

    run(scenario)


def test_a_message_over_the_bound_is_dropped_and_the_next_one_arrives() -> None:
    async def scenario(peers: Peers) -> None:
        budget = ByteBudget("test", 64 * MiB)
        router, dealer, peer = await dealer_to_router(peers, budget)
        chunk = b"z" * (MiB // 2)
        await router.send_multipart([peer, *([chunk] * 10)])  # 5 MiB in one message
        await router.send_multipart([peer, b"small"])
        dropped = await asyncio.wait_for(dealer.receive(), 10)
        assert isinstance(dropped, Dropped)
        assert dropped.nbytes == 10 * len(chunk) and dropped.frames == 10
        assert budget.peak <= MiB  # never more than the bound was held
        assert await asyncio.wait_for(dealer.receive(), 5) == [b"small"]
        dealer.close()

    run(scenario)


def test_a_message_of_too_many_frames_is_dropped() -> None:
    async def scenario(peers: Peers) -> None:
        router, dealer, peer = await dealer_to_router(peers, ByteBudget("t", MiB))
        await router.send_multipart([peer, *([b"f"] * (MAX_FRAMES + 1))])
        await router.send_multipart([peer, b"next"])
        assert isinstance(await asyncio.wait_for(dealer.receive(), 5), Dropped)
        assert await asyncio.wait_for(dealer.receive(), 5) == [b"next"]
        dealer.close()

    run(scenario)


# --- a peer speaking ZMTP by hand ---------------------------------------------------------

PeerScript = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def hand_peer(peers: Peers, path: Path, script: PeerScript) -> None:
    """A unix socket server that does a NULL handshake as a ROUTER, then runs `script`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peers.handlers.add(task)
        greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
        writer.write(greeting + bytes(32))
        ready = b"\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER"
        writer.write(bytes([0x04, len(ready)]) + ready)
        await reader.readexactly(64)
        _flags, size = await reader.readexactly(2)
        await reader.readexactly(size)
        try:
            await script(reader, writer)
            await peers.finished.wait()
        except ConnectionError:
            pass  # the gateway's side closed first
        finally:
            writer.close()
            peers.handlers.discard(task)

    peers.servers.append(await asyncio.start_unix_server(serve, path=str(path)))


def frame(body: bytes, more: bool = False) -> bytes:
    flags = 0x01 if more else 0
    if len(body) > 255:
        return bytes([flags | 0x02]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


def test_nothing_past_the_ceiling_is_read() -> None:
    drained = asyncio.Event()

    async def two(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(b"a" * MiB))
        writer.write(frame(b"b" * (4 * MiB)))  # would pass the ceiling
        await writer.drain()  # completes only if the gateway's side reads it all
        drained.set()

    async def scenario(peers: Peers) -> None:
        await hand_peer(peers, peers.folder / "shell", two)
        meter = Meter()
        budget = ByteBudget("t", 64 * MiB)
        dealer = await open_channel(
            str(peers.folder / "shell"), "DEALER", meter, budget, 16 * MiB, 1
        )
        meter.limit_from_now(3 * MiB)
        assert await asyncio.wait_for(dealer.receive(), 5) == [b"a" * MiB]
        before = meter.total
        with pytest.raises(OverLimit):
            await asyncio.wait_for(dealer.receive(), 5)
        assert meter.exceeded and meter.total - before < 16  # a frame header, no body
        assert budget.peak <= MiB  # the 4 MiB frame never took room
        with pytest.raises(TimeoutError):  # the peer cannot write it all: it is not read
            await asyncio.wait_for(drained.wait(), 1)
        with pytest.raises(ZmtpError):  # and the channel reads no more
            await dealer.receive()
        dealer.close()

    run(scenario)


def test_a_message_that_never_ends_stops_at_the_ceiling() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunk = frame(b"m" * MiB, more=True)
        for _ in range(64):  # 64 MiB, and the last frame never comes
            writer.write(chunk)
            await writer.drain()

    async def scenario(peers: Peers) -> None:
        folder = peers.folder
        await hand_peer(peers, folder / "shell", endless)
        meter = Meter()
        budget = ByteBudget("t", 64 * MiB)
        dealer = await open_channel(str(folder / "shell"), "DEALER", meter, budget, 4 * MiB, 1)
        meter.limit_from_now(8 * MiB)
        with pytest.raises(OverLimit):
            await asyncio.wait_for(dealer.receive(), 10)
        assert meter.total <= 8 * MiB + 64  # read up to the ceiling, not a byte more
        assert budget.used == 0  # what was held of the message was given back
        dealer.close()

    run(scenario)


def test_garbage_and_commands_inside_a_message_break_only_that_channel() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(b"part", more=True) + bytes([0x04, 5]) + b"\x04PING")

    async def scenario(peers: Peers) -> None:
        folder = peers.folder
        await hand_peer(peers, folder / "shell", garbage)
        dealer = await open_channel(
            str(folder / "shell"), "DEALER", Meter(), ByteBudget("t", MiB), MiB, 1
        )
        with pytest.raises(ZmtpError):
            await asyncio.wait_for(dealer.receive(), 5)
        dealer.close()

    run(scenario)


def test_a_handshake_with_a_non_zmtp_peer_is_refused() -> None:
    async def scenario(peers: Peers) -> None:
        folder = peers.folder

        async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 400 Bad Request\r\n" + bytes(64))
            await writer.drain()
            writer.close()

        peers.servers.append(await asyncio.start_unix_server(http, path=str(folder / "shell")))
        with pytest.raises(ZmtpError):
            await open_channel(str(folder / "shell"), "DEALER", Meter(), ByteBudget("t", 1), 1, 1)

    run(scenario)


# --- the kernel client: signed messages, timeouts that keep the stream in step ---------------


def connection(prefix: Path) -> dict[str, Any]:
    return {
        "ip": str(prefix),
        "transport": "ipc",
        "shell_port": 1,
        "iopub_port": 2,
        "control_port": 4,
        "key": KEY,
        "signature_scheme": "hmac-sha256",
    }


async def quiet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A peer that says nothing after its handshake."""


async def hand_kernel(peers: Peers, shell: PeerScript) -> Path:
    """A kernel's sockets by hand, as `connection(prefix)` names them: `shell` runs on
    the shell socket, iopub and control stay quiet. Returns the prefix."""
    prefix = peers.folder / "k"
    await hand_peer(peers, Path(f"{prefix}-1"), shell)
    await hand_peer(peers, Path(f"{prefix}-2"), quiet)
    await hand_peer(peers, Path(f"{prefix}-4"), quiet)
    return prefix


def test_a_receive_that_times_out_mid_message_keeps_the_stream_in_step() -> None:
    """A message trickled frame by frame across several receive timeouts arrives whole."""
    session = Session(key=KEY.encode(), signature_scheme="hmac-sha256")
    reply = session.msg("execute_reply", {"status": "ok"})
    frames = session.serialize(reply)
    started = asyncio.Event()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started.set()
        for index, part in enumerate(frames):
            writer.write(frame(part, more=index < len(frames) - 1))
            await writer.drain()
            await asyncio.sleep(0.1)  # longer than the client's 0.03 s receive timeouts

    async def scenario(peers: Peers) -> None:
        prefix = await hand_kernel(peers, trickle)
        wire = Wire(max_message_bytes=MiB, budget=ByteBudget("t", MiB))
        client = KernelClient(connection(prefix), wire)
        await client.connect(5)
        await asyncio.wait_for(started.wait(), 5)
        timeouts = 0
        while True:
            try:
                msg = await client.shell(timeout=0.03)
                break
            except TimeoutError:
                timeouts += 1
        assert timeouts >= 3  # it did time out mid-message, several times
        assert msg["header"]["msg_type"] == "execute_reply"
        assert msg["content"] == {"status": "ok"}
        client.close()
        assert wire.open_channels == 0 and wire.budget.used == 0

    run(scenario)


def test_unsigned_messages_are_dropped_and_a_flood_past_the_ceiling_is_over_limit() -> None:
    session = Session(key=KEY.encode(), signature_scheme="hmac-sha256")
    forger = Session(key=b"b" * 64, signature_scheme="hmac-sha256")

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        bad = forger.serialize(forger.msg("execute_reply", {"status": "ok", "forged": True}))
        good = session.serialize(session.msg("execute_reply", {"status": "ok"}))
        for message in (bad, good):
            for index, part in enumerate(message):
                writer.write(frame(part, more=index < len(message) - 1))
        big = session.serialize(session.msg("stream", {"text": "x" * MiB}))
        for _ in range(20):  # a reply never comes: only ever more output
            for index, part in enumerate(big):
                writer.write(frame(part, more=index < len(big) - 1))
            await writer.drain()

    async def scenario(peers: Peers) -> None:
        prefix = await hand_kernel(peers, flood)
        client = KernelClient(connection(prefix), Wire(2 * MiB, ByteBudget("t", 8 * MiB)))
        await client.connect(5)
        first = await client.shell(timeout=5)
        assert first["content"] == {"status": "ok"}  # the forged one was dropped
        client.meter.limit_from_now(5 * MiB)
        with pytest.raises(OverLimit):
            while True:
                await client.shell(timeout=5)
        assert client.over_limit and client.received_bytes < 8 * MiB
        with pytest.raises(OverLimit):  # and so it stays
            await client.shell(timeout=1)
        client.close()

    run(scenario)
