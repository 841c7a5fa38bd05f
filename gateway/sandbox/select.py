"""Pick the sandbox backend at start: docker when an engine answers and the kernel image
exists, else local; say which and why."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

from gateway.extras import missing
from gateway.sandbox.base import SandboxBackend
from gateway.settings import Settings, parse_store_url

log = logging.getLogger(__name__)


def instance_id(settings: Settings) -> str:
    """The gateway's instance id: stable across restarts, kept in the data dir."""
    if settings.instance_id:
        return settings.instance_id
    path = settings.data_dir / "instance-id"
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        value = secrets.token_hex(8)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value, encoding="ascii")
        return value


def probe_docker_sync(image: str) -> tuple[bool, str]:
    """Whether a Docker engine answers and has the kernel image, and why (blocking)."""
    absent = missing("docker")
    if absent is not None:
        return False, absent
    from gateway.sandbox.docker import probe_docker

    return probe_docker(image)


async def docker_available(image: str) -> tuple[bool, str]:
    return await asyncio.to_thread(probe_docker_sync, image)


def _store_files(settings: Settings) -> list[Path]:
    """A SQLite store kept outside the data dir, and its journal files (the local sandbox
    hides them as it hides the data dir)."""
    if settings.store is None:
        return []
    kind, path = parse_store_url(settings.store)
    if kind != "sqlite" or path is None or path.is_relative_to(settings.data_dir):
        return []
    return [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm", "-journal")]


async def choose_backend(
    settings: Settings, multi_user: bool = False
) -> tuple[SandboxBackend, str]:
    """The backend to use and a sentence saying why. `multi_user`: the token file names
    more than one user, so the local backend's weaker isolation needs the operator's
    explicit consent."""
    ident = instance_id(settings)
    hidden = [p for p in (settings.data_dir, settings.workspaces, settings.tokens) if p is not None]
    hidden += _store_files(settings)
    if settings.backend in ("docker", "auto"):
        ok, why = await docker_available(settings.docker_image)
        if ok:
            from gateway.sandbox.docker import DockerBackend

            reason = "requested" if settings.backend == "docker" else why
            backend = DockerBackend(settings, ident, multi_user=multi_user)
            return backend, f"backend docker ({reason})"
        if settings.backend == "docker":
            raise RuntimeError(f"--backend docker was requested but {why}")
        if multi_user:
            raise RuntimeError(
                f"The --tokens file names several users, and {why}: refusing to fall back "
                "to the local backend, which isolates users far less than Docker. Start a "
                "Docker engine and build the image (docker/build.sh), or, to accept the "
                "local backend's weaker isolation, pass --backend local "
                "--allow-local-multi-user."
            )
        local_reason = f"backend local ({why})"
    else:
        if multi_user and not settings.allow_local_multi_user:
            raise RuntimeError(
                "The --tokens file names several users, and the local backend isolates "
                "users far less than Docker (README, 'What each backend isolates'). Use "
                "--backend docker, or acknowledge the weaker isolation with "
                "--allow-local-multi-user."
            )
        local_reason = "backend local (requested)"
    from gateway.sandbox.local import LocalBackend

    local = LocalBackend(settings, ident, [Path(p) for p in hidden], multi_user=multi_user)
    return local, local_reason
