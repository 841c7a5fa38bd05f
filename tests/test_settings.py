"""One settings object: defaults < config file < GATEWAY_* environment < flags; and the
backend chosen at start, with the reason in the first log line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gateway import settings as settings_module
from gateway.cli import build_parser
from tests.conftest import docker_status
from tests.support import GatewayThread


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


def test_auto_backend_says_which_and_why(caplog: pytest.LogCaptureFixture) -> None:
    available, why = docker_status()
    with caplog.at_level(logging.INFO, logger="gateway"):
        server = GatewayThread(backend="auto").start()
    try:
        expected = "docker" if available else "local"
        assert server.backend_name == expected
        first = next(r.getMessage() for r in caplog.records if r.name == "gateway")
        assert first == f"backend {expected} ({why})"
    finally:
        server.stop()
