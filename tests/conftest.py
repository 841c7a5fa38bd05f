"""Fixtures: a real gateway per backend (the behavioural suite runs on both), and a leak
census after every test: no sandbox process, folder, cgroup or container may remain."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import DOCKER_IMAGE, Client, GatewayThread, census, wait_for

BACKENDS = ("local", "docker")
REQUIRE_DOCKER = os.environ.get("GATEWAY_REQUIRE_DOCKER") == "1"


def docker_status() -> tuple[bool, str]:
    from gateway.sandbox.select import probe_docker_sync

    return probe_docker_sync(DOCKER_IMAGE)


def require_backend(name: str) -> None:
    if name != "docker":
        return
    ok, why = docker_status()
    if not ok:
        if REQUIRE_DOCKER:
            pytest.fail(f"GATEWAY_REQUIRE_DOCKER=1 but Docker is not usable: {why}")
        pytest.skip(f"Docker backend not available here: {why}")


def start_gateway(backend: str, **overrides: Any) -> GatewayThread:
    require_backend(backend)
    return GatewayThread(backend=backend, **overrides).start()


@pytest.fixture(scope="session", params=BACKENDS)
def gateway(request: pytest.FixtureRequest) -> Iterator[GatewayThread]:
    """One gateway per backend for the whole session (tests are grouped by backend)."""
    server = start_gateway(request.param)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(gateway: GatewayThread) -> Client:
    return gateway.client()


@pytest.fixture
def backend(gateway: GatewayThread) -> str:
    return gateway.backend_name


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
    yield
    if "gateway" in request.fixturenames:
        server: GatewayThread = request.getfixturevalue("gateway")
        assert wait_for(server.idle, timeout=60), "runs still active after the test"
    assert wait_for(lambda: not census(), timeout=30), f"left behind: {census()}"
