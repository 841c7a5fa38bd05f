"""A kernel holds no supplementary group, whatever groups the gateway holds (DESIGN.md,
"Tenant → host": kernels run as a dedicated uid/gid, "no supplementary groups"): issue 30,
item 5. The suite's gateways run as root with no supplementary group, so a drop that kept
the gateway's groups went unseen; here the gateway runs in a process of its own started with
one, shadow's (42, as in the kernel image), and a run reads its kernel's `Groups:` line and
tries the root file system's `/etc/shadow` (root:shadow 0640: the image's, or the host's on
the local backend).

Checked by mutation, each failing the test of its backend:
- forkserver: `os.setgroups([])` removed from `kernels/zygote.py` `_drop` (the warm parents,
  started by the gateway, inherit its groups and so does every kernel they fork);
- local: `setpriv --clear-groups` turned into `--keep-groups` (`sandbox/local.py`);
- Docker: the engine makes the container, not the gateway, so the gateway's groups never
  reach it; the test holds it to the same promise (a container given the gateway's groups,
  `group_add`, fails it)."""

from __future__ import annotations

import grp
import subprocess
import sys
from pathlib import Path

import pytest

from tests import census
from tests.support import DOCKER_IMAGE, GatewayProcess, answers, wait_for

pytestmark = pytest.mark.attack


def shadow_gid() -> int:
    """The group that may read /etc/shadow: 42 in Debian and in the kernel image."""
    try:
        return grp.getgrnam("shadow").gr_gid
    except KeyError:
        return 42


HELD = shadow_gid()

READ = """
import os
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
try:
    with open('/etc/shadow') as shadow:
        shadow_read = len(shadow.read())
except OSError as exc:
    shadow_read = type(exc).__name__
result = {'groups': status['Groups'].split(), 'getgroups': os.getgroups(),
          'gid': os.getgid(), 'shadow': shadow_read}
"""


class GatewayWithGroups(GatewayProcess):
    """`gateway serve` in a process of its own started with supplementary `groups` (what a
    gateway run by an account in, say, the shadow or docker group holds)."""

    def __init__(self, backend: str, data_dir: Path, groups: list[int]) -> None:
        super().__init__(backend, data_dir)
        self.groups = groups

    def start(self) -> GatewayWithGroups:
        command = [sys.executable, "-m", "gateway", "serve", "--backend", self.backend]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        command += ["--instance-id", self.instance, "--docker-image", DOCKER_IMAGE]
        for name, value in self.settings.items():
            command += ["--" + name.replace("_", "-"), str(value)]
        with (self.data_dir / "gateway.log").open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=log, extra_groups=self.groups
            )
        census.own(self.process.pid, f"the gateway process on port {self.port}")
        census.PROCESS_INSTANCES[self.instance] = self.process
        assert wait_for(lambda: answers(self.client), timeout=60), self.log()
        return self


def test_a_kernel_keeps_none_of_the_gateways_supplementary_groups(
    backend_name: str, tmp_path: Path
) -> None:
    server = GatewayWithGroups(backend_name, tmp_path, [HELD]).start()
    try:
        held = Path(f"/proc/{server.pid}/status").read_text()
        assert str(HELD) in _groups(held), held  # the gateway does hold it
        response = server.client.request("POST", "/v1/runs", {"code": READ})
        assert response.status == 200, response.body[:2000]
        record = response.json()
    finally:
        server.stop()
    assert record["status"] == "succeeded", record
    seen = record["result"]
    # none but its own gid (Docker lists that one as a supplementary group too)
    assert set(seen["getgroups"]) <= {seen["gid"]}, seen
    assert [int(g) for g in seen["groups"]] == seen["getgroups"], seen
    assert seen["shadow"] == "PermissionError", seen


def _groups(status: str) -> list[str]:
    for line in status.splitlines():
        if line.startswith("Groups:"):
            return line.split()[1:]
    return []
