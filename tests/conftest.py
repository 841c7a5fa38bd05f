"""Fixtures: a real gateway per backend (the behavioural suite runs on both), one local gateway
for tests that never reach a sandbox, and after every test a leak census (census.py) that no
sandbox process, folder, cgroup or container may pass. See tests/README.md."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.extras import missing
from tests import census, needs
from tests.openapi_support import FUZZ_TOKEN
from tests.postgres import Server
from tests.support import DOCKER_IMAGE, REAL_BACKENDS, Client, GatewayThread, serving, wait_for

# GATEWAY_TEST_BACKENDS (comma-separated) narrows them, e.g. to run one file on forkserver
ALL_BACKENDS = ("local", "docker", "forkserver")
BACKENDS = tuple(
    name
    for name in ALL_BACKENDS
    if name in os.environ.get("GATEWAY_TEST_BACKENDS", "local,docker,forkserver").split(",")
)


def pytest_configure(config: pytest.Config) -> None:
    # Every process a sandbox leaves behind is reparented to pytest, where the census sees it.
    census.become_subreaper()
    config.pluginmanager.register(OneBackend(), "one_backend")


def pytest_unconfigure(config: pytest.Config) -> None:
    census.close()


# Fixtures that are, or start, a gateway of a real backend.
REAL_FIXTURES = frozenset(
    {
        "shared_gateways",
        "gateway",
        "client",
        "backend",
        "local_gateway",
        "local_client",
        "backend_name",
        "fuzz_gateway",
        "page_gateway",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `fast` that asks for a real gateway is a mistake of the suite's."""
    wrong = [
        item.nodeid
        for item in items
        if item.get_closest_marker("fast") is not None
        and REAL_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]
    if wrong:
        raise pytest.UsageError(f"tests marked fast that use a real gateway: {wrong[:5]}")


