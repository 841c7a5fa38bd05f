"""The one settings object, built once at start from defaults, a config file, `GATEWAY_*`
environment variables and command-line flags (later sources win), validated by one pydantic
model (types and ranges: a bad value names the setting and what it allows), then passed
down.

Every field is a flag (`max_timeout` -> `--max-timeout`), an environment variable
(`GATEWAY_MAX_TIMEOUT`) and a key of the config file (JSON or TOML). Nothing here is read
at import time.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.plugins import backend_names
from gateway.store_url import parse_store_url

MiB = 1024 * 1024
GiB = 1024 * MiB

# Kernels run as this uid and gid by default: inside the range systemd reserves for
# containers (524288-1879048191), far from login accounts (1000-60000) and subordinate id
# ranges, so that files a kernel leaves in a workspace belong to no one on the host.
SANDBOX_ID = 1_000_000_000


def setting(default: Any, help: str, **constraints: Any) -> Any:
    """A setting: its default, its help (also the flag's), and the values it allows."""
    if isinstance(default, float) or constraints.pop("finite", False):
        constraints.setdefault("allow_inf_nan", False)
    return Field(default, description=help, **constraints)


class Settings(BaseModel):
    """Every setting of the gateway, validated: a bad value names the setting and the
    values it allows."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    host: str = setting("127.0.0.1", "address to listen on", min_length=1)
    port: int = setting(8888, "port to listen on (0 picks a free one)", ge=0, le=65535)
    backend: str = setting(
        "auto",
        "sandbox backend: auto (forkserver as root with cgroups and the kernel image's "
        "layers, else docker where an engine has the kernel image, else local), or "
        "the name of one installed as a gateway.backends entry point",
    )
    data_dir: Path = setting(Path("~/.local/share/kernel-gateway"), "where run records live")
    store: str | None = setting(
        None,
        "where run records live: sqlite:///PATH (default: runs.sqlite3 under data_dir) or "
        "postgresql://USER:PASSWORD@HOST:PORT/DB, shared by gateway replicas",
    )
    lease_seconds: float = setting(
        30.0,
        "with a PostgreSQL store: a replica that has not renewed its runs for this long is "
        "taken for dead, and another fails them",
        ge=0.5,
        le=3600,
    )
    workspaces: Path | None = setting(None, "root of the users' persistent workspaces")
    workspace_bytes: int = setting(
        1 * GiB,
        "size of each user's workspace: a file system image of its own under the workspaces "
        "root's .images (root and loop devices); 0: plain folders without a size limit",
        ge=0,
    )
    workspace_inodes: int = setting(
        131072,
        "files and folders each user's workspace may hold (at most one per 4 KiB of it)",
        ge=64,
    )
    tokens: Path | None = setting(None, 'JSON file {"<token>": {"user": ..., "role": ...}}')
    metrics_token_file: Path | None = setting(
        None,
        "file holding one bearer token that may read /metrics and the details of /v1/health "
        "and nothing else (a Prometheus scrape's credentials_file); with tokens, those need "
        "it or an admin's token",
    )
    allow_uploads: bool = setting(False, "enable POST /v1/uploads and the archive field")
    allow_network: bool = setting(False, "let runs ask for outbound network (network: true)")
    allow_local_multi_user: bool = setting(
        False, "serve several users (--tokens) with the local backend, which isolates less"
    )
    admin_dirs: tuple[str, ...] = setting((), "folders an admin may name as working_dir")
    allowed_origins: tuple[str, ...] = setting(
        (), "web origins besides the gateway's own whose pages may call it (* any, with tokens)"
    )

    default_timeout: float = setting(30.0, "run timeout when the request names none, seconds", gt=0)
    max_timeout: float = setting(300.0, "largest timeout a request may ask for, seconds", ge=1)
    kernel_start_timeout: float = setting(60.0, "how long a kernel may take to become ready", gt=0)
    interrupt_grace: float = setting(
        1.0, "seconds between interrupt and kill at the deadline", ge=0
    )

    max_body_bytes: int = setting(48 * MiB, "largest request body", ge=1024)
    max_body_bytes_in_flight: int = setting(
        256 * MiB,
        "request bodies and WebSocket messages being received at once; past it: 503",
        ge=1024,
    )
    max_body_bytes_in_flight_per_user: int = setting(
        96 * MiB, "the same, for one user's requests (one body may pass it alone)", ge=1024
    )
    max_json_depth: int = setting(
        64, "deepest nesting of a JSON body or message (else 400)", ge=2, le=1000
    )
    max_json_values: int = setting(
        100_000,
        "most JSON values (objects, arrays, strings, numbers, literals) in a request body or "
        "WebSocket message that is not a notebook, counted before it is parsed (else 413)",
        ge=100,
    )
    max_notebook_values: int = setting(
        1_000_000,
        "most JSON values in a notebook replay's body or message (cells, outputs, metadata; "
        "else 413)",
        ge=100,
    )
    max_notebook_cells: int = setting(10_000, "most cells in a notebook to replay (else 413)", ge=1)
    max_code_bytes: int = setting(1 * MiB, "largest `code`", ge=1)
    max_files: int = setting(1000, "most `files` in one request", ge=0)
    max_file_bytes: int = setting(10 * MiB, "largest single staged file (decoded)", ge=0)
    max_files_bytes: int = setting(32 * MiB, "largest total of staged files (decoded)", ge=0)
    max_return_files: int = setting(100, "most files matched by `return_files`", ge=0)
    max_return_file_bytes: int = setting(1 * MiB, "largest single returned file", ge=0)
    max_return_files_bytes: int = setting(8 * MiB, "largest total of returned files", ge=0)

    max_upload_bytes: int = setting(21 * MiB, "largest uploaded archive (POST /v1/uploads)", ge=1)
    max_unpacked_bytes: int = setting(
        200 * MiB, "largest total of an archive's files, unpacked", ge=0
    )
    max_archive_entries: int = setting(
        20000, "most entries (files and folders) in an archive", ge=1
    )
    max_archive_file_bytes: int = setting(
        50 * MiB, "largest single file in an archive, unpacked", ge=0
    )
    max_archive_ratio: float = setting(
        100.0, "largest compression ratio of an archive's file", ge=1
    )
    upload_ttl: float = setting(24 * 3600.0, "seconds an uploaded archive is kept", gt=0)
    max_uploads_per_user: int = setting(
        100, "uploads kept per user; past it their oldest are deleted", ge=1
    )
    max_upload_store_bytes_per_user: int = setting(
        512 * MiB, "bytes of uploads kept per user; past it their oldest are deleted", ge=0
    )
    max_concurrent_uploads: int = setting(
        4,
        "uploads checked and stored at once by this gateway (with PostgreSQL, also never "
        "more than half of its store connections); more wait their turn",
        ge=1,
        le=1024,
    )
    max_concurrent_uploads_per_user: int = setting(
        2, "uploads of one user checked and stored at once by this gateway", ge=1, le=1024
    )
    upload_wait_timeout: float = setting(
        10.0, "seconds an upload waits for its turn before 429 capacity", ge=0, le=3600
    )

    stream_cap_bytes: int = setting(
        1 * MiB, "stdout, stderr and output are each cut to this", ge=64
    )
    display_cap_bytes: int = setting(16 * MiB, "rich outputs (images, HTML) kept per run", ge=0)
    error_cap_bytes: int = setting(
        256 * 1024, "an error's value, and its traceback, cut to this", ge=1024
    )
    result_cap_bytes: int = setting(
        4 * MiB, "largest `result` (as JSON); a larger one is null", ge=0
    )
    max_record_bytes: int = setting(
        64 * MiB,
        "largest run record; past it the biggest parts are cut (notes say so)",
        ge=64 * 1024,
    )
    output_limit_bytes: int = setting(
        64 * MiB, "output past this kills the run (output_limit)", ge=1024
    )
    kernel_bytes_in_flight: int = setting(
        128 * MiB,
        "kernel message bytes held in the gateway at once, all kernels together; past it "
        "reading waits (the kernels are slowed down)",
        ge=MiB,
    )

    header_timeout: float = setting(
        10.0, "seconds a connection has to send a request's headers (also its idle time)", gt=0
    )
    body_timeout: float = setting(120.0, "seconds a request's body has to arrive", gt=0)
    write_timeout: float = setting(120.0, "seconds a client has to take a finished answer", gt=0)
    max_answer_bytes_in_flight: int = setting(
        256 * MiB,
        "large answers being sent at once; past it an answer waits (up to write_timeout)",
        ge=1024,
    )
    max_answer_bytes_in_flight_per_user: int = setting(
        64 * MiB, "the same, for one user's answers (one answer may pass it alone)", ge=1024
    )
    max_connections: int = setting(1000, "open HTTP connections; past it: 503 and closed", ge=1)
    max_streams_per_user: int = setting(8, "open WebSocket connections per user (else 429)", ge=1)
    max_event_bytes: int = setting(
        16 * MiB,
        "largest WebSocket event; a larger output is dropped, a larger record cut",
        ge=64 * 1024,
    )
    max_concurrent_runs: int = setting(4, "runs executing at once", ge=1, le=4096)
    max_queued_runs: int = setting(16, "runs waiting for a slot before 429", ge=0)
    max_runs_per_user: int = setting(8, "runs one user may have running or queued", ge=1)
    max_running_per_user: int = setting(
        0,
        "run slots one user may hold at once on this gateway (0: with --tokens, "
        "max_concurrent_runs - 1, at least 1, so a slot is always left for another user; "
        "single-user, all); a free slot goes to the waiting run of the user running fewest",
        ge=0,
    )
    cpu_seconds_per_hour: float = setting(
        0.0,
        "CPU-seconds one user's runs may spend in any rolling hour (0: no limit; the tokens "
        "file may set it per user)",
        ge=0,
        le=1e9,
    )
    cpu_seconds_per_day: float = setting(
        0.0,
        "CPU-seconds one user's runs may spend in any rolling day (0: no limit)",
        ge=0,
        le=1e9,
    )
    runs_per_minute: int = setting(
        0, "runs one user may start in any rolling minute (0: no limit)", ge=0, le=10**9
    )
    record_ttl: float = setting(7 * 24 * 3600.0, "seconds a run record is kept", gt=0)
    max_records_per_user: int = setting(
        1000, "run records kept per user; past it their oldest finished ones are deleted", ge=1
    )
    max_record_store_bytes_per_user: int = setting(
        1 * GiB, "bytes of run records kept per user; past it their oldest are deleted", ge=0
    )
    drain_timeout: float = setting(330.0, "longest SIGTERM waits for running runs", ge=0)
    snapshots_per_user: int = setting(
        10, "kept kernel states (`keep`) per user; past it their least recently used go", ge=0
    )
    snapshot_bytes_per_user: int = setting(
        4 * GiB,
        "memory of one user's kept kernel states; past it their least recently used go",
        ge=0,
    )
    snapshot_ttl: float = setting(
        3600.0, "seconds a kept kernel state waits for a run to start from it", gt=0
    )
    snapshot_bytes_total: int = setting(
        8 * GiB,
        "memory of every user's kept kernel states together; past it no more is kept "
        "(nobody's is evicted for another's)",
        ge=0,
    )

    cpus: float = setting(1.0, "CPUs per sandbox", gt=0, le=1024)
    memory_bytes: int = setting(1 * GiB, "memory per sandbox", ge=16 * MiB)
    pids: int = setting(256, "processes per sandbox", ge=8)
    workdir_bytes: int = setting(1 * GiB, "size of the sandbox's working folder", ge=MiB)
    tmp_bytes: int = setting(256 * MiB, "size of the sandbox's /tmp", ge=MiB)

    pool_python: int = setting(2, "never-used Python kernels kept ready (0: no pool)", ge=0, le=64)
    pool_bash: int = setting(1, "never-used bash kernels kept ready (0: no pool)", ge=0, le=64)
    pool_deno: int = setting(
        1, "never-used Deno kernels (JavaScript, TypeScript) kept ready (0: no pool)", ge=0, le=64
    )
    pool_r: int = setting(
        -1,
        "never-used R kernels kept ready (-1: one when the backend's kernels have R, as the "
        "kernel image's datascience profile does; 0: no pool)",
        ge=-1,
        le=64,
    )
    preload: tuple[str, ...] = setting(
        ("matplotlib.pyplot", "numpy", "pandas"),
        "modules pooled Python kernels import ahead (comma-separated; empty: none)",
    )
    pool_min_free_bytes: int = setting(
        1 * GiB, "no pool refill while less memory than this is available; idle kernels go", ge=0
    )
    docker_image: str = setting(
        "gateway-kernel:latest", "kernel image for the docker backend", min_length=1
    )
    docker_network: str | None = setting(
        None,
        "Docker network for runs with network: true (required with --allow-network on "
        "Docker; create it with egress rules that keep runs off the host and metadata)",
    )
    docker_call_timeout: float = setting(
        30.0, "longest one Docker engine call may take before the run fails, seconds", gt=0
    )
    sandbox_uid: int = setting(
        SANDBOX_ID,
        "first uid kernels run as: keep it and the uids above it outside the host's account range",
        ge=1,
        le=2**32 - 2,
    )
    sandbox_uids: int = setting(
        65536,
        "how many uids sandboxes take, one each while alive, from sandbox_uid + 1 up "
        "(each user's workspace gets one of its own above them, with or without a quota; "
        "sandbox_uid itself runs admin folders)",
        ge=1,
        le=2**31,
    )
    sandbox_gid: int = setting(SANDBOX_ID, "gid kernels run as", ge=1, le=2**32 - 2)
    instance_id: str | None = setting(
        None, "gateway instance id (default: kept in data_dir)", pattern=r"^[A-Za-z0-9_-]{1,64}$"
    )

    @field_validator("backend", mode="after")
    @classmethod
    def _installed_backend(cls, value: str) -> str:
        if value == "auto":
            return value
        names = backend_names()
        if value not in names:
            if not names:
                raise ValueError(
                    "no backend is installed (the gateway.backends entry points): reinstall "
                    "the gateway (scripts/setup.sh, or pip install)"
                )
            *others, last = [repr(name) for name in ["auto", *names]]
            raise ValueError(
                f"no backend of that name is installed; use {', '.join(others)} or {last}"
            )
        return value

    @field_validator("workspace_bytes", mode="after")
    @classmethod
    def _image_size(cls, value: int) -> int:
        if 0 < value < 16 * MiB:
            raise ValueError("a workspace needs at least 16 MiB (or 0: no size limit)")
        return value

    @model_validator(mode="after")
    def _ranges(self) -> Settings:
        if self.sandbox_uid + self.sandbox_uids >= 2**32 - 2:
            raise ValueError(
                "sandbox_uid + sandbox_uids must stay below 4294967294, with room above for "
                "the users' workspaces"
            )
        if self.workspaces is not None:
            for folder in self.admin_dirs:
                if self.workspaces.is_relative_to(os.path.abspath(folder)):
                    raise ValueError(
                        f"admin_dirs: {folder} holds the workspaces root {self.workspaces}, "
                        "whose users' folders have quotas of their own: name folders beside it"
                    )
        return self

    @field_validator("admin_dirs", "allowed_origins", "preload", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part for part in (p.strip() for p in value.split(",")) if part)
        return value

    @field_validator("store", mode="after")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_store_url(value)
        return value

    @field_validator("data_dir", "workspaces", "tokens", mode="after")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else Path(os.path.abspath(value.expanduser()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting; unset flags stay None so that lower sources show through."""
    parser.add_argument("--config", type=Path, default=None, help="config file (JSON or TOML)")
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help = field.description
        if name == "backend":  # the names found now, not a fixed list
            help = f"{help}; installed: {', '.join(backend_names()) or 'none'}"
        if field.annotation is bool:
            parser.add_argument(
                flag,
                dest=name,
                action="store_const",
                const=True,
                default=None,
                help=help,
            )
        else:
            parser.add_argument(flag, dest=name, default=None, help=help)


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
    """Build the settings: defaults < config file < GATEWAY_* environment < flags < overrides.
    A bad value raises ValueError naming the setting and what it allows."""
    environ = os.environ if environ is None else environ
    known = Settings.model_fields
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
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise ValueError(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    """The first problem, as `setting: what is wrong (got value)`."""
    error = exc.errors()[0]
    name = ".".join(str(part) for part in error["loc"]) or "settings"
    if name == "store":  # a DSN can hold a password in more forms than one: never echoed
        return f"store: {error['msg']}"
    return f"{name}: {error['msg']} (got {error.get('input')!r})"
