"""A sandbox's user has a name (issue 33, DESIGN.md "The sandbox user's name"): every
backend shows its kernel a passwd and a group entry for the uid and gid it runs as
(`jovyan` of `users`, as Jupyter's docker-stacks images), and `USER` and `LOGNAME`.

The promises: `getpass.getuser()`, `pwd.getpwuid`, `whoami`, `id -un`, `id -gn` and `ls -l`
name the user and group, in a fresh kernel and in a continuation of a snapshot; the files
are the root file system's own (the image's, or the host's for local) with only those two
entries added, so nothing of the host's accounts shows that did not before; a kernel cannot
change them, nor the host's, nor the next sandbox's; `/etc/shadow` stays unreadable. The
rules that build the files (`accounts.py`) have fast tests of their own."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import docker
from gateway.sandbox import local
from gateway.sandbox.accounts import MAX_BASE_BYTES, MINIMAL_USERS, RootAccounts
from tests.conftest import start_gateway
from tests.support import DOCKER_IMAGE, Client, GatewayThread, forget_snapshots, serving

USER, GROUP = "jovyan", "users"

NAMES = """\
import getpass, grp, os, pwd
entry = pwd.getpwuid(os.getuid())
result = {
    'getuser': getpass.getuser(),
    'pw_name': entry.pw_name,
    'pw_dir': entry.pw_dir,
    'pw_shell': entry.pw_shell,
    'gr_name': grp.getgrgid(os.getgid()).gr_name,
    'USER': os.environ['USER'],
    'LOGNAME': os.environ['LOGNAME'],
    'HOME': os.environ['HOME'],
    'by_name': pwd.getpwnam('jovyan').pw_uid == os.getuid(),
}
"""
BASH_NAMES = "whoami; id -un; id -gn; touch made.txt; ls -l made.txt"


def _names_are_the_users(seen: dict[str, Any]) -> None:
    assert seen["getuser"] == seen["pw_name"] == seen["USER"] == seen["LOGNAME"] == USER, seen
    assert seen["gr_name"] == GROUP, seen
    assert seen["pw_dir"] == seen["HOME"], seen  # `~` is the same with HOME unset
    assert seen["pw_shell"] == "/bin/bash", seen
    assert seen["by_name"], seen  # no other entry of that name comes first


def test_a_fresh_kernel_knows_its_users_name(client: Client) -> None:
    record = client.run(code=NAMES)
    assert record["status"] == "succeeded", record
    _names_are_the_users(record["result"])


def test_bash_names_the_user_and_the_group(client: Client) -> None:
    record = client.run(code=BASH_NAMES, language="bash")
    assert record["status"] == "succeeded", record
    text = "".join(o.get("text", "") for o in record["outputs"] if o["output_type"] == "stream")
    lines = text.splitlines()
    assert lines[:3] == [USER, USER, GROUP], text
    fields = lines[3].split()
    assert (fields[2], fields[3], fields[-1]) == (USER, GROUP, "made.txt"), text


# --- what a sandbox's account files hold, and that it cannot change them ------------------

FILES = """\
import errno, os

def attempt(action):
    try:
        action()
        return 'done'
    except OSError as exc:
        return errno.errorcode[exc.errno]

def read(path):
    try:
        with open(path, 'rb') as f:
            return f.read().decode('utf-8', 'replace')
    except OSError as exc:
        return errno.errorcode[exc.errno]

def append(path):
    with open(path, 'a') as f:
        f.write('mallory:x:0:0::/root:/bin/bash\\n')

def replace(path):
    with open('forged', 'w') as f:
        f.write('mallory:x:0:0::/root:/bin/bash\\n')
    os.rename('forged', path)

