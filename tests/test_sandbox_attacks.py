"""Hostile tenants against the sandboxes (issue 8, the holes on the sandbox side).

Each test is an attack that succeeded before the fix; each runs on every backend it
applies to. The HTTP-edge holes (CSRF, JSON, slow clients, record caps, upload quotas) have
their own module.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import docker
from gateway.sandbox import cgroup, local
from gateway.settings import SANDBOX_ID
from tests.api import assert_error, poll_run
from tests.conftest import require_backend, start_gateway
from tests.support import Client, GatewayThread, serving, wait_for, write_tokens

pytestmark = pytest.mark.attack

MiB = 1024 * 1024
GiB = 1024 * MiB


@pytest.fixture
def workspaces(backend_name: str, tmp_path: Path) -> Iterator[GatewayThread]:
    """A gateway with persistent workspaces and one run slot (the next run waits)."""
    yield from serving(
        start_gateway(backend_name, workspaces=tmp_path / "ws", max_concurrent_runs=1)
    )


def fingerprint(folder: Path) -> dict[str, Any]:
    """Owner, mode and contents of a folder and what it holds."""
    found: dict[str, Any] = {}
    for path in [folder, *sorted(folder.rglob("*"))]:
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        found[str(path)] = (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), content)
    return found


# --- hole 1: a workspace swapped for a link while a run waits -------------------------------


def test_a_workspace_swapped_for_a_link_while_a_run_waits_is_refused(
    workspaces: GatewayThread, tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o750)
    (victim / "keep.txt").write_text("host data")
    before = fingerprint(victim)
    client = workspaces.client()
    made = client.run(code="import os\nos.makedirs('proj', exist_ok=True)", working_dir=".")
    assert made["status"] == "succeeded", made
    # A holds the only slot while it swaps `proj` for a link to the victim...
    swap = (
        "import os, shutil, time\n"
        "time.sleep(1)\n"
        "shutil.rmtree('proj')\n"
        f"os.symlink({str(victim)!r}, 'proj')\n"
    )
    first = client.request(
        "POST", "/v1/runs", {"code": swap, "working_dir": ".", "background": True}
    )
    assert first.status == 202
    # ...while B, queued behind it, names `proj` (still a real folder when B arrives)
    queued = {
        "code": "open('pwned.txt', 'w').write('x')",
        "working_dir": "proj",
        "files": [{"path": "staged.txt", "content": "x"}],
        "return_files": ["keep.txt"],
        "background": True,
    }
    second = client.request("POST", "/v1/runs", queued)
    assert second.status == 202 and second.json()["status"] == "queued", second.body
    assert poll_run(client, first.json()["id"])["status"] == "succeeded"
    record = poll_run(client, second.json()["id"])
    assert record["status"] == "failed", record
    assert any("link" in note for note in record["notes"]), record["notes"]
    assert fingerprint(victim) == before


def test_workspace_files_belong_to_no_host_account_and_the_mount_is_nosuid(
    workspaces: GatewayThread, tmp_path: Path
) -> None:
    code = (
        "open('made.txt', 'w').write('x')\n"
        "import os\n"
        "here = os.getcwd()\n"
        "result = [line.split()[5] + ',' + line.split(' - ')[1].split()[2]\n"
        "          for line in open('/proc/self/mountinfo') if line.split()[4] == here]\n"
    )
    record = workspaces.client().run(code=code, working_dir="proj")
    assert record["status"] == "succeeded", record
    made = tmp_path / "ws" / "local" / "proj" / "made.txt"
    # the user's own uid, above the range sandboxes take one each from
    first_user_uid = SANDBOX_ID + workspaces.settings.sandbox_uids + 1
    assert made.stat().st_uid >= first_user_uid and made.stat().st_gid == SANDBOX_ID
    with pytest.raises(KeyError):
        pwd.getpwuid(made.stat().st_uid)
    options = set(",".join(record["result"]).split(","))
    assert {"nosuid", "nodev"} <= options, record["result"]


# --- hole 3: modules planted in a workspace never run with the gateway's authority ---------

PLANTED = {
    "sitecustomize.py": "sitecustomize",
    "usercustomize.py": "usercustomize",
    "ipykernel_launcher.py": "ipykernel_launcher",
    "kernels/__init__.py": "kernels",
    "kernels/python/__init__.py": "kernels.python",
    "kernels/python/startup.py": "kernels.python.startup",
    "kernels/python/launch.py": "kernels.python.launch",
    "kernels/python/prebuilt.py": "kernels.python.prebuilt",
    "kernels/bash/__init__.py": "kernels.bash",
    "kernels/bash/__main__.py": "kernels.bash.__main__",
    "kernels/returnfiles.py": "kernels.returnfiles",
}


def planted_module(name: str) -> str:
    return (
        "import os\n"
        f"open(os.path.join(os.environ.get('HOME', '/tmp'), 'ran-{name}'), 'w').close()\n"
        f"open('ran-{name}', 'w').close()\n"
        "os._exit(7)\n"
    )


@pytest.mark.parametrize("language", ["python", "bash"])
def test_modules_planted_in_a_workspace_never_run_at_start_or_read_back(
    workspaces: GatewayThread, tmp_path: Path, language: str
) -> None:
    client = workspaces.client()
    files = [{"path": path, "content": planted_module(name)} for path, name in PLANTED.items()]
    planted = client.run(code="print('planted')", working_dir=".", files=files)
    assert planted["status"] == "succeeded", planted
    code = "print('fine')" if language == "python" else "echo fine"
    record = client.run(
        language=language, code=code, working_dir=".", return_files=["*.txt"], timeout=20
    )
    assert record["status"] == "succeeded" and record["stdout"] == "fine\n", record
    left = sorted(
        p.name for p in (tmp_path / "ws" / "local").iterdir() if p.name.startswith("ran-")
    )
    assert left == []


# --- hole 4: the local backend never hands out root -----------------------------------------


def test_local_kernels_are_not_root_and_see_no_host_secrets(tmp_path: Path) -> None:
    server = start_gateway("local", tokens=write_tokens(tmp_path, {"t" * 20: ("ann", "user")}))
    try:
        code = (
            "import os, socket\n"
            "def reach(path):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(path); return True\n"
            "    except OSError:\n"
            "        return False\n"
            "result = {'uid': os.getuid(), 'gid': os.getgid(),\n"
            "          'docker': reach('/var/run/docker.sock') or reach('/run/docker.sock'),\n"
            "          'root': os.listdir('/root'), 'home': os.listdir('/home'),\n"
            "          'run': os.listdir('/run')}\n"
        )
        record = server.client("t" * 20).run(code=code)
        seen = record["result"]
        # /root shows only the way to the folders the kernel's Python lives in
        needed = {sys.prefix, sys.base_prefix}
        ways = {Path(p).relative_to("/root").parts[0] for p in needed if p.startswith("/root/")}
        assert set(seen.pop("root")) <= ways, record
        # a uid of its own, from the sandboxes' range: no host account, never root
        assert SANDBOX_ID < seen.pop("uid") <= SANDBOX_ID + server.settings.sandbox_uids
        assert seen == {
            "gid": SANDBOX_ID,
            "docker": False,
            "home": [],
            "run": [],
        }
    finally:
        server.stop()


def refusal(**overrides: Any) -> str:
    """The message of a gateway that refuses to start with these settings."""
    with pytest.raises(RuntimeError) as refused:
        GatewayThread(**overrides).start().stop()
    return str(refused.value)


def test_multi_user_never_falls_back_to_local_silently(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path, {"t" * 20: ("ann", "user"), "u" * 20: ("bob", "user")})
    message = refusal(backend="auto", tokens=tokens, docker_image="gateway-kernel:no-such-tag")
    assert "--allow-local-multi-user" in message and "docker/build.sh" in message
    message = refusal(backend="local", tokens=tokens, allow_local_multi_user=False)
    assert "--allow-local-multi-user" in message
    message = refusal(backend="local", tokens=tokens, allow_network=True)
    assert "--allow-network" in message
    # one user behind a token (what `gateway mcp` does for its own port) is no tenant mix
    alone = write_tokens(tmp_path / "alone", {"t" * 20: ("ann", "user")})
    GatewayThread(backend="local", tokens=alone, allow_local_multi_user=False).start().stop()


def test_multi_user_local_needs_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = local.LocalFeatures(bwrap=None, cgroups=True, drop_to=(SANDBOX_ID, SANDBOX_ID))
    monkeypatch.setattr(local, "probe_features", lambda settings: bare)
    tokens = write_tokens(tmp_path, {"t" * 20: ("ann", "user"), "u" * 20: ("bob", "user")})
    assert "bubblewrap" in refusal(backend="local", tokens=tokens)


def test_network_runs_need_a_network_of_their_own_on_docker() -> None:
    require_backend("docker")
    assert "--docker-network" in refusal(backend="docker", allow_network=True)
    message = refusal(backend="docker", allow_network=True, docker_network="host")
    assert "host's network" in message


# --- hole 6: a kernel's messages are hostile input ------------------------------------------

FOREIGN_FLOOD = (
    "import time\n"
    "k = get_ipython().kernel\n"
    "parent = {'header': {'msg_id': 'not-this-run', 'msg_type': 'execute_request',\n"
    "          'session': 's', 'username': 'u', 'date': '', 'version': '5.3'}}\n"
    "for _ in range(100):\n"
    "    k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 'x' * 100_000},\n"
    "                   parent=parent)\n"
    "time.sleep(60)\n"
)


def test_output_sent_for_another_request_counts_against_the_limit(backend_name: str) -> None:
    server = start_gateway(backend_name, output_limit_bytes=4 * MiB)
    try:
        record = server.client().run(code=FOREIGN_FLOOD, timeout=30)
        assert record["kill_reason"] == "output_limit", record["notes"]
        assert record["stdout"] == "", "output for another request is never shown"
    finally:
        server.stop()


def test_a_message_over_the_size_limit_cannot_hurt_the_gateway(client: Client) -> None:
    code = (
        "k = get_ipython().kernel\n"
        "k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 'x' * 40_000_000},\n"
        "               parent=k.get_parent())\n"
        "print('after')\n"
    )
    record = client.run(code=code, timeout=30)
    assert record["status"] in ("succeeded", "killed"), record
    assert "x" * 1000 not in record["stdout"]
    assert client.run(code="print('next')")["stdout"] == "next\n"


# --- hole 8: no container log on the host ---------------------------------------------------


def test_a_kernel_writing_to_its_container_stdout_fills_no_host_log(dclient: Client) -> None:
    response = dclient.request(
        "POST",
        "/v1/runs",
        {
            "code": "import os, time\nos.write(1, b'x' * 5_000_000)\ntime.sleep(60)",
            "background": True,
        },
    )
    run_id = response.json()["id"]
    poll_run(dclient, run_id, until=lambda r: r["status"] == "running")
    engine = docker.from_env()
    try:
        label = {"label": f"gateway.run={run_id}"}
        assert wait_for(lambda: engine.containers.list(filters=label), timeout=30)
        found = engine.containers.list(filters=label)
        assert len(found) == 1
        attrs = found[0].attrs
        assert attrs["HostConfig"]["LogConfig"]["Type"] == "none"
        # created detached: the engine attaches nothing to its stdio either
        assert (attrs["Config"]["AttachStdout"], attrs["Config"]["AttachStderr"]) == (False, False)
        log = attrs.get("LogPath") or ""
        assert not log or not os.path.exists(log) or os.path.getsize(log) == 0
    finally:
        engine.close()
        dclient.request("DELETE", f"/v1/runs/{run_id}")


@pytest.fixture
def dclient() -> Iterator[Client]:
    server = start_gateway("docker")
    try:
        yield server.client()
    finally:
        server.stop()


# --- hole 11: special files in a workspace --------------------------------------------------


def test_a_fifo_in_a_workspace_is_refused_without_blocking(workspaces: GatewayThread) -> None:
    client = workspaces.client()
    assert client.run(code="import os\nos.mkfifo('pipe')", working_dir=".")["status"] == "succeeded"
    response = client.request(
        "POST",
        "/v1/runs",
        {"code": "print(1)", "working_dir": ".", "files": [{"path": "pipe", "content": "x"}]},
        timeout=30,
    )
    assert_error(response, 400, "invalid_path", "pipe")
    record = client.run(code="print(1)", working_dir=".", return_files=["pipe"], timeout=30)
    assert record["files"] == [{"path": "pipe", "size": None, "error": "not a regular file"}]


# --- hole 13, the smaller ones --------------------------------------------------------------


def test_a_deep_glob_walk_is_bounded(client: Client) -> None:
    code = (
        "import os\n"
        "for d in range(120):\n"
        "    os.makedirs(f'd{d}')\n"
        "    for f in range(100):\n"
        "        open(f'd{d}/f{f}', 'w').close()\n"
    )
    record = client.run(code=code, return_files=["**/wanted.txt"], timeout=60)
    assert record["status"] == "succeeded", record
    assert record["files"] == [{"path": "**/wanted.txt", "size": None, "error": "no file matches"}]
    assert any("stopped after 10000 entries" in note for note in record["notes"]), record["notes"]


def test_co_mounted_cgroup_v1_controllers_keep_their_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the layout of a cgroup v1 host whose cpu and cpuacct are one hierarchy
    for name in ("memory", "pids", "cpu,cpuacct"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").touch()
    (tmp_path / "cpu").symlink_to("cpu,cpuacct")
    (tmp_path / "cpuacct").symlink_to("cpu,cpuacct")
    monkeypatch.setattr(cgroup, "ROOT", tmp_path)
    group = cgroup.Cgroup.create("gateway-test", 64 * MiB, 32, 0.5)
    assert group is not None, "the limits silently vanished"
    assert (tmp_path / "memory/gateway-test/memory.limit_in_bytes").read_text() == str(64 * MiB)
    assert (tmp_path / "pids/gateway-test/pids.max").read_text() == "32"
    assert (tmp_path / "cpu,cpuacct/gateway-test/cpu.cfs_quota_us").read_text() == "50000"
    assert len(group.proc_files) == 3  # one per hierarchy: the pid is written once to each


def test_without_a_cgroup_rlimits_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = local.probe_features

    def without_cgroups(settings: Any) -> local.LocalFeatures:
        found = probe(settings)
        return local.LocalFeatures(bwrap=found.bwrap, cgroups=False, drop_to=found.drop_to)

    monkeypatch.setattr(local, "probe_features", without_cgroups)
    # uids of their own, which no earlier sandbox of the session ran as: a process of a
    # destroyed sandbox reparented to this harness (a subreaper) stays a zombie of its uid,
    # and a later sandbox of that uid counts it in `what the uid already runs`
    server = start_gateway(
        "local",
        memory_bytes=512 * MiB,
        workdir_bytes=64 * MiB,
        pids=64,
        sandbox_uid=SANDBOX_ID + 10_000_000,
        sandbox_uids=16,
    )
    try:
        record = server.client().run(
            language="bash", code="ulimit -v; ulimit -f; ulimit -u", timeout=30
        )
        virtual, fsize, nproc = record["stdout"].split()
        # README, "What each backend isolates": the memory limit but at least 4 GiB of
        # address space, the working folder's size per file, the pids limit plus 128 and
        # what the uid already runs (a uid of its own, as root: nothing)
        assert int(virtual) * 1024 == 4 * GiB  # `ulimit -v` and `-f` count KiB in bash
        assert int(fsize) * 1024 == 64 * MiB
        if os.geteuid() == 0:
            assert int(nproc) == 64 + 128
        else:  # the gateway's own uid, and what it runs
            assert int(nproc) > 64 + 128
    finally:
        server.stop()


# --- hole 7, inside the kernel: a huge error or display arrives cut, not lost -------------


def test_a_huge_error_or_display_arrives_cut_instead_of_lost(client: Client) -> None:
    record = client.run(code="raise ValueError('A' * 30_000_000)", timeout=60)
    assert record["status"] == "failed" and not record["timed_out"], record["notes"]
    error = record["error"]
    assert error["ename"] == "ValueError" and "characters truncated" in error["evalue"]
    assert len(error["evalue"]) < 70_000
    assert sum(map(len, error["traceback"])) < 2 * 1024 * 1024
    assert [o["output_type"] for o in record["outputs"]] == ["error"]
    shown = client.run(code="from IPython.display import HTML\nHTML('<b>' * 10_000_000)")
    assert shown["status"] == "succeeded", shown["notes"]
    (output,) = shown["outputs"]
    assert "was not sent" in output["data"]["text/plain"] and "text/html" not in output["data"]
