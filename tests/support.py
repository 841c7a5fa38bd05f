"""Test support: a real gateway on a free port in a thread of its own (or in a process of its
own), a small HTTP client, and waiting for a condition. The leak census is in census.py."""

from __future__ import annotations

import asyncio
import contextlib
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
import time
from collections.abc import Iterator, Mapping
from email.message import Message
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil

from gateway import settings as settings_module
from gateway.config import config_from
from gateway.sandbox.base import Footprint
from gateway.server import Gateway
from tests import census

REPO = Path(__file__).resolve().parent.parent
# The kernel image the tests use: scripts/test.sh sets it to the tag docker/build.sh built,
# so that the tests never run against a stale `latest` of another checkout.
DOCKER_IMAGE = os.environ.get("GATEWAY_DOCKER_IMAGE", "gateway-kernel:latest")


C = TypeVar("C")


def part_config(
    kind: type[C], settings: settings_module.Settings | None = None, **overrides: Any
) -> C:
    """A part's config (`gateway.config`) as the server builds it: from `settings`, or
    from the defaults with `overrides` (settings by name)."""
    if settings is None:
        settings = settings_module.load(environ={}, overrides=overrides)
    return config_from(kind, settings.model_dump())


def new_instance_id(backend: str = "local") -> str:
    """A fresh instance id that the leak census watches (with Docker's for `docker`)."""
    ident = "t" + secrets.token_hex(7)
    census.INSTANCES.add(ident)
    if backend == "docker":
        census.DOCKER_INSTANCES.add(ident)
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