result = {
    'passwd': read('/etc/passwd'),
    'group': read('/etc/group'),
    'shadow': read('/etc/shadow'),
    'gshadow': read('/etc/gshadow'),
    'append': [attempt(lambda: append(p)) for p in ('/etc/passwd', '/etc/group')],
    'replace': [attempt(lambda: replace(p)) for p in ('/etc/passwd', '/etc/group')],
    'chmod': attempt(lambda: os.chmod('/etc/passwd', 0o666)),
    'unlink': attempt(lambda: os.unlink('/etc/passwd')),
}
"""


@pytest.fixture(scope="module")
def image_accounts() -> tuple[str, str]:
    """The kernel image's own /etc/passwd and /etc/group, read by the engine directly."""
    engine = docker.from_env(timeout=60)
    try:
        out = engine.containers.run(
            DOCKER_IMAGE,
            ["sh", "-c", "cat /etc/passwd; echo '--'; cat /etc/group"],
            remove=True,
            network_disabled=True,
        )
    finally:
        engine.close()
    passwd, _, group = out.decode().partition("--\n")
    return passwd, group


def _base(backend: str, request: pytest.FixtureRequest) -> tuple[str, str]:
    """What the sandbox's root file system holds (before its own entries are added)."""
    if backend == "local":  # the host's root, shown read-only already
        return Path("/etc/passwd").read_text(), Path("/etc/group").read_text()
    base: tuple[str, str] = request.getfixturevalue("image_accounts")
    return base


@pytest.mark.attack
def test_the_account_files_are_the_roots_own_and_cannot_be_changed(
    gateway: GatewayThread, client: Client, request: pytest.FixtureRequest
) -> None:
    host = (Path("/etc/passwd").read_bytes(), Path("/etc/group").read_bytes())
    record = client.run(code=FILES)
    assert record["status"] == "succeeded", record
    seen = record["result"]
    base_passwd, base_group = _base(gateway.backend_name, request)

    # the root's own lines, and one of the sandbox user's: nothing more of anyone's
    passwd, group = seen["passwd"].splitlines(), seen["group"].splitlines()
    ours = [line for line in passwd if line.startswith(f"{USER}:")]
    assert len(ours) == 1, seen["passwd"]
    uid, gid = ours[0].split(":")[2:4]
    assert int(uid) > 1_000_000_000 and int(gid) >= 1_000_000_000, ours
    assert set(passwd) - set(base_passwd.splitlines()) == set(ours), seen["passwd"]
    assert set(group) - set(base_group.splitlines()) == {f"{GROUP}:x:{gid}:"}, seen["group"]
    assert [line for line in passwd if line.split(":")[2] == uid] == ours
    assert len([line for line in group if line.split(":")[2] == gid]) == 1, seen["group"]
    # the other accounts the root shows stay as they were (root among them)
    assert [line for line in base_passwd.splitlines() if line.startswith("root:")] == [
        line for line in passwd if line.startswith("root:")
    ]

    # nor can the sandbox change them, read the shadow files, or remove the mounts
    assert seen["shadow"] in ("EACCES", "ENOENT") and seen["gshadow"] in ("EACCES", "ENOENT")
    assert all(r in ("EROFS", "EACCES", "EPERM") for r in seen["append"]), seen
    assert all(r in ("EROFS", "EACCES", "EPERM", "EBUSY", "EXDEV") for r in seen["replace"])
    assert seen["chmod"] in ("EROFS", "EPERM") and seen["unlink"] in ("EROFS", "EACCES", "EBUSY")
    assert (Path("/etc/passwd").read_bytes(), Path("/etc/group").read_bytes()) == host

    # the next sandbox's files are its own, as fresh
    after = client.run(code=FILES)
    assert after["status"] == "succeeded", after
    assert "mallory" not in after["result"]["passwd"] + after["result"]["group"]


# --- a continuation of a snapshot (forkserver) ---------------------------------------------

ALICE = "alice-token-accounts-0123456789"


@pytest.fixture(scope="module")
def forked() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver", users={ALICE: ("alice", "user")}))


@pytest.fixture
def alice(forked: GatewayThread) -> Iterator[Client]:
    yield forked.client(ALICE)
    forget_snapshots(forked)


