"""One settings object: defaults < config file < GATEWAY_* environment < flags; and the
backend chosen at start, with the reason in the first log line."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import secrets
from pathlib import Path
from typing import Any

import pytest

from gateway import settings as settings_module
from gateway.cli import build_parser
from gateway.config import config_from
from gateway.execution.config import ExecutionConfig
from gateway.handlers.config import FrontDoorConfig
from gateway.runs.config import RequestPolicy, RunServiceConfig
from gateway.store.config import StoreConfig
from gateway.uploads.config import UploadsConfig
from tests.conftest import forkserver_status, require_backend
from tests.support import DOCKER_IMAGE, GatewayThread, free_port


def load(argv: list[str], environ: dict[str, str]) -> settings_module.Settings:
    args = build_parser().parse_args(["serve", *argv])
    return settings_module.load(args, environ)


def test_flags_beat_environment_beat_config_file(tmp_path: Path) -> None:
    config = tmp_path / "gateway.json"
    config.write_text(
        json.dumps({"port": 1111, "max-timeout": 60, "cpus": 2, "allow_uploads": True})
    )
    environ = {"GATEWAY_PORT": "2222", "GATEWAY_MAX_TIMEOUT": "90"}
    settings = load(["--config", str(config), "--port", "3333"], environ)
    assert settings.port == 3333  # flag
    assert settings.max_timeout == 90.0  # environment over file
    assert settings.cpus == 2.0 and settings.allow_uploads is True  # file over default
    assert settings.memory_bytes == 1024**3  # default


def test_toml_config_lists_and_paths(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('workspaces = "~/ws"\nadmin_dirs = ["/srv/a", "/srv/b"]\n')
    settings = load(["--config", str(config)], {"GATEWAY_ALLOWED_ORIGINS": "http://a, http://b"})
    assert settings.workspaces == Path("~/ws").expanduser()
    assert settings.admin_dirs == ("/srv/a", "/srv/b")
    assert settings.allowed_origins == ("http://a", "http://b")


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--backend", "cloud"], {}),
        (["--port", "eighty"], {}),
        ([], {"GATEWAY_ALLOW_UPLOADS": "perhaps"}),
    ],
)
def test_bad_values_are_refused(argv: list[str], environ: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        load(argv, environ)


def test_unknown_config_keys_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({"max_timeuot": 5}))
    with pytest.raises(ValueError, match="max_timeuot"):
        load(["--config", str(config)], {})


# Every part's config (`gateway.config`), as the server builds them (a backend's is checked
# in test_backends.py).
PART_CONFIGS = (
    ExecutionConfig,
    RunServiceConfig,
    RequestPolicy,
    UploadsConfig,
    StoreConfig,
    FrontDoorConfig,
)


@pytest.mark.parametrize("kind", PART_CONFIGS, ids=lambda kind: kind.__name__)
def test_each_part_config_takes_settings_that_exist_and_is_frozen(kind: type[Any]) -> None:
    """A part's config is built from the settings by name (a renamed setting fails here,
    not at an operator's start) and holds their values, unchanged and unchangeable."""
    settings = settings_module.Settings(max_timeout=60, allow_uploads=True)
    config = config_from(kind, settings.model_dump())
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if not dataclasses.is_dataclass(value):
            assert value == getattr(settings, field.name), (kind.__name__, field.name)
    name = dataclasses.fields(config)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, name, None)


def first_gateway_line(caplog: pytest.LogCaptureFixture) -> str:
    return next(r.getMessage() for r in caplog.records if r.name == "gateway")


def start_auto(caplog: pytest.LogCaptureFixture, **overrides: Any) -> GatewayThread:
    with caplog.at_level(logging.INFO, logger="gateway"):
        return GatewayThread(backend="auto", **overrides).start()


