"""The leak census itself (census.py) can fail: it sees a process that hid from the gateway's
own ways of finding its sandboxes, it takes no exit status from anyone, and a census it
cannot take fails instead of reading as clean."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from tests import census, needs
from tests.api import full
from tests.conftest import start_gateway
from tests.support import free_port, wait_for


def test_pytest_is_a_child_subreaper() -> None:
    assert census.is_subreaper()


@pytest.fixture
def escaped() -> Iterator[list[int]]:
    """A `sleep` that dropped its environment and its session, then lost its parent."""
    shell = subprocess.run(
        ["sh", "-c", "env -i setsid sleep 1000 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pids = [int(shell.stdout)]
    try:
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def test_a_process_that_detached_itself_is_seen_and_named(escaped: list[int]) -> None:
    [pid] = escaped
    assert wait_for(lambda: pid in census.stray_pids(), timeout=10), census.stray_processes()
    assert any(f"pid {pid} " in line and "sleep 1000" in line for line in census.census())
    assert Path(f"/proc/{pid}/environ").read_bytes() == b""  # no marker left to find it by
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: pid not in census.stray_pids(), timeout=10)  # a zombie now: ignored


def test_zombies_are_ignored_and_their_status_stays_with_their_parent() -> None:
    child = subprocess.Popen(["sh", "-c", "exit 7"])
    table_state = lambda: census.process_table().get(child.pid)  # noqa: E731
    assert wait_for(lambda: (p := table_state()) is not None and p.state == "Z", timeout=10)
    assert child.pid not in census.stray_pids()
    assert child.wait(10) == 7  # the census never reaped it


def test_harness_owned_processes_count_only_while_they_live() -> None:
    with census.harness_owned("a test helper"):
        helper = subprocess.Popen(["sh", "-c", "sleep 1000 & exec sleep 1000"])
    try:
        assert wait_for(lambda: len(census.descendants(helper.pid)) == 1, timeout=10)
        assert census.stray_pids() == []
        [grandchild] = census.descendants(helper.pid)
    finally:
        helper.kill()
        helper.wait(10)
    # its child outlived it: reparented to pytest, and a leak again
    assert wait_for(lambda: grandchild.pid in census.stray_pids(), timeout=10)
    os.kill(grandchild.pid, signal.SIGKILL)
    assert wait_for(lambda: census.stray_pids() == [], timeout=10)


def test_a_docker_census_that_cannot_ask_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(census, "DOCKER_INSTANCES", {"t-census-self-test"})
    monkeypatch.setattr(census, "_docker", {})
    # nothing listens there (a unix socket path that does not exist makes docker-py leak a
    # socket, which pytest would report as an unraisable warning)
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(census.CensusError, match="Docker census failed"):
        census.census()


@pytest.fixture
def leaked_cgroup(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A cgroup named as a sandbox's of a gateway of ours (`gateway-gw<instance[:6]>-*`),
    a process in it: what a sandbox that was never destroyed leaves behind."""
    instance = "tcensus" + os.urandom(4).hex()
    monkeypatch.setattr(census, "INSTANCES", {*census.INSTANCES, instance})
    root = Path("/sys/fs/cgroup")
    parent = root if (root / "cgroup.controllers").exists() else root / "pids"
    path = parent / f"gateway-gw{instance[:6]}-leak"
    try:
        path.mkdir()
    except OSError as exc:
        needs.missing("cgroups", f"this process cannot make a cgroup ({exc})")
    sleeper = subprocess.Popen(["sleep", "1000"])
    try:
        (path / "cgroup.procs").write_text(str(sleeper.pid))
        yield path, sleeper
    finally:
        sleeper.kill()
        sleeper.wait(10)
        census.remove_cgroup(path)


def test_clean_up_removes_a_leaked_cgroup_and_what_runs_in_it(
    leaked_cgroup: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    path, sleeper = leaked_cgroup
    found = census.census()
    assert str(path) in found and any(f"pid {sleeper.pid} " in line for line in found), found
    census.clean_up()
    assert sleeper.wait(10) == -signal.SIGKILL
    assert not path.exists()
    assert census.census() == []  # the next test starts clean: one leak fails one test


@pytest.mark.parametrize("backend", ["local", "forkserver"])
def test_a_pooled_kernel_that_ran_code_is_a_leak(backend: str) -> None:
    """The census tells an idle pooled sandbox from a used one by asking its kernel, never the
    gateway: one that ran a cell (here through its own sockets) is a leak, pooled or not. A
    forked kernel has no folder on the host: its root (`/proc/<pid>/root`) stands for one."""
    server = start_gateway(backend, pool_python=1, pool_bash=0, pool_deno=0, pool_r=0)
    try:
        assert wait_for(lambda: full(server.client()), timeout=120)
        instance = server.settings.instance_id or ""
        [folder] = census.folders_of(instance) or census.forked_roots(instance)
        assert census.census() == []  # alive on purpose
        info = census.connection_of(folder)
        assert info is not None
        client = BlockingKernelClient()
        client.load_connection_info(info)
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        try:  # the reply comes on the shell socket, which holds it until it is read; waiting
            # for IOPub's idle instead missed it when the kernel published before the client's
            # subscription had reached it (ZeroMQ's slow joiner: one CI run timed out so)
            msg_id = client.execute("used = True")
            reply = client.get_shell_msg(timeout=30)
        finally:
            client.stop_channels()
        assert reply["parent_header"]["msg_id"] == msg_id, reply
        assert reply["content"]["status"] == "ok", reply["content"]
        found = census.census()
        if backend == "local":
            assert str(folder) in found, found
        else:  # its processes and its cgroup are no longer pooled
            pid = folder.parts[2]
            assert any(f"pid {pid} " in line for line in found), found
            assert any("/gateway-gwfs" in line for line in found), found
    finally:
        server.stop()