@pytest.mark.parametrize("language", ["python", "bash"])
def test_a_continued_kernel_knows_its_users_name(alice: Client, language: str) -> None:
    first = alice.run(code="x = 1" if language == "python" else "x=1", language=language, keep=True)
    assert first["status"] == "succeeded" and first["snapshot"] is not None, first
    snapshot = first["snapshot"]["id"]
    code = NAMES if language == "python" else BASH_NAMES
    record = alice.run(code=code, language=language, **{"from": snapshot})
    assert record["status"] == "succeeded" and record["continued_from"] == snapshot, record
    if language == "python":
        _names_are_the_users(record["result"])
        return
    text = "".join(o.get("text", "") for o in record["outputs"] if o["output_type"] == "stream")
    lines = text.splitlines()
    assert lines[:3] == [USER, USER, GROUP], text
    assert lines[3].split()[2:4] == [USER, GROUP], text


# --- a local kernel without bubblewrap (no mount namespace: the host's files) ------------

FALLBACK = """\
import getpass, os, pwd
try:
    entry = pwd.getpwuid(os.getuid()).pw_name
except KeyError:
    entry = None
result = [getpass.getuser(), os.environ['USER'], os.environ['LOGNAME'], entry]
"""


def test_a_local_kernel_without_bubblewrap_is_named_as_the_host_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without bubblewrap there is no mount namespace to give a file in: the kernel sees the
    host's accounts, and `USER` and `LOGNAME` agree with them (tested with the kernel as the
    gateway's own user: as another uid, the venv of a checkout may be out of its reach)."""
    bare = local.LocalFeatures(bwrap=None, cgroups=False, drop_to=None)
    monkeypatch.setattr(local, "probe_features", lambda settings: bare)
    server = start_gateway("local")
    try:
        record = server.client().run(code=FALLBACK)
    finally:
        server.stop()
    assert record["status"] == "succeeded", record
    host = pwd.getpwuid(os.getuid()).pw_name
    assert record["result"] == [host, host, host, host], record["result"]


# --- the rules (fast) ----------------------------------------------------------------------

BASE_PASSWD = b"""root:x:0:0:root:/root:/bin/bash
jovyan:x:1000:100::/home/jovyan:/bin/bash
old:x:1000000005:7::/:/bin/sh

other:x:1001:1001::/home/other:/bin/sh
"""
BASE_GROUP = b"root:x:0:\nusers:x:100:\nstaff:x:1000000000:\n"


@pytest.mark.fast
def test_the_sandboxs_entries_take_the_place_of_any_of_their_name_or_id() -> None:
    base = RootAccounts.parse(BASE_PASSWD, BASE_GROUP, b"/bin/sh\n/bin/bash\n")
    files = base.for_sandbox(1_000_000_005, 1_000_000_000, "/tmp")
    assert files.passwd.splitlines() == [
        "root:x:0:0:root:/root:/bin/bash",
        "other:x:1001:1001::/home/other:/bin/sh",
        "jovyan:x:1000000005:1000000000::/tmp:/bin/bash",
    ]
    assert files.group.splitlines() == ["root:x:0:", "users:x:1000000000:"]


@pytest.mark.fast
def test_a_root_without_account_files_gets_the_minimal_ones(tmp_path: Path) -> None:
    empty = RootAccounts.read(tmp_path)  # no etc at all
    files = empty.for_sandbox(1_000_000_001, 1_000_000_000, "/tmp")
    assert files.passwd == MINIMAL_USERS + "jovyan:x:1000000001:1000000000::/tmp:/bin/sh\n"
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_bytes(b"x" * (MAX_BASE_BYTES + 1))  # too large: not copied
    (tmp_path / "etc/group").symlink_to("/etc/group")  # a link is not followed
    (tmp_path / "etc/shells").write_text("/bin/bash\n")
    found = RootAccounts.read(tmp_path)
    assert found == RootAccounts(shell="/bin/bash")
