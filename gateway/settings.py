"""The one settings object, built once at start from defaults, a config file, `GATEWAY_*`
environment variables and command-line flags (later sources win), then passed down.

Every field is a flag (`max_timeout` -> `--max-timeout`), an environment variable
(`GATEWAY_MAX_TIMEOUT`) and a key of the config file (JSON or TOML). Nothing here is read
at import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

MiB = 1024 * 1024
GiB = 1024 * MiB

Backend = Literal["auto", "docker", "local"]


def _field(default: Any, help: str, **kw: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **kw})


@dataclasses.dataclass(frozen=True)
class Settings:
    host: str = _field("127.0.0.1", "address to listen on")
    port: int = _field(8888, "port to listen on (0 picks a free one)")
    backend: Backend = _field("auto", "sandbox backend: docker, local, or auto")
    data_dir: Path = _field(Path("~/.local/share/kernel-gateway"), "where run records live")
    workspaces: Path | None = _field(None, "root of the users' persistent workspaces")
    tokens: Path | None = _field(None, 'JSON file {"<token>": {"user": ..., "role": ...}}')
    allow_uploads: bool = _field(False, "enable POST /v1/uploads and the archive field")
    allow_network: bool = _field(False, "let runs ask for outbound network (network: true)")
    admin_dirs: tuple[str, ...] = _field((), "folders an admin may name as working_dir")
    allowed_origins: tuple[str, ...] = _field(
        (), "web origins besides the gateway's own whose pages may call it (* any, with tokens)"
    )

    default_timeout: float = _field(30.0, "run timeout when the request names none, seconds")
    max_timeout: float = _field(300.0, "largest timeout a request may ask for, seconds")
    kernel_start_timeout: float = _field(60.0, "how long a kernel may take to become ready")
    interrupt_grace: float = _field(1.0, "seconds between interrupt and kill at the deadline")

    max_body_bytes: int = _field(48 * MiB, "largest request body")
    max_json_depth: int = _field(64, "deepest nesting of a JSON body or message (else 400)")
    max_code_bytes: int = _field(1 * MiB, "largest `code`")
    max_files: int = _field(1000, "most `files` in one request")
    max_file_bytes: int = _field(10 * MiB, "largest single staged file (decoded)")
    max_files_bytes: int = _field(32 * MiB, "largest total of staged files (decoded)")
    max_return_files: int = _field(100, "most files matched by `return_files`")
    max_return_file_bytes: int = _field(1 * MiB, "largest single returned file")
    max_return_files_bytes: int = _field(8 * MiB, "largest total of returned files")

    max_upload_bytes: int = _field(21 * MiB, "largest uploaded archive (POST /v1/uploads)")
    max_unpacked_bytes: int = _field(200 * MiB, "largest total of an archive's files, unpacked")
    max_archive_entries: int = _field(20000, "most entries (files and folders) in an archive")
    max_archive_file_bytes: int = _field(50 * MiB, "largest single file in an archive, unpacked")
    max_archive_ratio: float = _field(100.0, "largest compression ratio of an archive's file")
    upload_ttl: float = _field(24 * 3600.0, "seconds an uploaded archive is kept")
    max_uploads_per_user: int = _field(
        100, "uploads kept per user; past it their oldest are deleted"
    )
    max_upload_store_bytes_per_user: int = _field(
        512 * MiB, "bytes of uploads kept per user; past it their oldest are deleted"
    )

    stream_cap_bytes: int = _field(1 * MiB, "stdout, stderr and output are each cut to this")
    display_cap_bytes: int = _field(16 * MiB, "rich outputs (images, HTML) kept per run")
    error_cap_bytes: int = _field(256 * 1024, "an error's value, and its traceback, cut to this")
    result_cap_bytes: int = _field(4 * MiB, "largest `result` (as JSON); a larger one is null")
    max_record_bytes: int = _field(
        64 * MiB, "largest run record; past it the biggest parts are cut (notes say so)"
    )
    output_limit_bytes: int = _field(64 * MiB, "output past this kills the run (output_limit)")

    header_timeout: float = _field(
        10.0, "seconds a connection has to send a request's headers (also its idle time)"
    )
    body_timeout: float = _field(120.0, "seconds a request's body has to arrive")
    write_timeout: float = _field(120.0, "seconds a client has to take a finished answer")
    max_connections: int = _field(1000, "open HTTP connections; past it: 503 and closed")
    max_streams_per_user: int = _field(8, "open WebSocket connections per user (else 429)")
    max_event_bytes: int = _field(
        16 * MiB, "largest WebSocket event; a larger output is dropped, a larger record cut"
    )

    max_concurrent_runs: int = _field(4, "runs executing at once")
    max_queued_runs: int = _field(16, "runs waiting for a slot before 429")
    max_runs_per_user: int = _field(8, "runs one user may have running or queued")
    record_ttl: float = _field(7 * 24 * 3600.0, "seconds a run record is kept")
    max_records_per_user: int = _field(
        1000, "run records kept per user; past it their oldest finished ones are deleted"
    )
    max_record_store_bytes_per_user: int = _field(
        1 * GiB, "bytes of run records kept per user; past it their oldest are deleted"
    )
    drain_timeout: float = _field(330.0, "longest SIGTERM waits for running runs")

    cpus: float = _field(1.0, "CPUs per sandbox")
    memory_bytes: int = _field(1 * GiB, "memory per sandbox")
    pids: int = _field(256, "processes per sandbox")
    workdir_bytes: int = _field(1 * GiB, "size of the sandbox's working folder")
    tmp_bytes: int = _field(256 * MiB, "size of the sandbox's /tmp")

    docker_image: str = _field("gateway-kernel:latest", "kernel image for the docker backend")
    instance_id: str | None = _field(None, "gateway instance id (default: kept in data_dir)")

    @property
    def auth_enabled(self) -> bool:
        return self.tokens is not None


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """Turn a string (flag, env) or a config-file value into the field's type."""
    kind = annotation if isinstance(annotation, str) else str(annotation)
    if value is None:
        return None
    if "tuple" in kind:
        if isinstance(value, str):
            return tuple(part for part in (p.strip() for p in value.split(",")) if part)
        return tuple(str(v) for v in value)
    if "Path" in kind:
        return Path(str(value)).expanduser()
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in {"1", "true", "yes", "on"}:
            return True
        if text in {"0", "false", "no", "off", ""}:
            return False
        raise ValueError(f"{name}: expected a boolean, got {value!r}")
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "Backend":
        if value not in get_args(Backend):
            raise ValueError(f"{name}: expected one of {', '.join(get_args(Backend))}")
        return value
    return str(value)