def write_tokens(folder: Path, users: Mapping[str, tuple[str, str]]) -> Path:
    """A token file `{token: {"user", "role"}}` in `folder`, from `{token: (user, role)}`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokens.json"
    table = {token: {"user": user, "role": role} for token, (user, role) in users.items()}
    path.write_text(json.dumps(table))
    return path


# False while a test of the fast tier runs (tests/conftest.py): it may start no gateway of a
# real backend, so that the tier stays seconds long.
REAL_BACKENDS = {"allowed": True}


def allow_backend(backend: object) -> None:
    if not REAL_BACKENDS["allowed"] and backend != "fake":
        raise RuntimeError(
            f"a test marked `fast` started a gateway of the {backend} backend: mark it not "
            "fast, or run it on the fake backend"
        )


class GatewayThread:
    """A real `Gateway` serving on 127.0.0.1:<free port> from its own event loop thread."""

    def __init__(
        self, users: Mapping[str, tuple[str, str]] | None = None, **overrides: Any
    ) -> None:
        """`overrides` are settings; `users` ({token: (user, role)}) become its token file."""
        allow_backend(overrides.get("backend", "auto"))
        self.tmp = Path(tempfile.mkdtemp(prefix="gwtest-"))
        if users is not None:
            overrides["tokens"] = write_tokens(self.tmp / "tokens", users)
        overrides.setdefault("data_dir", self.tmp / "data")
        overrides.setdefault("port", 0)
        overrides.setdefault("host", "127.0.0.1")
        overrides.setdefault("kernel_start_timeout", 60.0)
        overrides.setdefault("instance_id", new_instance_id(str(overrides.get("backend"))))
        overrides.setdefault("docker_image", DOCKER_IMAGE)
        # tests of several users on the local backend acknowledge its weaker isolation
        overrides.setdefault("allow_local_multi_user", overrides.get("backend") == "local")
        census.INSTANCES.add(overrides["instance_id"])
        if overrides.get("backend") == "docker":
            census.DOCKER_INSTANCES.add(overrides["instance_id"])
        try:
            self.settings = settings_module.load(environ={}, overrides=overrides)
            self.workspace_root = self.settings.workspaces
            if self.workspace_root is not None:
                census.WORKSPACE_ROOTS.add(self.workspace_root)
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
        if self.backend_name == "docker":  # "auto" may have chosen it
            census.DOCKER_INSTANCES.add(self.settings.instance_id or "")
        census.LIVE_GATEWAYS.add(self)
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
        """No run is active, nothing is being destroyed, no pooled kernel is starting."""
        assert self.gateway.services is not None
        return self.gateway.services.runs.settled

    def resident(self) -> Any:
        """What the backend itself holds while it runs (gateway.sandbox.base.Footprint: the
        forkserver's warm parents and state folder), beside its sandboxes."""
        services = self.gateway.services
        return Footprint() if services is None else services.backend.footprint()

    def stop(self) -> None:
        census.LIVE_GATEWAYS.discard(self)
        try:
            self.call(self.gateway.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


def forget_snapshots(server: GatewayThread) -> None:
    """Every snapshot of `server` ends: none outlives its test (the leak census)."""
    services = server.gateway.services
    assert services is not None
    server.call(services.runs.snapshots.clear("the test ended"))


class Stoppable(Protocol):
    def stop(self) -> None: ...


StoppableT = TypeVar("StoppableT", bound=Stoppable)


def serving(server: StoppableT) -> Iterator[StoppableT]:
    """A fixture's `yield from serving(started)`: hand the started gateway (or server) to
    the tests, and stop it after them, however they ended."""
    try:
        yield server
    finally:
        server.stop()


def wrote(server: GatewayThread, name: str) -> bool:
    """Whether code in one of `server`'s sandboxes has written `name` in its working folder,
    seen from the host: each sandbox's folder holds that working folder as `work/` (local and
    Docker); a forked kernel's is `/workspace` in its root (`/proc/<pid>/root`). An event a
    test can wait for instead of a sleep: the code has got that far."""
    instance = server.settings.instance_id or ""
    places = [f / "work" for f in census.folders_of(instance)]
    places += [root / "workspace" for root in census.forked_roots(instance)]
    return any((place / name).exists() for place in places)


def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.1) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (its last answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# --- a gateway as a separate process (for crash and signal tests) ---------------------------


def free_port() -> int:
    """A port nothing listens on now (for a gateway of its own, or an unreachable address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    """`python -m gateway serve` in a process of its own, for crash and signal tests and for
    measuring the gateway alone. Extra settings become flags (`stream_cap_bytes=1000` ->
    `--stream-cap-bytes 1000`). The process is the harness's own while it runs (the leak
    census does not count it); what it leaves behind when it ends does count."""

    def __init__(self, backend: str, data_dir: Path, **settings: Any) -> None:
        self.backend = backend
        self.data_dir = data_dir
        self.instance = new_instance_id(backend)
        self.port = free_port()
        self.client = Client(self.port)
        # no warm pools unless asked: the census cannot see into another process's pools
        self.settings = {"pool_python": 0, "pool_bash": 0, "pool_deno": 0, "pool_r": 0, **settings}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> GatewayProcess:
        allow_backend(self.backend)
        command = [sys.executable, "-m", "gateway", "serve", "--backend", self.backend]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        command += ["--instance-id", self.instance, "--docker-image", DOCKER_IMAGE]
        for name, value in self.settings.items():
            command.append("--" + name.replace("_", "-"))
            if value is not True:
                command.append(str(value))
        with (self.data_dir / "gateway.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        census.own(self.process.pid, f"the gateway process on port {self.port}")
        census.PROCESS_INSTANCES[self.instance] = self.process
        assert wait_for(lambda: answers(self.client), timeout=60), self.log()
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

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


@dataclasses.dataclass
class Watch:
    """What a gateway process did while a block ran (`watching`): the peak of its resident
    memory above the baseline, and how long `GET /v1/health` (and another path, `also`)
    took for another client."""

    baseline: int
    peak: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)
    also_latencies: list[float] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def growth(self) -> int:
        """Bytes of resident memory above the baseline, at the peak."""
        return self.peak - self.baseline

    @property
    def worst_health(self) -> float:
        return max(self.latencies, default=0.0)

    @property
    def worst_also(self) -> float:
        return max(self.also_latencies, default=0.0)

    def report(self) -> str:
        mib = 1024 * 1024
        return (
            f"RSS {self.baseline / mib:.0f} MiB -> peak {self.peak / mib:.0f} MiB "
            f"(+{self.growth / mib:.0f} MiB); another user's health: worst "
            f"{self.worst_health:.2f} s over {len(self.latencies)} probes"
            + (
                f", their own GET: worst {self.worst_also:.2f} s over {len(self.also_latencies)}"
                if self.also_latencies
                else ""
            )
            + f"; {self.failures[:3]}"
        )


@contextlib.contextmanager
def watching(
    pid: int,
    port: int | None = None,
    token: str | None = None,
    min_probes: int = 0,
    also: str | None = None,
) -> Iterator[Watch]:
    """Sample the process's resident memory every 20 ms (the current RSS, which falls again,
    unlike ru_maxrss) and, given a port, time `GET /v1/health` (with `token`) every 100 ms
    while the block runs, and `GET also` after each (e.g. the other user's own record). With
    `min_probes`, the block's end waits (bounded) until that many probes answered or failed:
    the attack the block started still holds during them."""
    process = psutil.Process(pid)
    watch = Watch(baseline=process.memory_info().rss)
    watch.peak = watch.baseline
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            with contextlib.suppress(psutil.Error):
                watch.peak = max(watch.peak, process.memory_info().rss)

    probes = [("/v1/health", watch.latencies)]
    if also is not None:
        probes.append((also, watch.also_latencies))

    def probe(client: Client) -> None:
        while not stop.wait(0.1):
            for path, latencies in probes:
                started = time.monotonic()
                try:
                    status = client.request("GET", path, timeout=120).status
                except OSError as exc:
                    watch.failures.append(repr(exc))
                    break
                latencies.append(time.monotonic() - started)
                if status != 200:
                    watch.failures.append(f"GET {path}: {status}")

    threads = [threading.Thread(target=sample, daemon=True)]
    if port is not None:
        threads.append(threading.Thread(target=probe, args=(Client(port, token),), daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield watch
        deadline = time.monotonic() + 150
        while len(watch.latencies) + len(watch.failures) < min_probes:
            assert time.monotonic() < deadline, watch.report()
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(150)
        with contextlib.suppress(psutil.Error):
            watch.peak = max(watch.peak, process.memory_info().rss)
