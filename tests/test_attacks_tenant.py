"""Tenants against each other and the host, the leftovers of issue 20 (rows 6, 7 and 8 and
the shared uid): a workspace's size, user names that shared a folder, what a local sandbox
saw of other sandboxes and of the gateway, and per-uid kernel counters shared by all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.auth import TokenTable, user_folder
from tests.api import poll_run, write_tokens
from tests.conftest import start_gateway

pytestmark = pytest.mark.attack

MiB = 1024 * 1024


def tokens_for(folder: Path, *users: str) -> tuple[Path, dict[str, str]]:
    """A token file with one user token per name; the tokens by user."""
    table = {f"token-{i:02d}-0123456789abcdef": name for i, name in enumerate(users)}
    path = write_tokens(folder, {t: (name, "user") for t, name in table.items()})
    return path, {name: token for token, name in table.items()}


# --- row 7: user names map to folders one to one ------------------------------------------

LOOKALIKES = [("ann", ".ann"), ("a_b", "a b"), ("x_y", "x@y"), ("ann", "..ann"), ("_", "")]


def test_user_names_that_look_alike_get_folders_of_their_own(tmp_path: Path) -> None:
    names = sorted({name for pair in LOOKALIKES for name in pair})
    tokens, token_of = tokens_for(tmp_path / "etc", *names)
    server = start_gateway("local", tokens=tokens, workspaces=tmp_path / "ws")
    try:
        for first, second in LOOKALIKES:
            mine = server.client(token_of[first]).run(
                code=f"open('secret.txt', 'w').write({first!r})", working_dir="."
            )
            assert mine["status"] == "succeeded", mine
            theirs = server.client(token_of[second]).run(
                code="import os\nresult = sorted(os.listdir('.'))", working_dir="."
            )
            assert theirs["status"] == "succeeded", theirs
            assert "secret.txt" not in theirs["result"], (first, second, theirs["result"])
            # and back: the second's own file is not the first's either
            server.client(token_of[second]).run(
                code=f"open('secret.txt', 'w').write({second!r})", working_dir="."
            )
            again = server.client(token_of[first]).run(
                code="result = open('secret.txt').read()", working_dir="."
            )
            assert again["result"] == first, (first, second, again)
    finally:
        server.stop()


def test_user_folders_are_one_to_one_and_never_hidden_names() -> None:
    names = ["ann", ".ann", "..", ".", "", "a b", "a_b", "x@y", "x_y", "~61", "a", "é", "\udc80"]
    names += ["A", "a.b", "a-b", "-", "_", "~", "ann/..", "ann\x00"]
    folders = [user_folder(name) for name in names]
    assert len(set(folders)) == len(names), dict(zip(names, folders, strict=True))
    for folder in folders:
        assert folder and not folder.startswith(".") and "/" not in folder and "\0" not in folder
    # names that were folders before keep them
    assert [user_folder(n) for n in ("ann", "a_b", "x-y.z", "Bob_2")] == [
        "ann",
        "a_b",
        "x-y.z",
        "Bob_2",
    ]


def test_a_tokens_file_whose_user_cannot_have_a_folder_is_refused(tmp_path: Path) -> None:
    fine, _ = tokens_for(tmp_path / "fine", "a" * 255, "é" * 63)
    TokenTable.load(fine)
    for name in ("a" * 256, "é" * 64, "\x01" * 128):
        path, _ = tokens_for(tmp_path / f"n{len(name)}{ord(name[0])}", name)
        with pytest.raises(ValueError, match="folder name"):
            TokenTable.load(path)


# --- row 8: what a local sandbox sees of other sandboxes and the host -----------------------

SEE_OTHERS = r"""
import glob, os
groups = sorted({os.path.basename(p.rstrip('/')) for p in glob.glob('/sys/fs/cgroup/*/gateway-*/')
                 + glob.glob('/sys/fs/cgroup/gateway-*/')})
def seen(path):
    try:
        return sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
    except OSError as exc:
        return exc.strerror
result = {'groups': groups, 'top': seen('/sys/fs/cgroup/memory/memory.usage_in_bytes'),
          **{path: seen(path) for path in PATHS}}
for folder in ('/var/tmp', '/dev/shm', '/tmp'):
    try:
        open(os.path.join(folder, 'from-the-sandbox'), 'w').write('x')
    except OSError:
        pass
"""


@pytest.fixture
def host_marks() -> Iterator[list[Path]]:
    """Files of the host's own in the shared temp folders, readable by everyone."""
    made = []
    for folder in ("/var/tmp", "/dev/shm", "/tmp"):
        handle, name = tempfile.mkstemp(prefix="gwmark-", dir=folder)
        os.write(handle, b"the host's")
        os.close(handle)
        os.chmod(name, 0o644)
        made.append(Path(name))
    try:
        yield made
    finally:
        for path in made:
            path.unlink(missing_ok=True)
        for folder in ("/var/tmp", "/dev/shm", "/tmp"):
            Path(folder, "from-the-sandbox").unlink(missing_ok=True)


def test_a_local_sandbox_sees_no_other_sandbox_and_nothing_of_the_hosts_temp(
    tmp_path: Path, host_marks: list[Path]
) -> None:
    store = Path(tempfile.mkdtemp(prefix="gwstore-", dir="/var/lib"))
    os.chmod(store, 0o755)
    tokens, token_of = tokens_for(tmp_path / "etc", "ann", "bob")
    server = start_gateway("local", tokens=tokens, store=f"sqlite:///{store}/runs.sqlite3")
    try:
        os.chmod(store / "runs.sqlite3", 0o644)
        ann, bob = server.client(token_of["ann"]), server.client(token_of["bob"])
        busy = ann.request(
            "POST", "/v1/runs", {"code": "import time; time.sleep(300)", "background": True}
        )
        assert busy.status == 202, busy.body
        poll_run(ann, busy.json()["id"], until=lambda r: r["status"] == "running")
        paths = [*map(str, host_marks), str(store / "runs.sqlite3"), "/var/tmp", "/dev/shm"]
        record = bob.run(code=f"PATHS = {paths!r}\n{SEE_OTHERS}")
        ann.request("DELETE", f"/v1/runs/{busy.json()['id']}")
    finally:
        server.stop()
        for name in os.listdir(store):
            os.unlink(store / name)
        os.rmdir(store)
    assert record["status"] == "succeeded", record
    seen = record["result"]
    # its own group at most (a cgroup of its own, where the machine gives one)
    assert len(seen.pop("groups")) <= 1, record["result"]
    assert seen.pop("top") == "No such file or directory", record["result"]
    for mark in host_marks:
        assert seen.pop(str(mark)) == "No such file or directory", record["result"]
    # /dev/null in its place (which the read-only, nodev mount may refuse to open)
    assert seen.pop(str(store / "runs.sqlite3")) in ("", "Permission denied"), seen
    assert seen == {"/var/tmp": [], "/dev/shm": []}, seen
    for folder in ("/var/tmp", "/dev/shm", "/tmp"):
        assert not Path(folder, "from-the-sandbox").exists(), folder
