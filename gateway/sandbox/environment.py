"""What a backend's kernels have (`SandboxBackend.environment`): `kernels.environment`'s
JSON, read from the kernel image (where docker/Dockerfile wrote it) or collected from the
environment the local backend runs kernels from. Never on a run's path: the environment
endpoint asks, and the answer is kept until what it was read from changes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import tarfile
from collections.abc import Awaitable, Callable
from typing import Any

ENVIRONMENT_PATH = "/opt/gateway/environment.json"  # in the kernel image (docker/Dockerfile)
MAX_BYTES = 4 * 1024 * 1024  # a few hundred packages take about 40 KiB
COLLECT_TIMEOUT = 120.0  # seconds for `python -m kernels.environment` (R's list included)

log = logging.getLogger(__name__)


class EnvironmentCache:
    """One answer per key (an image id), loaded once however many ask at the same time."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._value: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    async def get(
        self, key: str, load: Callable[[], Awaitable[dict[str, Any] | None]]
    ) -> dict[str, Any] | None:
        async with self._lock:
            if self._key != key:
                self._value = await load()
                self._key = key
            return self._value


def read_from_image(api: Any, image: str, labels: dict[str, str]) -> dict[str, Any] | None:
    """The image's environment.json, read from a container created (never started) from it
    and removed at once (blocking: docker's low-level APIClient). None when the image has no
    such file or it is not a JSON object within `MAX_BYTES`."""
    import docker.errors

    created = api.create_container(
        image, command=["true"], labels=labels, network_disabled=True, user="1000:1000"
    )
    try:
        try:
            stream, stat = api.get_archive(created["Id"], ENVIRONMENT_PATH)
        except docker.errors.NotFound:
            log.warning("the kernel image %s has no %s", image, ENVIRONMENT_PATH)
            return None
        if int(stat.get("size", 0)) > MAX_BYTES:
            log.warning("the kernel image's %s is too large", ENVIRONMENT_PATH)
            return None
        archive = bytearray()
        for chunk in stream:
            archive += chunk
            if len(archive) > MAX_BYTES + 64 * 1024:  # the file and its tar headers
                return None
        return _from_tar(bytes(archive))
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            api.remove_container(created["Id"], force=True)


def _from_tar(archive: bytes) -> dict[str, Any] | None:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next((m for m in tar.getmembers() if m.isfile()), None)
        if member is None or member.size > MAX_BYTES:
            return None
        handle = tar.extractfile(member)
        if handle is None:
            return None
        return _object(handle.read())


def _object(data: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


async def collect_local(python: str, pythonpath: str, path: str) -> dict[str, Any] | None:
    """`python -m kernels.environment` run with the Python local kernels run with (our
    `kernels` package on its path); None when it fails or takes too long."""
    env = {
        "PATH": path,
        "PYTHONPATH": pythonpath,
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    process = await asyncio.create_subprocess_exec(
        python,
        "-P",
        "-m",
        "kernels.environment",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        assert process.stdout is not None
        data = await asyncio.wait_for(_read_all(process.stdout), COLLECT_TIMEOUT)
        status = await asyncio.wait_for(process.wait(), COLLECT_TIMEOUT)
    except TimeoutError:
        log.warning("listing the local kernels' environment took over %g s", COLLECT_TIMEOUT)
        return None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if status != 0 or len(data) > MAX_BYTES:
        return None
    return _object(data)


async def _read_all(stream: asyncio.StreamReader) -> bytes:
    """Everything until EOF, or a little more than `MAX_BYTES` (then it is refused)."""
    data = bytearray()
    while len(data) <= MAX_BYTES and (chunk := await stream.read(65536)):
        data += chunk
    return bytes(data)
