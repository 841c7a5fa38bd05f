"""Files read out of the kernel image without running it: a container is created (never
started) from it, the files are copied out through the engine (`get_archive`), and the
container is removed at once. For what the gateway needs to know of the image before a
kernel runs: its environment.json (`environment.py`), its account files (`accounts.py`)."""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Sequence
from typing import Any


def read_image_files(
    api: Any, image: str, paths: Sequence[str], labels: dict[str, str], max_bytes: int
) -> dict[str, bytes]:
    """Those of `paths` (absolute, in the image) that are regular files of at most
    `max_bytes`, by path (blocking: docker's low-level APIClient). The container carries
    `labels`, so that a gateway that dies meanwhile removes it when it starts again."""
    import docker.errors

    created = api.create_container(
        image, command=["true"], labels=labels, network_disabled=True, user="1000:1000"
    )
    found: dict[str, bytes] = {}
    try:
        for path in paths:
            try:
                stream, stat = api.get_archive(created["Id"], path)
            except docker.errors.NotFound:
                continue
            if int(stat.get("size", 0)) > max_bytes:
                continue
            archive = bytearray()
            for chunk in stream:
                archive += chunk
                if len(archive) > max_bytes + 64 * 1024:  # the file and its tar headers
                    break
            else:
                data = _from_tar(bytes(archive), max_bytes)
                if data is not None:
                    found[path] = data
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            api.remove_container(created["Id"], force=True)
    return found


def _from_tar(archive: bytes, max_bytes: int) -> bytes | None:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = next(iter(tar.getmembers()), None)
        if member is None or not member.isfile() or member.size > max_bytes:
            return None
        handle = tar.extractfile(member)
        return None if handle is None else handle.read()
