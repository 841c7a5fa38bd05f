"""What a backend's kernels have (`SandboxBackend.environment`): `kernels.environment`'s
JSON, read from the kernel image (where docker/Dockerfile wrote it) or collected from the
environment the local backend runs kernels from. Never on a run's path: the environment
endpoint asks, and the answer is kept until what it was read from changes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.sandbox.image_files import read_image_files

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
    """The image's environment.json (blocking: `image_files.read_image_files`). None when
    the image has no such file or it is not a JSON object within `MAX_BYTES`."""
    found = read_image_files(api, image, [ENVIRONMENT_PATH], labels, MAX_BYTES)
    if ENVIRONMENT_PATH not in found:
        log.warning(
            "the kernel image %s has no %s within %d bytes", image, ENVIRONMENT_PATH, MAX_BYTES
        )
        return None
    return _object(found[ENVIRONMENT_PATH])


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
