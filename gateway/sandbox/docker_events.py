"""`ExitWatcher`: learn when a container dies from the engine's event stream, once for all.

The Docker SDK is synchronous, and `Container.wait()` parks a thread for as long as the
container lives. Waiting that way once per cell (or per waiter) exhausted the backend's
thread pool and stopped the whole backend. Instead, one dedicated thread reads
the engine's event stream (`die` events of this gateway instance's containers) and
resolves one asyncio future per container; every waiter awaits that future.

Who calls what: `DockerBackend.startup()` opens the watcher before any container exists;
`watch(container_id)` is called right after a container is created (before it starts, so
no `die` can be missed); `forget()` when the sandbox is destroyed; `close()` at shutdown.

If the stream breaks (the engine restarted, a network blip), the thread reconnects with
`since` = the time of the last event it saw, so the engine replays what was missed. A
waiter never depends on the stream alone for safety: kill paths also bound their waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

import docker.errors

import docker

log = logging.getLogger(__name__)

RECONNECT_DELAY = 1.0  # seconds between attempts to reopen a broken event stream


class ExitWatcher:
    """One event-stream reader for all containers that carry `label`."""

    def __init__(self, client: docker.DockerClient, label: str) -> None:
        self._client = client
        self._label = label
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exits: dict[str, asyncio.Future[int | None]] = {}
        self._stream: Any = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._since: float | None = None

    def _open(self) -> Any:
        filters = {"type": "container", "event": ["die"], "label": [self._label]}
        kwargs: dict[str, Any] = {"decode": True, "filters": filters}
        if self._since is not None:
            kwargs["since"] = self._since
        return self._client.api.events(**kwargs)

    async def start(self) -> None:
        """Connect to the event stream (the request is answered before this returns)."""
        self._loop = asyncio.get_running_loop()
        self._since = time.time()
        self._stream = await asyncio.to_thread(self._open)
        self._thread = threading.Thread(target=self._read, name="docker-events", daemon=True)
        self._thread.start()

    def watch(self, container_id: str) -> asyncio.Future[int | None]:
        """The future of a container's exit code; call before the container starts."""
        assert self._loop is not None, "the watcher was not started"
        future = self._exits.get(container_id)
        if future is None:
            future = self._loop.create_future()
            self._exits[container_id] = future
        return future

    def forget(self, container_id: str) -> None:
        future = self._exits.pop(container_id, None)
        if future is not None and not future.done():
            future.cancel()

    def _read(self) -> None:
        while not self._stopping.is_set():
            try:
                for event in self._stream:
                    self._since = event.get("timeNano", time.time_ns()) / 1e9
                    actor = event.get("Actor") or {}
                    code = (actor.get("Attributes") or {}).get("exitCode")
                    self._resolve(str(actor.get("ID") or event.get("id")), code)
            except Exception as exc:  # the stream broke: reconnect below
                log.debug("Docker event stream error: %r", exc)
            if self._stopping.is_set():
                return
            log.warning("the Docker event stream ended; reconnecting")
            self._stopping.wait(RECONNECT_DELAY)
            with contextlib.suppress(docker.errors.DockerException, OSError):
                self._stream = self._open()

    def _resolve(self, container_id: str, code: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        exit_code = int(code) if isinstance(code, str) and code.lstrip("-").isdigit() else None
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._set, container_id, exit_code)

    def _set(self, container_id: str, exit_code: int | None) -> None:
        future = self._exits.get(container_id)
        if future is not None and not future.done():
            future.set_result(exit_code)

    async def close(self) -> None:
        self._stopping.set()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        for future in self._exits.values():
            if not future.done():
                future.cancel()
        self._exits.clear()
