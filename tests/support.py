"""Test support: a real gateway on a free port in a thread of its own, a small HTTP client,
and the leak census that every test must pass."""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from email.message import Message
from pathlib import Path
from typing import Any

from gateway import settings as settings_module
from gateway.server import Gateway

REPO = Path(__file__).resolve().parent.parent
# The kernel image the tests use: scripts/test.sh sets it to the tag docker/build.sh built,
# so that the tests never run against a stale `latest` of another checkout.
DOCKER_IMAGE = os.environ.get("GATEWAY_DOCKER_IMAGE", "gateway-kernel:latest")

# Instance ids of the gateways this test process started: the leak census looks only at
# their sandboxes, so that test runs of other checkouts on the same machine do not count.
INSTANCES: set[str] = set()


def new_instance_id() -> str:
    ident = "t" + secrets.token_hex(7)
    INSTANCES.add(ident)
    return ident


@dataclasses.dataclass
class Response:
    status: int
    headers: Message  # case-insensitive, like HTTP header names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """A blocking HTTP client for one gateway (tests run it from the main thread)."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.port = port
        self.token = token

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        all_headers = {"Content-Type": "application/json"}
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        all_headers.update(headers or {})
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        try:
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            return Response(response.status, response.headers, response.read())
        finally:
            conn.close()

    def run(self, **body: Any) -> dict[str, Any]:
        """POST /v1/runs and return the run record, asserting a 200."""
        response = self.request("POST", "/v1/runs", body)
        assert response.status == 200, response.body[:2000]
        record: dict[str, Any] = response.json()
        return record


class GatewayThread:
    """A real `Gateway` serving on 127.0.0.1:<free port> from its own event loop thread."""

    def __init__(self, **overrides: Any) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="gwtest-"))
        overrides.setdefault("data_dir", self.tmp / "data")
        overrides.setdefault("port", 0)
        overrides.setdefault("host", "127.0.0.1")
        overrides.setdefault("kernel_start_timeout", 60.0)
        overrides.setdefault("instance_id", new_instance_id())
        overrides.setdefault("docker_image", DOCKER_IMAGE)
        # tests of several users on the local backend acknowledge its weaker isolation
        overrides.setdefault("allow_local_multi_user", overrides.get("backend") == "local")
        INSTANCES.add(overrides["instance_id"])
        try:
            self.settings = settings_module.load(environ={}, overrides=overrides)
            self.gateway = Gateway(self.settings)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro: Any, timeout: float = 600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> GatewayThread:
        self.thread.start()
        try:
            self.call(self.gateway.start())
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def port(self) -> int:
        return self.gateway.port

    @property
    def backend_name(self) -> str:
        assert self.gateway.services is not None
        return self.gateway.services.backend.name

    def client(self, token: str | None = None) -> Client:
        return Client(self.port, token)

    def idle(self) -> bool:
        assert self.gateway.services is not None
        return not self.gateway.services.runs.active

    def stop(self) -> None:
        try:
            self.call(self.gateway.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


# --- leak census --------------------------------------------------------------------------


def _prefixes() -> tuple[str, ...]:
    return tuple(f"gw{ident[:6]}-" for ident in INSTANCES)


def sandbox_processes() -> list[str]:
    """Processes of our sandboxes (they carry GATEWAY_SANDBOX=<folder> in their environment)."""
    needles = [f"GATEWAY_SANDBOX={p}".encode() for p in _prefixes()]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if any(n in environ for n in needles):
                found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


def sandbox_folders() -> list[str]:
    tmp = Path(tempfile.gettempdir())
    return sorted(str(p) for prefix in _prefixes() for p in tmp.glob(prefix + "*"))


def sandbox_cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    names = [f"gateway-{p}" for p in _prefixes()]
    return sorted(
        str(p) for name in names for p in [*root.glob(f"*/{name}*"), *root.glob(f"{name}*")]
    )


def docker_leftovers() -> list[str]:
    if shutil.which("docker") is None or not INSTANCES:
        return []
    found = []
    for ident in INSTANCES:
        label = f"label=gateway.instance={ident}"
        try:
            containers = subprocess.run(
                ["docker", "ps", "-aq", "--filter", label],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.split()
            volumes = subprocess.run(
                ["docker", "volume", "ls", "-q", "--filter", label],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        found += [f"container {c}" for c in containers] + [f"volume {v}" for v in volumes]
    return found


def census() -> list[str]:
    return sandbox_processes() + sandbox_folders() + sandbox_cgroups() + docker_leftovers()


def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.1) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# --- a gateway as a separate process (for crash and signal tests) ---------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    """`python -m gateway serve` in a process of its own, for crash and signal tests."""

    def __init__(self, backend: str, data_dir: Path) -> None:
        self.backend = backend
        self.data_dir = data_dir
        self.instance = new_instance_id()
        self.port = free_port()
        self.client = Client(self.port)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayProcess:
        command = [sys.executable, "-m", "gateway", "serve", "--backend", self.backend]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        command += ["--instance-id", self.instance]
        with (self.data_dir / "gateway.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        assert wait_for(lambda: answers(self.client), timeout=60), self.log()
        return self

    def signal(self, signum: int, timeout: float = 60) -> int:
        assert self.process is not None
        self.process.send_signal(signum)
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGTERM)

    def log(self) -> str:
        return (self.data_dir / "gateway.log").read_text(errors="replace")[-3000:]


def answers(client: Client) -> bool:
    try:
        return client.request("GET", "/v1/health", timeout=2).status == 200
    except OSError:
        return False