def _fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(Settings))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; unset flags stay None so that lower sources show through."""
    parser.add_argument("--config", type=Path, default=None, help="config file (JSON or TOML)")
    for f in _fields():
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(
                flag,
                dest=f.name,
                action="store_const",
                const=True,
                default=None,
                help=f.metadata["help"],
            )
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=f.metadata["help"])


def _read_config(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config file must hold an object")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load(
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings: defaults < config file < GATEWAY_* environment < flags < overrides."""
    environ = os.environ if environ is None else environ
    known = {f.name: f for f in _fields()}
    values: dict[str, Any] = {}
    config = getattr(args, "config", None) or environ.get("GATEWAY_CONFIG")
    if config:
        for key, value in _read_config(Path(config)).items():
            if key not in known:
                raise ValueError(f"unknown setting {key!r} in {config}")
            values[key] = value
    for name in known:
        env_value = environ.get("GATEWAY_" + name.upper())
        if env_value is not None:
            values[name] = env_value
    if args is not None:
        for name in known:
            flag_value = getattr(args, name, None)
            if flag_value is not None:
                values[name] = flag_value
    values.update(overrides or {})
    coerced = {name: _coerce(name, known[name].type, v) for name, v in values.items()}
    settings = Settings(**coerced)
    return dataclasses.replace(settings, data_dir=settings.data_dir.expanduser())


def describe(settings: Settings) -> Sequence[str]:
    """Settings as `name=value` lines, for logs."""
    return [f"{f.name}={getattr(settings, f.name)!r}" for f in _fields()]
