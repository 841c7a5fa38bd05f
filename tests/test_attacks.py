"""Attacks that must fail, each one a test (issue 3). They run on the Docker backend, the
production sandbox, and on the forkserver backend, which must be as strict; a few also on
the local one where it enforces the same limit."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.settings import SANDBOX_ID
from tests import census
from tests.conftest import BACKENDS, start_gateway
from tests.support import (
    Client,
    GatewayThread,
    serving,
    wait_for,
)

pytestmark = pytest.mark.attack


@pytest.fixture(scope="module", params=[b for b in ("docker", "forkserver") if b in BACKENDS])
def docker(request: pytest.FixtureRequest) -> Iterator[GatewayThread]:
    """A gateway of each strict backend (Docker, forkserver) with small disks, so that
    filling them is quick."""
    server = start_gateway(
        str(request.param),
        workdir_bytes=32 * 1024 * 1024,
        tmp_bytes=32 * 1024 * 1024,
        memory_bytes=256 * 1024 * 1024,
        pids=64,
        max_concurrent_runs=4,
        max_queued_runs=8,
        max_runs_per_user=24,
    )
    yield from serving(server)


@pytest.fixture
def dclient(docker: GatewayThread) -> Client:
    return docker.client()


def test_fork_bomb_is_contained(dclient: Client) -> None:
    record = dclient.run(language="bash", code=":(){ :|:& };:\nsleep 30", timeout=5)
    assert record["status"] == "killed" and record["kill_reason"] == "pids", record["notes"]
    assert dclient.request("GET", "/v1/health").status == 200


def test_python_process_storm_is_contained(dclient: Client) -> None:
    code = (
        "import subprocess, time\n"
        "for _ in range(10000):\n"
        "    try:\n"
        "        subprocess.Popen(['sleep', '60'])\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(60)"
    )
    record = dclient.run(code=code, timeout=4)
    assert record["status"] == "killed" and record["kill_reason"] == "pids", record["notes"]


def test_javascript_process_storm_is_contained(dclient: Client) -> None:
    code = (
        "for (let i = 0; i < 10000; i++) {\n"
        "  try { new Deno.Command('sleep', { args: ['60'] }).spawn(); } catch { /* EAGAIN */ }\n"
        "}\n"
        "await new Promise((resolve) => setTimeout(resolve, 60_000));\n"
    )
    record = dclient.run(language="javascript", code=code, timeout=4)
    assert record["status"] == "killed" and record["kill_reason"] == "pids", record["notes"]
    assert census.after_teardown() == []


@pytest.mark.parametrize(
    "code",
    [
        # signals ignored and the event loop never yields: V8 cannot be interrupted
        "Deno.addSignalListener('SIGTERM', () => {});\n"
        "Deno.addSignalListener('SIGINT', () => {});\n"
        "while (true) {}",
        # children that detach and would outlive the kernel
        "new Deno.Command('setsid', { args: ['sleep', '1000'] }).spawn();\n"
        "new Deno.Command('sh', { args: ['-c', 'nohup sleep 1000 &'] }).spawn();\n"
        "await new Promise((resolve) => setTimeout(resolve, 1_000_000));",
    ],
)
def test_javascript_that_resists_still_ends_at_the_deadline(
    gateway: GatewayThread, code: str
) -> None:
    record = gateway.client().run(language="javascript", code=code, timeout=1.5)
    assert record["status"] == "timed_out" and record["exit_code"] is None, record
    assert census.after_teardown() == []


def test_javascript_output_flood_is_killed_at_the_output_limit(backend_name: str) -> None:
    server = start_gateway(backend_name, output_limit_bytes=4 * 1024 * 1024)
    try:
        client = server.client()
        flood = client.run(
            language="javascript",
            code="for (let i = 0; i < 100; i++) console.log('x'.repeat(100_000));",
            timeout=60,
        )
        assert flood["kill_reason"] == "output_limit", flood["notes"]
        assert client.run(language="javascript", code="console.log(1)")["stdout"] == "1\n"
    finally:
        server.stop()


def test_memory_bomb_is_killed_as_memory(dclient: Client) -> None:
    record = dclient.run(code="x = b'x' * (2 * 1024**3)\nprint('survived')", timeout=30)
    assert record["status"] == "killed" and record["kill_reason"] == "memory", record
    assert "survived" not in record["stdout"]
    assert record["exit_code"] is None


def test_memory_bomb_in_a_child_process(dclient: Client) -> None:
    code = "import subprocess\nsubprocess.run(['python', '-c', \"x = b'x' * (2 * 1024**3)\"], check=True)"
    record = dclient.run(code=code, timeout=30)
    assert record["kill_reason"] == "memory", record


@pytest.mark.parametrize("folder", [".", "/tmp"])
def test_filling_the_disk_stops_at_its_limit(dclient: Client, folder: str) -> None:
    code = (
        "import errno\n"
        "written = 0\n"
        "try:\n"
        f"    with open('{folder}/fill', 'wb') as f:\n"
        "        while written < 512 * 1024 * 1024:\n"
        "            f.write(b'\\0' * (1024 * 1024)); f.flush(); written += 1024 * 1024\n"
        "except OSError as exc:\n"
        "    result = [exc.errno == errno.ENOSPC, written]\n"
    )
    record = dclient.run(code=code, timeout=60)
    full, written = record["result"]
    assert full is True and written <= 32 * 1024 * 1024


def test_the_socket_folder_is_no_storage(dclient: Client) -> None:
    code = (
        "import os, errno\n"
        "socket_dir = os.path.dirname(__import__('json').load(open('/run/gateway/connection.json'))['ip'])\n"
        "try:\n"
        "    with open(socket_dir + '/blob', 'wb') as f:\n"
        "        for _ in range(64): f.write(b'x' * 65536); f.flush()\n"
        "    result = 'wrote 4 MB'\n"
        "except OSError as exc:\n"
        "    result = errno.errorcode[exc.errno]\n"
        "try:\n"
        "    open('/run/gateway/connection.json', 'a')\n"
        "    result = [result, 'connection file writable']\n"
        "except OSError as exc:\n"
        "    result = [result, errno.errorcode[exc.errno]]\n"
    )
    record = dclient.run(code=code)
    # once the kernel has bound its sockets, the folder is no longer its own
    assert record["result"][0] == "EACCES", record
    assert record["result"][1] in ("EROFS", "EACCES"), record


def test_no_network_not_even_the_hosts_loopback(dclient: Client, docker: GatewayThread) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            "out = []\n"
            f"for host, port in [('127.0.0.1', {port}), ('127.0.0.1', {docker.port}), ('172.17.0.1', {docker.port}), ('pypi.org', 443)]:\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=2).close()\n"
            "        out.append('connected')\n"
            "    except OSError as exc:\n"
            "        out.append(type(exc).__name__)\n"
            "result = [out, sorted(n for _, n in socket.if_nameindex())]\n"
        )
        record = dclient.run(code=code, timeout=30)
        outcomes, interfaces = record["result"]
        assert "connected" not in outcomes, outcomes
        assert interfaces == ["lo"]
    finally:
        listener.close()


def test_gateway_environment_and_host_files_stay_hidden(
    dclient: Client, docker: GatewayThread
) -> None:
    os.environ["GATEWAY_TEST_CANARY"] = "canary-value"
    secret = docker.tmp / "secret.txt"
    secret.write_text("host secret")
    try:
        code = (
            "import os, glob\n"
            "try:\n"
            "    env = open('/proc/1/environ','rb').read()\n"
            "except PermissionError:\n"  # forkserver: pid 1 is not dumpable, its /proc is root's
            "    env = b''\n"
            "env += b''.join(os.environ.get(k,'').encode() for k in os.environ)\n"
            f"result = [b'canary' in env, os.path.exists({str(secret)!r}), os.path.exists({str(docker.settings.data_dir)!r}),\n"
            "          os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0],\n"
            "          bool(glob.glob('/var/run/docker.sock'))]\n"
        )
        record = dclient.run(code=code)
        first, count = docker.settings.sandbox_uid, docker.settings.sandbox_uids
        uid = record["result"].pop(3)  # a uid of its own, from the sandboxes' range
        assert first < uid <= first + count, uid
        assert record["result"] == [False, False, False, "0000000000000000", False]
    finally:
        del os.environ["GATEWAY_TEST_CANARY"]


def test_root_is_read_only_and_privileges_cannot_grow(dclient: Client) -> None:
    code = (
        'touch /usr/bin/evil 2>&1; echo "touch=$?"\n'
        "grep -E '^(NoNewPrivs|CapBnd|CapEff|CapPrm|CapAmb|Uid):' /proc/self/status\n"
        "find / -xdev -perm -4000 -type f 2>/dev/null | head -3 | sed 's/^/setuid /'\n"
    )
    record = dclient.run(language="bash", code=code)
    lines = record["stdout"].splitlines()
    assert "Read-only file system" in record["stdout"] and "touch=1" in lines, record
    status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    # no_new_privs: no setuid binary (su, sudo) and no file capability can raise privileges
    assert status["NoNewPrivs"] == "1", status
    # and the bounding set is empty: nothing could be gained even without that flag
    for name in ("CapBnd", "CapEff", "CapPrm", "CapAmb"):
        assert status[name] == "0000000000000000", (name, status)
    # a uid of no host account, never root
    assert SANDBOX_ID < int(status["Uid"].split()[0]) <= SANDBOX_ID + 65536, status


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("import os\nprint('bye', flush=True)\nos._exit(3)", 3),
        ("import ctypes\nctypes.string_at(0)", 139),
    ],
)
def test_a_kernel_crash_is_a_failed_run_not_a_hang(
    gateway: GatewayThread, code: str, exit_code: int
) -> None:
    record = gateway.client().run(code=code, timeout=60)
    # a hang would end at the 60 s timeout as `timed_out`: the status tells, no clock needed
    assert record["status"] == "failed" and record["exit_code"] == exit_code
    assert any("kernel died" in note for note in record["notes"])


def test_many_simultaneous_requests_all_get_an_answer(dclient: Client) -> None:
    def one(i: int) -> tuple[int, dict[str, str], bytes]:
        response = dclient.request(
            "POST", "/v1/runs", {"code": f"import time; time.sleep(1); print({i})"}
        )
        return response.status, response.headers, response.body

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(one, range(24)))
    statuses = sorted(status for status, _, _ in answers)
    assert set(statuses) <= {200, 429, 503}, statuses
    assert statuses.count(200) == 12  # 4 running + 8 queued; the rest are told to retry
    for status, headers, body in answers:
        if status == 200:
            assert json.loads(body)["status"] == "succeeded"
        else:
            assert int(headers["Retry-After"]) >= 1
            assert json.loads(body)["error"]["code"] == "capacity"


def test_two_gateways_on_one_engine_leave_each_other_alone(docker: GatewayThread) -> None:
    response = docker.client().request(
        "POST", "/v1/runs", {"code": "import time; time.sleep(20)", "background": True}
    )
    run_id = response.json()["id"]
    assert wait_for(
        lambda: docker.client().request("GET", f"/v1/runs/{run_id}").json()["status"] == "running",
        timeout=60,
    )
    # its start-up cleans only its own instance
    other = GatewayThread(backend=docker.backend_name).start()
    try:
        assert other.client().run(code="print(2)")["stdout"] == "2\n"
        assert docker.client().request("GET", f"/v1/runs/{run_id}").json()["status"] == "running"
    finally:
        other.stop()
        docker.client().request("DELETE", f"/v1/runs/{run_id}")


def _host_mount(path: Path) -> tuple[str, set[str]]:
    """(fstype, mount options) of the host mount at `path`."""
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            if fields[4] == str(path):
                dash = fields.index("-")
                return fields[dash + 1], set(fields[5].split(","))
    raise AssertionError(f"nothing is mounted at {path}")


def test_a_sandboxs_socket_and_working_folders_are_its_own_tmpfs_and_go_with_it() -> None:
    """No Docker volume per run: the socket folder and the working folder are tmpfs mounts
    in the sandbox's root-only folder, bind-mounted into its container alone, and removed
    with it."""
    server = start_gateway("docker", pool_python=0, pool_bash=0, pool_deno=0)
    try:
        client = server.client()
        instance = server.settings.instance_id
        body = {"code": "import time; time.sleep(600)", "background": True}
        run_id = client.request("POST", "/v1/runs", body).json()["id"]
        running = lambda: client.request("GET", f"/v1/runs/{run_id}").json()["status"] == "running"  # noqa: E731
        assert wait_for(running, timeout=60)  # its kernel is ready
        engine = census._docker_client()
        by_run = {"label": f"gateway.run={run_id}"}
        assert wait_for(lambda: engine.containers.list(filters=by_run), timeout=60)
        (container,) = engine.containers.list(filters=by_run)
        # no libnetwork sandbox nor its hook for a run without network (docker.py)
        assert container.attrs["Config"].get("NetworkDisabled") is True
        mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
        assert {m["Type"] for m in mounts.values()} == {"bind"}, mounts
        sockets, work = Path(mounts["/run/kernel"]["Source"]), Path(mounts["/workspace"]["Source"])
        folder = sockets.parent
        assert work.parent == folder and folder.name.startswith(f"gw{instance[:6]}-")
        info = folder.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o700)  # no other user gets in
        assert _host_mount(sockets)[0] == _host_mount(work)[0] == "tmpfs"
        assert {"nosuid", "nodev", "noexec"} <= _host_mount(sockets)[1]
        assert {"nosuid", "nodev"} <= _host_mount(work)[1]
        # once the kernel has bound its sockets, the folder is no longer its own (sockets.py)
        assert wait_for(lambda: sockets.stat().st_uid == 0, timeout=60)
        assert (sockets.stat().st_uid, sockets.stat().st_mode & 0o777) == (0, 0o755)
        assert engine.volumes.list(filters={"label": f"gateway.instance={instance}"}) == []
        assert client.request("DELETE", f"/v1/runs/{run_id}").json()["status"] == "cancelled"
        assert wait_for(lambda: not folder.exists(), timeout=60)
        assert census.sandbox_mounts() == []
    finally:
        server.stop()


def test_a_run_without_network_still_has_loopback_localhost_and_a_hostname(dclient: Client) -> None:
    """Networking disabled in the engine (no libnetwork sandbox) looks like `none` from inside."""
    code = (
        "import errno, os, socket\n"
        "server = socket.socket(); server.bind(('localhost', 0)); server.listen()\n"
        "socket.create_connection(server.getsockname(), timeout=5).close()\n"
        "try:\n"
        "    open('/etc/hosts', 'a')\n"
        "    hosts = 'writable'\n"
        "except OSError as exc:\n"
        "    hosts = errno.errorcode[exc.errno]\n"
        "result = {'localhost': socket.gethostbyname('localhost'),\n"
        "          'interfaces': sorted(n for _, n in socket.if_nameindex()),\n"
        "          'hostname': open('/etc/hostname').read().strip() == socket.gethostname(),\n"
        "          'hosts': hosts}\n"
    )
    record = dclient.run(code=code)
    assert record["status"] == "succeeded", record
    result = record["result"]
    assert result["localhost"] == "127.0.0.1" and result["interfaces"] == ["lo"], result
    assert result["hostname"] is True and result["hosts"] in ("EROFS", "EACCES"), result
