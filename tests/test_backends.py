"""Sandbox backends are plug-ins found by entry point (group `gateway.backends`): the two the
gateway ships register themselves there, another distribution's is found, listed by
`gateway serve --help` and chosen by `--backend NAME` like them, and each backend is
given only the settings it declares. The third-party plug-in here is the fast tests' fake
backend, declared by a distribution made in a temporary folder (its metadata on
`sys.path`, as pip would leave it): nowhere else is it registered."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest

from gateway import settings as settings_module
from gateway.config import config_from
from gateway.models.record import Usage
from gateway.models.request import StagedFile
from gateway.plugins import BACKENDS, backend_entry_points, backend_names
from gateway.sandbox.base import (
    BackendContext,
    Death,
    FilesRead,
    ReadLimits,
    Sandbox,
    SandboxBackend,
)
from gateway.sandbox.factory import load, make_backend
from tests.fake_backend import FakeBackend
from tests.fake_kernel import script
from tests.support import REPO, GatewayProcess

pytestmark = pytest.mark.fast

SHIPPED = {
    "docker": "gateway.sandbox.docker:DockerBackend",
    "forkserver": "gateway.sandbox.forkserver.backend:ForkserverBackend",
    "local": "gateway.sandbox.local:LocalBackend",
}


def plugin_distribution(folder: Path) -> Path:
    """A distribution, as pip installs one, that declares the fake backend as `fake`."""
    info = folder / "gateway_fake_backend-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gateway-fake-backend\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(f"[{BACKENDS}]\nfake = tests.fake_backend:FakeBackend\n")
    return folder


def test_the_shipped_backends_register_by_entry_point() -> None:
    declared = {
        e.name: e.value for e in distribution("kernel-gateway").entry_points if e.group == BACKENDS
    }
    assert declared == SHIPPED
    for name, entry in backend_entry_points().items():
        if name in SHIPPED:
            cls = load(entry)
            assert issubclass(cls, SandboxBackend) and cls.name == name


def test_another_distributions_backend_is_found_and_listed(tmp_path: Path) -> None:
    folder = plugin_distribution(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "installed: docker, fake, forkserver, local" in " ".join(done.stdout.split())
    bad = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--backend", "nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert (
        "backend: " in bad.stderr
        and "'auto', 'docker', 'fake', 'forkserver' or 'local'" in bad.stderr
    )


def test_a_backend_found_by_entry_point_serves_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--backend fake` in a gateway process of its own: found through the metadata alone."""
    folder = plugin_distribution(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(REPO)]))
    (tmp_path / "data").mkdir()
    server = GatewayProcess("fake", tmp_path / "data").start()
    try:
        health = server.client.request("GET", "/v1/health").json()
        assert health["backend"] == "fake"
        record = server.client.run(language="python", code=script(["stdout", "from a plug-in\n"]))
        assert record["status"] == "succeeded" and record["stdout"] == "from a plug-in\n"
    finally:
        server.stop()
    assert "backend fake (requested)" in server.log()


def test_the_factory_makes_the_backend_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(plugin_distribution(tmp_path)))
    assert "fake" in backend_names()
    settings = settings_module.Settings(backend="fake", data_dir=tmp_path / "data").model_dump()
    context = BackendContext(instance_id="t-factory")

    async def made() -> tuple[SandboxBackend, str]:
        return await make_backend(settings, context)

    backend, why = asyncio.run(made())
    assert isinstance(backend, FakeBackend) and why == "backend fake (requested)"
    assert backend.context == context


def test_an_unknown_backend_names_those_installed() -> None:
    settings = {"backend": "kubernetes", "allow_local_multi_user": False}
    with pytest.raises(
        RuntimeError, match=r"--backend kubernetes: .*\(docker, forkserver, local\)"
    ):
        asyncio.run(make_backend(settings, BackendContext(instance_id="t-unknown")))


def test_each_backend_reads_only_settings_that_exist() -> None:
    """Every installed backend's configuration can be built from the settings by name (a
    renamed setting fails here, not at some operator's start), and holds no more."""
    defaults = settings_module.Settings().model_dump()
    for name, entry in backend_entry_points().items():
        if name not in SHIPPED:
            continue
        cls = load(entry)
        config = config_from(cls.config_type, defaults)
        for field in dataclasses.fields(config):
            value = getattr(config, field.name)
            if not dataclasses.is_dataclass(value):
                assert value == defaults[field.name], (name, field.name)


def test_a_configuration_naming_no_setting_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Wrong:
        docker_image: str
        no_such_setting: int

    with pytest.raises(TypeError, match=r"Wrong\.no_such_setting: there is no setting"):
        config_from(Wrong, settings_module.Settings().model_dump())


class Minimal(Sandbox):
    """Only what every backend must do."""

    async def start(self) -> dict[str, Any]:
        return {}

    async def stage_files(self, files: Sequence[StagedFile]) -> None:
        pass

    async def read_files(self, patterns: Sequence[str], limits: ReadLimits) -> FilesRead:
        return FilesRead(files=[], notes=[])

    async def wait_exit(self) -> None:
        pass

    def has_exited(self) -> bool:
        return True

    async def death(self) -> Death | None:
        return None

    async def kill(self) -> None:
        pass

    async def destroy(self) -> None:
        pass


def test_a_sandbox_with_only_the_required_methods_says_it_cannot_do_the_rest() -> None:
    sandbox = Minimal()

    async def capabilities() -> tuple[bool, Usage, frozenset[str], bool]:
        return (
            await sandbox.freeze(),
            await sandbox.usage(),
            await sandbox.limit_events(),
            await sandbox.set_memory_limit(1 << 20),
        )

    frozen, usage, events, lowered = asyncio.run(capabilities())
    assert frozen is False and lowered is False and events == frozenset()
    assert usage.cpu_ms is None and usage.peak_memory_bytes is None
    required = {
        "start",
        "stage_files",
        "read_files",
        "wait_exit",
        "has_exited",
        "death",
        "kill",
        "destroy",
    }
    assert Sandbox.__abstractmethods__ == required
