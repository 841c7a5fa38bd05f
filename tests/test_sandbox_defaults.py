"""What a kernel's sandbox really is, read from inside a run: the documented defaults
(API.md, "Sandbox defaults": 1 CPU, 1 GiB memory, 256 processes, no network, read-only
root, non-root user, no capabilities, no new privileges) as the Linux kernel enforces them
on both backends, and what the local backend hides (README, "What each backend isolates":
the gateway's data dir, workspaces and token file; /run, /root, /home)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.sandbox.local import LocalBackend
from gateway.settings import Settings
from tests import needs
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, write_tokens

pytestmark = pytest.mark.attack

GiB = 1024**3

# Inside the run: the limits of the cgroup this very process is in. Its folder is found by
# its pid in `cgroup.procs` (a container sees its own cgroup at the mount; a local sandbox,
# in a cgroup namespace, sees the hierarchy and finds its `gateway-*` folder there).
PROBE = r"""
import glob, os, errno, socket

def own_folder(base):
    me = str(os.getpid())
    for folder in [base, *sorted(glob.glob(base + '/*/'))]:
        try:
            with open(os.path.join(folder, 'cgroup.procs')) as f:
                if me in f.read().split():
                    return folder.rstrip('/')
        except OSError:
            pass
    return None

def read(folder, name):
    try:
        with open(os.path.join(folder, name)) as f:
            return f.read().strip()
    except (OSError, TypeError):
        return None

if os.path.exists('/sys/fs/cgroup/cgroup.controllers'):
    unified = own_folder('/sys/fs/cgroup')
    memory = pids = cpu = unified
    quota, _, period = (read(cpu, 'cpu.max') or ' ').partition(' ')
    limits = {'memory': read(memory, 'memory.max'), 'swap': read(memory, 'memory.swap.max')}
else:
    memory, pids, cpu = (own_folder('/sys/fs/cgroup/' + c) for c in ('memory', 'pids', 'cpu'))
    quota, period = read(cpu, 'cpu.cfs_quota_us'), read(cpu, 'cpu.cfs_period_us')
    limits = {'memory': read(memory, 'memory.limit_in_bytes'),
              'memsw': read(memory, 'memory.memsw.limit_in_bytes')}
limits.update(pids=read(pids, 'pids.max'), quota=quota, period=period,
              folders=[memory, pids, cpu])
with open('/proc/self/status') as f:
    status = dict(line.split(':\t', 1) for line in f.read().splitlines() if ':\t' in line)
try:
    open('/usr/lib/gateway-probe', 'w')
    root = 'writable'
except OSError as exc:
    root = errno.errorcode[exc.errno]
work = os.statvfs('.')
result = {
    'limits': limits,
    'status': {k: status[k].split() for k in ('Uid', 'Gid', 'NoNewPrivs', 'CapEff', 'CapBnd')},
    'root': root,
    'interfaces': sorted(name for _, name in socket.if_nameindex()),
    'workdir_bytes': work.f_blocks * work.f_frsize,
}
"""


def test_the_documented_defaults_are_the_settings_defaults() -> None:
    defaults = Settings()
    assert (defaults.cpus, defaults.memory_bytes, defaults.pids) == (1.0, GiB, 256)
    assert defaults.workdir_bytes == GiB and defaults.allow_network is False
    assert defaults.sandbox_uid == defaults.sandbox_gid == 1_000_000_000
    assert defaults.sandbox_uids == 65536 and defaults.workspace_bytes == GiB


def test_a_kernel_runs_under_the_default_limits(gateway: GatewayThread, client: Client) -> None:
    """The session's gateway runs with default settings: read what its kernel really gets."""
    settings = gateway.settings
    assert (settings.cpus, settings.memory_bytes, settings.pids) == (1.0, GiB, 256)
    if gateway.backend_name == "local":
        backend = gateway.gateway.services.backend if gateway.gateway.services else None
        assert isinstance(backend, LocalBackend)
        if not backend.features.cgroups:
            needs.missing(
                "cgroups",
                "the local backend gets no cgroup on this machine (it needs root and the "
                "memory, pids and cpu controllers), so it has no limits to read",
            )
    record = client.run(code=PROBE)
    assert record["status"] == "succeeded", record
    seen: dict[str, Any] = record["result"]
    limits = seen["limits"]
    assert None not in limits["folders"], limits  # each controller's own cgroup was found
    if gateway.backend_name == "local":
        assert all("/gateway-gw" in folder for folder in limits["folders"]), limits

    assert int(limits["memory"]) == GiB, limits
    if limits.get("swap") is not None:  # cgroup v2: no swap at all
        assert limits["swap"] == "0", limits
    if limits.get("memsw") is not None:  # v1 with swap accounting: memory + swap = memory
        assert int(limits["memsw"]) == GiB, limits
    assert limits["pids"] == "256", limits
    assert int(limits["quota"]) / int(limits["period"]) == 1.0, limits

    status = seen["status"]
    # a uid of its own (real, effective, saved, fs alike), from the sandboxes' range
    uid, gid = int(status["Uid"][0]), settings.sandbox_gid
    assert settings.sandbox_uid < uid <= settings.sandbox_uid + settings.sandbox_uids, status
    assert status["Uid"] == [str(uid)] * 4 and status["Gid"] == [str(gid)] * 4, status
    assert uid != 0 and gid != 0
    assert status["NoNewPrivs"] == ["1"], status
    assert status["CapEff"] == status["CapBnd"] == ["0000000000000000"], status
    assert seen["root"] == "EROFS", seen
    assert seen["interfaces"] == ["lo"], seen
    if gateway.backend_name == "docker":  # the local working folder has no size (README)
        assert seen["workdir_bytes"] == GiB, seen