class OneBackend:
    """Tests marked `one_backend` hold promises of the gateway above the sandbox (a record's
    shape and caps, the tools' answers, the WebSocket's events, a replay's fidelity to
    nbclient): a backend shows them no differently from another, so they run on one
    (`chosen`), and their other backends' instances are deselected, not skipped. What only
    a backend shows (its kernels' start and end, limits, files, isolation, languages, leaks)
    stays unmarked and runs on each."""

    @pytest.hookimpl(trylast=True)  # after `-m`: a tier without such tests probes nothing
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        marked = {item.nodeid: backend for item in items if (backend := one_backend_of(item))}
        if not marked:
            return
        chosen = chosen_backend()
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            (kept if marked.get(item.nodeid, chosen) == chosen else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept


def one_backend_of(item: pytest.Item) -> str | None:
    """The backend of a test marked `one_backend` (its `gateway`, `backend_name` or other
    backend-parametrised fixture), or None (not marked, or not parametrised by backend)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.get_closest_marker("one_backend") is None:
        return None
    found = [value for value in callspec.params.values() if value in ALL_BACKENDS]
    return str(found[0]) if found else None


def chosen_backend() -> str:
    """Where `one_backend` tests run: GATEWAY_TEST_ONE_BACKEND, else forkserver where it can
    run or is required (a kernel is a fork: its tests took 15 minutes of tier 2 where local's took
    19 and Docker's 22, tests/README.md), else local."""
    named = os.environ.get("GATEWAY_TEST_ONE_BACKEND")
    if named:
        if named not in BACKENDS:
            raise pytest.UsageError(f"GATEWAY_TEST_ONE_BACKEND={named} is not one of {BACKENDS}")
        return named
    if "forkserver" in BACKENDS and ("forkserver" in needs.required() or forkserver_status()[0]):
        return "forkserver"
    return "local" if "local" in BACKENDS or not BACKENDS else BACKENDS[0]


@pytest.fixture(autouse=True)
def fast_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `fast` (the first tier, scripts/test.sh) may start no gateway of a real
    backend: `GatewayThread` and `GatewayProcess` refuse, so the tier cannot grow slow."""
    fast = request.node.get_closest_marker("fast") is not None
    REAL_BACKENDS["allowed"] = not fast
    try:
        yield
    finally:
        REAL_BACKENDS["allowed"] = True


def docker_status() -> tuple[bool, str]:
    absent = missing("docker")
    if absent is not None:
        return False, absent
    from gateway.sandbox.docker import probe_docker

    return probe_docker(DOCKER_IMAGE)


def forkserver_status() -> tuple[bool, str]:
    absent = missing("forkserver")
    if absent is not None:
        return False, absent
    from gateway.sandbox.forkserver.backend import probe_forkserver

    return probe_forkserver(DOCKER_IMAGE)


def require_backend(name: str) -> None:
    """Skip (fail, when GATEWAY_REQUIRE names it) if the backend cannot run here: docker
    (an engine with the image), forkserver (root, cgroups, bubblewrap, the image's layers)."""
    status = {"docker": docker_status, "forkserver": forkserver_status}.get(name)
    if status is None:
        return
    ok, why = status()
    if not ok:
        needs.missing(name, why)


# A test's own gateway starts without warm pools unless the test asks for them: filling
# them costs a kernel start each (four by default), and a test that makes one run or two
# would pay for them in CPU it takes from its runs. The session's shared gateways keep the
# default pools (`SharedGateways`): the behavioural suite runs on what operators get.
NO_POOLS = {"pool_python": 0, "pool_bash": 0, "pool_deno": 0, "pool_r": 0}


def start_gateway(backend: str, **overrides: Any) -> GatewayThread:
    require_backend(backend)
    return GatewayThread(backend=backend, **{**NO_POOLS, **overrides}).start()


class SharedGateways:
    """The session's gateways with default settings, one per backend, started on first use.
    With GATEWAY_TEST_STORE=postgres they keep their runs in a database of the session's
    PostgreSQL instead of SQLite: the behavioural suite on the other store (by hand: CI
    runs it on SQLite and the store's own tests on both, within its time)."""

    def __init__(self, postgres: Server | None = None) -> None:
        self.started: dict[str, GatewayThread] = {}
        self._postgres = postgres
        self._databases = contextlib.ExitStack()

    def _store(self) -> dict[str, Any]:
        if self._postgres is None:
            return {}
        return {"store": self._databases.enter_context(self._postgres.database())}

    def get(self, backend: str) -> GatewayThread:
        if backend not in self.started:
            require_backend(backend)
            self.started[backend] = GatewayThread(backend=backend, **self._store()).start()
        return self.started[backend]

    def stop(self) -> None:
        try:
            for server in self.started.values():
                server.stop()
        finally:
            self._databases.close()


@pytest.fixture(scope="session")
def shared_gateways(request: pytest.FixtureRequest) -> Iterator[SharedGateways]:
    postgres = None
    if os.environ.get("GATEWAY_TEST_STORE", "sqlite") == "postgres":
        # asked for here, so that the server outlives the gateways that use it
        postgres = request.getfixturevalue("postgres_server")
    yield from serving(SharedGateways(postgres))


@pytest.fixture(scope="session", params=BACKENDS)
def gateway(request: pytest.FixtureRequest, shared_gateways: SharedGateways) -> GatewayThread:
    """The session's gateway of each backend (tests that use it run once per backend)."""
    return shared_gateways.get(str(request.param))


@pytest.fixture
def client(gateway: GatewayThread) -> Client:
    return gateway.client()


@pytest.fixture
def backend(gateway: GatewayThread) -> str:
    return gateway.backend_name


@pytest.fixture
def local_gateway(shared_gateways: SharedGateways) -> GatewayThread:
    """The session's local gateway, for tests that never reach a sandbox (validation, 404s):
    they run once, not once per backend."""
    return shared_gateways.get("local")


@pytest.fixture
def local_client(local_gateway: GatewayThread) -> Client:
    return local_gateway.client()


@pytest.fixture(scope="module")
def fuzz_gateway() -> Iterator[GatewayThread]:
    """Local backend, a user token (FUZZ_TOKEN), uploads on, every run at most 3 s: for the
    OpenAPI answers and the fuzz run."""
    server = start_gateway(
        "local",
        users={FUZZ_TOKEN: ("fuzzer", "user")},
        allow_uploads=True,
        default_timeout=2.0,
        max_timeout=3.0,
        max_runs_per_user=3,
    )
    yield from serving(server)


@pytest.fixture(scope="module")
def page_gateway() -> Iterator[GatewayThread]:
    """A local gateway of the module's own (default settings), for the tests that drive the
    page in a browser: what they leave running never reaches the shared gateways."""
    yield from serving(GatewayThread(backend="local").start())


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Any]:
    """One headless Chromium per module (tests/browser.py; skipped, or failed under
    GATEWAY_REQUIRE=chromium, without it)."""
    from tests.browser import chromium  # Playwright is imported only by browser tests

    with chromium() as launched:
        yield launched


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """For tests that start a gateway of their own, with special settings."""
    require_backend(request.param)
    return str(request.param)


# Loggers whose errors mean a bug: an uncaught exception in a handler, a task, the gateway.
WATCHED_LOGGERS = ("tornado.application", "asyncio", "gateway")


@pytest.fixture(autouse=True)
def no_unexpected_errors(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> Iterator[None]:
    """Fail a test during which the gateway logged an error (unless marked `logs_errors`)."""
    yield
    if request.node.get_closest_marker("logs_errors"):
        return
    errors = [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.get_records("call") + caplog.get_records("teardown")
        if r.levelno >= logging.ERROR and r.name.startswith(WATCHED_LOGGERS)
    ]
    assert not errors, f"unexpected errors were logged: {errors}"


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the test (and its own fixtures): no run still active on a shared gateway, and a
    clean census. A census that cannot be taken fails the test."""
    yield
    if "shared_gateways" in request.fixturenames:
        shared: SharedGateways = request.getfixturevalue("shared_gateways")
        for server in shared.started.values():
            assert wait_for(server.idle, timeout=60), "runs still active after the test"
    # Every live gateway, a fixture's own too (`fuzz_gateway`), may be refilling a pool: a
    # kernel still starting is not in its pool yet, and a start may take up to the tests'
    # kernel_start_timeout (60 s) before it fails and its sandbox is destroyed.
    census.settle()
    if not wait_for(lambda: not census.census(), timeout=30):
        left = census.census()
        census.clean_up()
        pytest.fail(f"left behind: {left}", pytrace=False)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Server]:
    """The session's PostgreSQL (tests/postgres.py), started on first use."""
    yield from serving(Server())


@pytest.fixture
def postgres_dsn(postgres_server: Server) -> Iterator[str]:
    """A fresh database on the session's PostgreSQL, for one test."""
    with postgres_server.database() as dsn:
        yield dsn