def test_auto_backend_picks_forkserver_else_docker_when_the_engine_has_the_image(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Forked kernels where the machine allows them (root, cgroups, bubblewrap, the image's
    layers: their attack suite passes as Docker's does), else containers."""
    require_backend("docker")
    forkserver, _ = forkserver_status()
    server = start_auto(caplog)
    try:
        if forkserver:
            assert server.backend_name == "forkserver"
            assert first_gateway_line(caplog) == (
                f"backend forkserver (root, cgroups, bubblewrap and the image {DOCKER_IMAGE}'s "
                "layers: kernels forked from a warm parent, as strict as a container)"
            )
        else:
            assert server.backend_name == "docker"
            # the clause says why forkserver could not run here
            assert first_gateway_line(caplog).startswith("backend docker (")
    finally:
        server.stop()


def test_auto_backend_falls_back_to_local_without_the_image(
    caplog: pytest.LogCaptureFixture,
) -> None:
    require_backend("docker")  # an engine that answers, but not with this image
    missing = "gateway-kernel:no-such-tag-" + secrets.token_hex(4)
    server = start_auto(caplog, docker_image=missing)
    try:
        assert server.backend_name == "local"
        line = first_gateway_line(caplog)
        assert line.startswith("backend local (") and f"no image {missing}" in line, line
    finally:
        server.stop()


def test_auto_backend_falls_back_to_local_without_an_engine(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing answers
    server = start_auto(caplog)
    try:
        assert server.backend_name == "local"
        # forkserver (it reads the image's layers from the engine) and Docker both say why
        line = first_gateway_line(caplog)
        assert line.startswith("backend local (no Docker engine answers"), line
        assert "; no Docker engine answers" in line, line
    finally:
        server.stop()


def setting_names() -> list[str]:
    """Every setting the gateway has (a dataclass or a pydantic model)."""
    model_fields = getattr(settings_module.Settings, "model_fields", None)
    if model_fields is not None:
        return sorted(model_fields)
    return sorted(f.name for f in dataclasses.fields(settings_module.Settings))


def other_value(name: str) -> tuple[str, Any]:
    """A value unlike the default, as a flag or environment would give it, and as parsed."""
    default = getattr(settings_module.Settings(), name)
    if name == "backend":
        return "local", "local"
    if name == "store":
        return "sqlite:///srv/runs.db", "sqlite:///srv/runs.db"
    if isinstance(default, bool):
        return "true", True
    if isinstance(default, int):
        return str(default + 3), default + 3
    if isinstance(default, float):
        return str(default + 2.5), default + 2.5
    if isinstance(default, tuple):
        return "/srv/a,/srv/b", ("/srv/a", "/srv/b")
    if isinstance(default, Path) or name in ("workspaces", "tokens", "metrics_token_file"):
        return "/srv/somewhere", Path("/srv/somewhere")
    return "some-value", "some-value"


@pytest.mark.parametrize("name", setting_names())
def test_every_setting_is_a_flag_and_an_environment_variable(name: str) -> None:
    text, parsed = other_value(name)
    assert getattr(settings_module.Settings(), name) != parsed
    flag = ["--" + name.replace("_", "-")] + ([] if parsed is True else [text])
    assert getattr(load(flag, {}), name) == parsed
    assert getattr(load([], {"GATEWAY_" + name.upper(): text}), name) == parsed


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-concurrent-runs", "0", "greater than or equal to 1"),
        ("--cpus", "-2", "greater than 0"),
        ("--port", "99999", "less than or equal to 65535"),
        ("--default-timeout", "nan", "finite number"),
        ("--max-files", "many", "valid integer"),
        ("--sandbox-uid", "0", "greater than or equal to 1"),
        ("--backend", "kubernetes", "'auto', 'docker', 'forkserver' or 'local'"),
    ],
)
def test_nonsense_settings_are_refused_naming_the_setting(flag: str, value: str, says: str) -> None:
    """Issue 9: settings once accepted `max_concurrent_runs=0`, `cpus=-2`, `port=99999` and
    a NaN timeout, and a bad integer failed without naming the setting."""
    name = flag.removeprefix("--").replace("-", "_")
    with pytest.raises(ValueError, match=rf"^{name}: .*{re.escape(says)}"):
        load([flag, value], {})
    with pytest.raises(ValueError, match=rf"^{name}: "):
        load([], {"GATEWAY_" + name.upper(): value})