# --- what the local backend hides ---------------------------------------------------------

TOKEN = "hidden-token-0123456789abcdef"


@pytest.fixture
def exposed_root() -> Iterator[Path]:
    """A folder outside /tmp (which every local sandbox replaces with its own), readable by
    everyone: what a sandbox cannot see of it is hidden by the sandbox, not by modes."""
    root = Path(tempfile.mkdtemp(prefix="gwhide-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _readable_by_all(path: Path) -> None:
    for folder, _, names in os.walk(path):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)


def _on_the_way_to_python(folder: str) -> set[str]:
    """The names in `folder` that lead to the Python installation the kernel needs."""
    names = set()
    for needed in {sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)}:
        if needed.startswith(folder + "/"):
            names.add(Path(needed).relative_to(folder).parts[0])
    return names


HIDE_PROBE = r"""
import errno, os

def seen(path):
    try:
        if os.path.isdir(path):
            return sorted(os.listdir(path))
        with open(path, 'rb') as f:
            return f.read().decode(errors='replace')
    except OSError as exc:
        return errno.errorcode[exc.errno]

result = {path: seen(path) for path in PATHS}
result['.'] = sorted(os.listdir('.'))
"""


def test_the_local_sandbox_hides_the_gateways_files_and_the_hosts(exposed_root: Path) -> None:
    data, workspaces = exposed_root / "data", exposed_root / "ws"
    tokens = write_tokens(exposed_root / "etc", {TOKEN: ("ann", "user")})
    (workspaces / "bob").mkdir(parents=True)
    (workspaces / "bob" / "secret.txt").write_text("bob's secret")
    (workspaces / "ann").mkdir()
    (workspaces / "ann" / "mine.txt").write_text("ann's own")
    server = start_gateway("local", data_dir=data, workspaces=workspaces, tokens=tokens)
    try:
        assert (data / "runs.sqlite3").exists()
        _readable_by_all(exposed_root)
        host = {path: sorted(os.listdir(path)) for path in ("/root", "/home", "/run")}
        paths = [
            str(data),
            str(data / "runs.sqlite3"),
            str(workspaces),
            str(workspaces / "bob" / "secret.txt"),
            str(workspaces / "ann" / "mine.txt"),
            str(tokens),
            "/run",
            "/run/docker.sock",
            "/var/run/docker.sock",
            "/root",
            "/home",
        ]
        code = f"PATHS = {paths!r}\n{HIDE_PROBE}"
        record = server.client(TOKEN).run(code=code, working_dir=".")
        assert record["status"] == "succeeded", record
        seen = record["result"]
    finally:
        server.stop()
    # the run's own workspace is its working folder; nothing else of the gateway shows
    assert seen["."] == ["mine.txt"], seen
    assert "runs.sqlite3" not in seen[str(data)], seen  # only the font cache it needs
    assert seen[str(data / "runs.sqlite3")] == "ENOENT", seen
    assert seen[str(workspaces)] == [], seen
    assert seen[str(workspaces / "bob" / "secret.txt")] == "ENOENT", seen
    assert seen[str(workspaces / "ann" / "mine.txt")] == "ENOENT", seen
    # /dev/null in its place (which a nodev mount may even refuse to open)
    assert seen[str(tokens)] in ("", "EACCES"), seen
    assert TOKEN not in repr(seen), seen
    for path in ("/run", "/root", "/home"):
        # empty, but for the way to the Python the kernel runs on (a venv under /root, say)
        assert isinstance(seen[path], list), (path, seen[path])
        assert set(seen[path]) <= _on_the_way_to_python(path), (path, seen[path], host[path])
    assert seen["/run/docker.sock"] == seen["/var/run/docker.sock"] == "ENOENT", seen
