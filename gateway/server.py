"""The gateway's lifecycle: build every service from the settings, listen, drain, stop.

This is the composition root: the one place (with `gateway.configure`) that sees the whole
`Settings`. Each part gets a frozen config of the settings it reads, built here once
(`gateway.config.config_from`) and passed down; a backend gets its own from the factory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import tornado.netutil

from gateway.app import make_app
from gateway.auth import TokenTable, is_loopback_host
from gateway.budget import ByteBudget, CpuBudget
from gateway.config import config_from
from gateway.execution.kernel import Wire
from gateway.handlers.base import Services
from gateway.handlers.config import FrontDoorConfig
from gateway.http_server import GatewayHTTPServer
from gateway.instance import instance_id, private_paths
from gateway.metrics import Metrics
from gateway.runs.config import RunServiceConfig
from gateway.runs.leases import Heartbeat
from gateway.runs.service import RunService
from gateway.sandbox.base import BackendContext, SandboxBackend
from gateway.sandbox.factory import make_backend
from gateway.settings import Settings
from gateway.store.base import RecordStore
from gateway.store.config import StoreConfig
from gateway.store.factory import make_store
from gateway.store.instance import FileLock, machine_lock
from gateway.uploads.config import UploadsConfig
from gateway.uploads.service import UploadService

log = logging.getLogger("gateway")


class Gateway:
    """One running gateway. `await start()`, then `await stop()`; tests do the same."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tokens = TokenTable.load(settings.tokens, settings.metrics_token_file)
        if not self.tokens.enabled and not is_loopback_host(settings.host):
            raise RuntimeError(
                f"No --tokens file is configured, so the gateway runs single-user and only "
                f"binds to loopback; refusing to listen on {settings.host}."
            )
        self.port = settings.port
        self.backend_reason = ""
        self._server: GatewayHTTPServer | None = None
        self._sockets: list[socket.socket] = []
        self._expiry: asyncio.Task[None] | None = None
        self._instance: FileLock | None = None  # this machine's lock on the instance id
        self._heartbeat: Heartbeat | None = None
        # set when the gateway must stop on its own (its instance id was taken); `serve`
        # waits for it as for SIGTERM
        self.must_stop = asyncio.Event()
        self.stop_reason: str | None = None
        self.services: Services | None = None
        self.backend: SandboxBackend | None = None
        self.store: RecordStore | None = None
        self.wire: Wire | None = None
        self._stopped = False

    async def start(self) -> None:
        """Start every service; if any step fails, what was started is stopped again."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        settings = self.settings
        values = settings.model_dump()  # each part's config takes its settings by name
        store_config = config_from(StoreConfig, values)
        runs_config = config_from(RunServiceConfig, values)
        sockets = tornado.netutil.bind_sockets(
            settings.port, settings.host, family=socket.AF_UNSPEC
        )  # first: a port in use fails before anything else was started
        self._sockets = sockets  # closed by stop() until the HTTP server owns them
        self.port = sockets[0].getsockname()[1]
        # The instance id first (gateway/store/instance.py): the backend's start removes
        # what a crashed gateway of this id left, and recover() fails its runs, which must
        # never be a live process's.
        ident = instance_id(settings.instance_id, settings.data_dir)
        self._instance = machine_lock(ident, settings.data_dir)
        self.store = make_store(store_config, ident)
        await self.store.open()  # SQLite: its file's lock
        link = self.store.lease_link()
        if link is not None:  # a shared store: the heartbeat's connection holds the id
            self._heartbeat = Heartbeat(link, settings.lease_seconds, self._instance_taken)
            await self._heartbeat.start()
        backend, self.backend_reason = await make_backend(
            values,
            BackendContext(
                instance_id=ident,
                multi_user=self.tokens.multi_user,
                private_paths=private_paths(
                    settings.data_dir,
                    settings.workspaces,
                    (settings.tokens, settings.metrics_token_file),
                    settings.store,
                ),
            ),
        )
        log.info("%s", self.backend_reason)
        if not self.tokens.enabled:
            log.warning("no --tokens file: single-user mode, listening on loopback only")
        self.backend = backend
        await backend.startup()
        _check_cpu_budgets(runs_config.cpu_budget(), self.tokens.budgets, backend)
        failed = await self.store.recover(
            "The gateway stopped while this run was in progress; its result is lost."
        )
        if failed:
            log.warning("marked %d runs left unfinished by the previous gateway as failed", failed)
        # A kernel's messages are hostile input: each is at most `max_kernel_message` (a
        # larger one is dropped unread), and at most `kernel_bytes_in_flight` of all kernels'
        # messages are in the gateway at once; past that, reading waits and the backlog
        # stays in the kernels' own send queues, inside their sandboxes (execution/zmtp.py).
        self.wire = Wire(
            max_message_bytes=runs_config.execution.max_kernel_message(),
            budget=ByteBudget("kernel messages", settings.kernel_bytes_in_flight),
        )
        metrics = Metrics()
        uploads = UploadService(
            config_from(UploadsConfig, values), self.store.upload_shelf(store_config)
        )
        runs = RunService(
            runs_config, backend, self.store, self.wire, metrics, uploads, self.tokens.budgets
        )
        if self._heartbeat is not None:
            self._heartbeat.attach(runs)
        self.services = Services(
            config_from(FrontDoorConfig, values), runs, self.tokens, backend, metrics, uploads
        )
        runs.bodies = self.services.bodies  # what a run claimed from the store's queue holds
        runs.start()
        self._server = GatewayHTTPServer(
            make_app(self.services),
            max_body_size=settings.max_body_bytes * 4,
            idle_connection_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            max_connections=settings.max_connections,
        )
        server = self._server
        services = self.services
        metrics.gauge(
            "gateway_http_connections", "Open HTTP connections.", lambda: server.open_connections
        )
        metrics.gauge(
            "gateway_streams_open",
            "Open WebSocket connections.",
            lambda: len(services.open_streams),
        )
        metrics.gauge(
            "gateway_body_bytes_in_flight",
            "Bytes of request bodies and WebSocket messages being received.",
            lambda: services.bodies.used,
        )
        metrics.gauge(
            "gateway_answer_bytes_in_flight",
            "Bytes of large answers being sent.",
            lambda: services.answers.used,
        )
        self._server.add_sockets(sockets)
        self._sockets = []
        self._expiry = asyncio.create_task(self._expire_records())
        log.info("listening on http://%s:%d", settings.host, self.port)

    def _instance_taken(self, message: str) -> None:
        self.stop_reason = message
        self.must_stop.set()

    async def _expire_records(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                assert self.store is not None and self.services is not None
                await self.store.expire(self.settings.record_ttl)
                if self.services.uploads is not None:  # those of users who upload no more
                    await self.services.uploads.shelf.expire()
            await asyncio.sleep(min(3600.0, max(1.0, self.settings.record_ttl / 10)))

    async def stop(self) -> None:
        """Drain: stop listening, let runs finish (bounded), destroy every sandbox, close.
        Safe on a gateway that started only partly, and a second time (a start that failed
        stops what it started, and its owner may stop it again): the second does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self._server is not None:
            self._server.stop()
        for sock in self._sockets:
            sock.close()
        self._sockets = []
        if self.services is not None:
            await self.services.runs.drain()
            for stream in list(self.services.open_streams):
                stream.close(1001, "The gateway is shutting down.")
        if self.backend is not None:
            await self.backend.shutdown()
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._heartbeat is not None:  # after the drain: leases held until runs ended
            await self._heartbeat.stop()
        if self._server is not None:
            await self._server.close_all_connections()
        if self.store is not None:
            await self.store.close()
        if self._instance is not None:  # last: the backend removed this id's sandboxes
            self._instance.release()
            self._instance = None


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then drain and exit."""
    gateway = Gateway(settings)
    await gateway.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, gateway.must_stop.set)
    await gateway.must_stop.wait()
    log.info("draining: waiting for running runs, then destroying every sandbox")
    await gateway.stop()
    log.info("stopped")
    if gateway.stop_reason is not None:
        raise RuntimeError(gateway.stop_reason)


@contextlib.asynccontextmanager
async def private_gateway(
    settings: Settings, user: str, data_dir: Path | None = None
) -> AsyncIterator[tuple[str, str]]:
    """A gateway for this process alone (`gateway mcp` without `--url`): on 127.0.0.1, a
    free port, one random token for `user`, its data in `data_dir` or a temporary folder.
    Yields `(url, token)`; on exit its runs are cancelled at once (nobody waits for their
    results) and every sandbox is destroyed."""
    with tempfile.TemporaryDirectory(prefix="gateway-private-") as tmp:
        folder = Path(tmp)
        token = secrets.token_urlsafe(32)
        tokens = folder / "tokens.json"
        await asyncio.to_thread(_write_tokens, tokens, token, user)
        private = settings.model_copy(
            update={
                "host": "127.0.0.1",
                "port": 0,
                "tokens": tokens,
                "data_dir": data_dir or folder / "data",
                "drain_timeout": 0.0,
            }
        )
        gateway = Gateway(private)
        await gateway.start()
        try:
            yield f"http://127.0.0.1:{gateway.port}", token
        finally:
            await gateway.stop()


def _write_tokens(path: Path, token: str, user: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        json.dump({token: {"user": user, "role": "user"}}, file)


def _check_cpu_budgets(
    default: CpuBudget, per_user: Mapping[str, CpuBudget], backend: SandboxBackend
) -> None:
    """A CPU budget the backend cannot meter would be a promise nothing keeps: refused."""
    budgets = [default, *per_user.values()]
    if backend.meters_cpu or not any(
        b.cpu_seconds_per_hour or b.cpu_seconds_per_day for b in budgets
    ):
        return
    raise RuntimeError(
        f"CPU-second budgets are set (--cpu-seconds-per-hour/-day or the tokens file), but "
        f"the {backend.name} backend cannot tell its sandboxes' CPU here (the local backend "
        "without a cgroup: run the gateway as root on cgroup v2; Docker: the engine's "
        "cgroupfs driver), so nothing would hold them: refusing to start."
    )
