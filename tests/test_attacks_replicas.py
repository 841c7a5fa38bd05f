"""Attacks on the instance id (issue 20, a leftover of issue 19): a second gateway with a
live gateway's instance id would remove that gateway's sandboxes as leftovers of a crash
of its own, and fail its runs. Now it is refused at start, with one line naming the id and
who holds it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import census
from tests.support import DOCKER_IMAGE, GatewayProcess, free_port, new_instance_id, wait_for
from tests.test_replicas import status_of, submit

pytestmark = pytest.mark.attack


# --- the instance id -------------------------------------------------------------------------


def serve(data_dir: Path, *flags: str, isolate_run_lock: bool = False) -> subprocess.Popen[str]:
    """`gateway serve` (local backend) with these flags; with `isolate_run_lock`, inside
    bubblewrap with a /run/lock of its own: another machine as far as this machine's lock
    folder goes."""
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "gateway", "serve", "--backend", "local"]
    command += ["--port", str(free_port()), "--data-dir", str(data_dir)]
    command += ["--docker-image", DOCKER_IMAGE, *flags]
    if isolate_run_lock:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            pytest.skip("bubblewrap is needed to give a process a /run/lock of its own")
        command = [
            bwrap,
            "--die-with-parent",
            "--dev-bind",
            "/",
            "/",
            "--tmpfs",
            "/run/lock",
            "--",
            *command,
        ]
    with census.harness_owned("a second gateway with a taken instance id"):
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def refused(process: subprocess.Popen[str]) -> str:
    """The one line a refused start prints (it must exit, and with status 1)."""
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=60)
        raise AssertionError("the second gateway with the same instance id started") from None
    assert process.returncode == 1, (process.returncode, err[-2000:])
    last = err.strip().splitlines()[-1]
    return last


def test_a_second_gateway_with_the_same_instance_id_is_refused(tmp_path: Path) -> None:
    """SQLite, one machine: a second `gateway serve --instance-id X` (another data dir, so
    another store) exits at once naming X and the holder's pid; A's run goes on untouched.
    Before: the second one started, and its start removed A's sandboxes as leftovers of
    a crashed gateway of that id (A's run failed)."""
    a = GatewayProcess("local", tmp_path / "a")
    a.data_dir.mkdir()
    a.start()
    try:
        run_id = submit(a.client, {"code": "import time; time.sleep(600)", "background": True})
        assert wait_for(lambda: status_of(a.client, run_id) == "running", timeout=60)
        line = refused(serve(tmp_path / "other", "--instance-id", a.instance))
        assert a.instance in line and f"pid {a.pid}" in line, line
        # the same data dir (so the same default id and the same SQLite file) is refused too
        line = refused(serve(a.data_dir, "--instance-id", new_instance_id()))
        assert f"pid {a.pid}" in line, line
        assert status_of(a.client, run_id) == "running"
        assert a.client.request("DELETE", f"/v1/runs/{run_id}").json()["status"] == "cancelled"
    finally:
        a.stop()
