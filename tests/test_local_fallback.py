"""The local backend's last resort, on a machine with neither bubblewrap nor a cgroup it may
write (and no root to change users): the kernel runs under `kernels.reaper`, a child
subreaper that kills every descendant with the sandbox. These tests force that mode (by
answering the backend's feature probe as such a machine would) and check that nothing a run
starts outlives it, found by the census (census.py), which shares nothing with the reaper.

`test_a_child_that_drops_its_environment_and_session_is_killed` failed before the reaper:
`env -i setsid sleep 1000 &` escaped the old kill, which looked for an environment marker
(issue 15, finding 1).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.sandbox import local
from tests import census
from tests.support import GatewayThread, wait_for


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayThread]:
    bare = local.LocalFeatures(bwrap=None, cgroups=False, drop_to=None)
    monkeypatch.setattr(local, "probe_features", lambda settings: bare)
    server = GatewayThread(backend="local").start()
    try:
        backend = server.gateway.backend
        assert isinstance(backend, local.LocalBackend)
        assert backend.features == bare
        yield server
    finally:
        server.stop()


def run_and_count_strays(server: GatewayThread, code: str) -> list[str]:
    record = server.client().run(language="bash", code=code)
    assert record["status"] == "succeeded" and record["stdout"] == "started\n", record
    # a pooled kernel still starting (the pool refills after the run took one) is no stray:
    # it is told from a leak once it is ready (census.pooled)
    assert wait_for(server.idle, timeout=60)
    wait_for(lambda: not census.stray_pids(), timeout=10)
    return census.stray_processes()


def test_children_that_keep_the_marker_are_killed(fallback: GatewayThread) -> None:
    code = "setsid sleep 1000 >/dev/null 2>&1 &\nnohup sleep 1000 >/dev/null 2>&1 &\necho started"
    assert run_and_count_strays(fallback, code) == []


def test_a_child_that_drops_its_environment_and_session_is_killed(fallback: GatewayThread) -> None:
    code = "env -i setsid sleep 1000 >/dev/null 2>&1 &\necho started"
    assert run_and_count_strays(fallback, code) == []
