"""The kernel's socket folder: wait until the kernel has bound its sockets, then take the
folder away from it before the gateway connects.

The kernel must be able to create its ipc sockets in the folder, so it starts out as the
kernel's. A kernel that could still write there later could swap a socket file for a
link to a host socket (the gateway would then connect to that, as root). So once the
five sockets exist, the folder becomes root's (mode 0755: the kernel keeps using its
bound sockets but can no longer add, remove or rename entries), and each socket the
gateway connects to is checked to be a socket owned by the kernel's user.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Awaitable

from gateway.errors import SandboxError
from gateway.sandbox.kernelspec import CHANNEL_SUFFIXES

POLL_INTERVAL = 0.005


async def secure_sockets(
    folder: str, name: str, uid: int, exited: Awaitable[object], timeout: float
) -> None:
    """Wait (bounded) for `folder/name-1..5`, lock the folder, and check the sockets.

    `exited` completes if the kernel ends meanwhile (then SandboxError, as on timeout).
    """
    watch = asyncio.ensure_future(exited)
    try:
        deadline = time.monotonic() + timeout
        paths = [os.path.join(folder, f"{name}-{n}") for n in CHANNEL_SUFFIXES]
        while not _all_exist(paths):
            if watch.done():
                raise SandboxError("The kernel exited before it opened its sockets.")
            if time.monotonic() > deadline:
                raise SandboxError(f"The kernel did not open its sockets within {timeout:g} s.")
            await asyncio.wait([watch], timeout=POLL_INTERVAL)
    finally:
        if not watch.done():
            watch.cancel()
    await asyncio.to_thread(_lock, folder, paths, uid)


def _all_exist(paths: list[str]) -> bool:
    """A few lstat calls on a tmpfs: cheap enough for the event loop at this poll rate."""
    return all(os.path.lexists(p) for p in paths)


def _lock(folder: str, paths: list[str], uid: int) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.geteuid() == 0:
            # mode first: the kernel may still be reading its connection file in there,
            # and must never meet a folder it cannot enter
            os.fchmod(fd, 0o755)
            os.fchown(fd, 0, 0)
        for path in paths:
            info = os.stat(os.path.basename(path), dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISSOCK(info.st_mode) or (os.geteuid() == 0 and info.st_uid != uid):
                raise SandboxError(f"The kernel's socket {path} is not a socket of the kernel.")
    finally:
        os.close(fd)
