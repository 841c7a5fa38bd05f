"""A kernel start that fails is tried once more; a second failure fails the run with the
reason (503 `sandbox_unavailable`), never a hang (issue 20).

The failure is real: the Deno kernel's process is killed from outside while it starts, as
the OOM killer, an operator or a crashing machine would, by a watcher that kills the first
`count` Deno kernels of this gateway the moment they appear (long before one can answer:
Deno takes most of a second to listen)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import api
from tests.conftest import start_gateway
from tests.support import GatewayThread, serving

NO_POOLS = {"pool_python": 0, "pool_bash": 0, "pool_deno": 0}  # every run starts its own


class KernelKiller:
    """Kills the first `count` Deno kernels (their relay, `python -m kernels.deno`) of one
    local gateway as soon as they appear."""

    def __init__(self, server: GatewayThread, count: int) -> None:
        instance = server.settings.instance_id or ""
        self.folder = f"/gw{instance[:6]}-"  # the local backend's sandbox folders
        self.count = count
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> KernelKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while len(self.killed) < self.count and not self._stop.wait(0.002):
            for pid in self._relays():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)

    def _relays(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.killed:
                continue
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                relay = argv[1:4] == [b"-P", b"-m", b"kernels.deno"]  # not bwrap, nor sh
                if relay and any(self.folder.encode() in a for a in argv):
                    found.append(int(entry))
        return found[: self.count - len(self.killed)]


@pytest.fixture
def local() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local", **NO_POOLS))


def test_a_kernel_killed_while_it_starts_is_started_again(local: GatewayThread) -> None:
    client = local.client()
    with KernelKiller(local, count=1) as killer:
        record = client.run(language="javascript", code="console.log(6 * 7)")
    assert len(killer.killed) == 1  # the first start really failed
    assert (record["status"], record["stdout"]) == ("succeeded", "42\n"), record


def test_a_kernel_killed_twice_fails_the_run_with_the_reason(local: GatewayThread) -> None:
    client = local.client()
    with KernelKiller(local, count=2) as killer:
        response = client.request("POST", "/v1/runs", {"language": "javascript", "code": "1"})
    assert len(killer.killed) == 2
    error = api.assert_error(response, 503, "sandbox_unavailable", "2 times", "SIGKILL")
    assert "exited" in error["message"], error
