"""A gateway that dies, or is told to stop, loses nothing and leaves nothing behind."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import census
from tests.support import Client, GatewayProcess, serving, wait_for


@pytest.fixture
def process(backend_name: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    yield from serving(GatewayProcess(backend_name, data_dir))


def status_of(client: Client, run_id: str) -> str:
    return str(client.request("GET", f"/v1/runs/{run_id}").json()["status"])


def test_sigkill_mid_run_then_restart(process: GatewayProcess, backend_name: str) -> None:
    client = process.start().client
    done = client.run(code="result = 41 + 1")
    body = {"code": "import time; time.sleep(600)", "background": True}
    run_id = client.request("POST", "/v1/runs", body).json()["id"]
    assert wait_for(lambda: status_of(client, run_id) == "running", timeout=60)
    if backend_name == "docker":  # its container exists (its folder comes first)
        assert wait_for(lambda: any(i.startswith("container") for i in census.census()), 60)
    assert wait_for(census.sandboxes_exist, timeout=60)  # its sandbox exists
    process.signal(signal.SIGKILL)
    if backend_name == "docker":  # nothing killed the container: only the restart can
        assert any(item.startswith("container") for item in census.census())
        assert census.sandbox_mounts()  # nor unmounted its socket and working folders
    process.start()
    assert wait_for(lambda: census.census() == [], timeout=30), census.census()
    assert client.request("GET", f"/v1/runs/{done['id']}").json()["result"] == 42
    interrupted = client.request("GET", f"/v1/runs/{run_id}").json()
    assert interrupted["status"] == "failed" and interrupted["exit_code"] is None
    assert any("stopped while this run was in progress" in n for n in interrupted["notes"])


def test_sigterm_lets_a_running_run_finish_then_exits(process: GatewayProcess) -> None:
    client = process.start().client
    body = {"code": "import time; time.sleep(3); result = 'finished'", "background": True}
    run_id = client.request("POST", "/v1/runs", body).json()["id"]
    assert wait_for(lambda: status_of(client, run_id) == "running", timeout=60)
    assert process.signal(signal.SIGTERM) == 0
    with sqlite3.connect(process.data_dir / "runs.sqlite3") as db:
        (payload,) = db.execute("SELECT record FROM runs WHERE id = ?", (run_id,)).fetchone()
    record = json.loads(payload)
    assert (record["status"], record["result"]) == ("succeeded", "finished")
    assert census.census() == []


@pytest.mark.attack
def test_sigterm_removes_every_sandbox_even_when_the_code_inside_hangs(
    backend_name: str, tmp_path: Path
) -> None:
    """A run that ignores every signal it can and never ends: the drain waits
    `drain_timeout`, cancels it, and the gateway still exits with nothing left (issue 8,
    hole 3: a hung read-back once kept its container past the drain)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    process = GatewayProcess(backend_name, data_dir, drain_timeout=2).start()
    try:
        client = process.client
        code = (
            "import signal, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "while True: time.sleep(1)\n"
        )
        body = {"code": code, "timeout": 300, "background": True, "return_files": ["*"]}
        run_id = client.request("POST", "/v1/runs", body).json()["id"]
        assert wait_for(lambda: status_of(client, run_id) == "running", timeout=60)
        assert wait_for(census.sandboxes_exist, timeout=60)
        assert process.signal(signal.SIGTERM, timeout=60) == 0
        assert census.census() == []
    finally:
        process.stop()
