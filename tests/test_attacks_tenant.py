"""Tenants against each other and the host, the leftovers of issue 20 (rows 6, 7 and 8 and
the shared uid): a workspace's size, user names that shared a folder, what a local sandbox
saw of other sandboxes and of the gateway, and per-uid kernel counters shared by all; and
issue 29's row 6 (with issue 30's finding): every user's workspace runs as one uid."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import TokenTable, user_folder
from gateway.sandbox.mounts import mount_source
from tests.api import poll_run
from tests.conftest import start_gateway
from tests.stream_client import connect
from tests.support import GatewayProcess, GatewayThread, write_tokens

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


# --- row 6: a workspace has a size limit ----------------------------------------------------

QUOTA = 32 * MiB
FILL = r"""
import errno, os
written, error = 0, None
with open('fill', 'wb') as out:
    try:
        while written < LIMIT:
            out.write(b'x' * 1048576)
            out.flush()
            written += 1048576
        os.fsync(out.fileno())
    except OSError as exc:
        error = errno.errorcode[exc.errno]
result = {'error': error, 'written': written}
"""


def disk_use(folder: Path) -> int:
    """Bytes the files below `folder` take on the host's file system (sparse files as they
    are; what is mounted below it is not the host's)."""
    host = folder.stat().st_dev
    used = 0
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(top, d)).st_dev == host]
        for name in files:
            used += os.lstat(os.path.join(top, name)).st_blocks * 512
    return used


def ann_and_bobs_workspaces(
    backend: str, tmp_path: Path, workspace_bytes: int
) -> tuple[GatewayThread, dict[str, str]]:
    """A gateway of ann's and bob's, their workspaces under `tmp_path / "ws"` (images of
    `workspace_bytes`, or plain folders with 0), and their tokens by user."""
    tokens, token_of = tokens_for(tmp_path / "etc", "ann", "bob")
    server = start_gateway(
        backend,
        tokens=tokens,
        workspaces=tmp_path / "ws",
        workspace_bytes=workspace_bytes,
        workspace_inodes=4096,
    )
    return server, token_of


@pytest.fixture
def quota_gateway(
    backend_name: str, tmp_path: Path
) -> Iterator[tuple[GatewayThread, dict[str, str]]]:
    (tmp_path / "ws").mkdir()
    server, token_of = ann_and_bobs_workspaces(backend_name, tmp_path, QUOTA)
    try:
        yield server, token_of
    finally:
        server.stop()


def test_a_workspace_fills_its_own_quota_and_no_more(
    quota_gateway: tuple[GatewayThread, dict[str, str]], tmp_path: Path
) -> None:
    server, token_of = quota_gateway
    ann, bob = server.client(token_of["ann"]), server.client(token_of["bob"])
    before = disk_use(tmp_path / "ws")
    record = ann.run(code=f"LIMIT = {4 * QUOTA}\n{FILL}", working_dir=".", timeout=120)
    # a full workspace is the run's own business: ENOSPC inside, a result like any other
    assert record["status"] == "succeeded", record
    assert record["result"]["error"] == "ENOSPC", record["result"]
    assert record["result"]["written"] <= QUOTA, record["result"]
    # what the host's disk holds for it: the image, no more (its metadata included)
    assert disk_use(tmp_path / "ws") - before <= QUOTA + MiB
    # another user's quota is their own: still room for bob
    theirs = bob.run(code=f"LIMIT = {8 * MiB}\n{FILL}", working_dir=".", timeout=120)
    assert theirs["result"] == {"error": None, "written": 8 * MiB}, theirs
    # and ann's room comes back when she deletes (the image gives its blocks back)
    again = ann.run(
        code=f"import os\nos.remove('fill')\nLIMIT = {8 * MiB}\n{FILL}", working_dir="."
    )
    assert again["result"] == {"error": None, "written": 8 * MiB}, again


def test_a_workspace_from_before_quotas_moves_into_its_image(
    backend_name: str, tmp_path: Path
) -> None:
    from gateway.settings import SANDBOX_ID

    tokens, token_of = tokens_for(tmp_path / "etc", "ann", "bob")
    ws = tmp_path / "ws"
    (ws / "ann" / "proj").mkdir(parents=True)
    (ws / "ann" / "proj" / "notes.txt").write_text("from before")
    (ws / "ann" / "link").symlink_to("/etc/passwd")
    for path in (ws / "ann", ws / "ann" / "proj", ws / "ann" / "proj" / "notes.txt"):
        os.lchown(path, SANDBOX_ID, SANDBOX_ID)  # what the old shared uid's runs left
    (ws / "bob").mkdir()
    (ws / "bob" / "big").write_bytes(b"x" * (2 * QUOTA))
    server = start_gateway(
        backend_name, tokens=tokens, workspaces=ws, workspace_bytes=QUOTA, workspace_inodes=4096
    )
    try:
        ann, bob = server.client(token_of["ann"]), server.client(token_of["bob"])
        code = (
            "import os\n"
            "open('proj/notes.txt', 'a').write(' and after')\n"
            "result = [open('proj/notes.txt').read(), os.readlink('link'), sorted(os.listdir('.'))]"
        )
        record = ann.run(code=code, working_dir=".")
        assert record["status"] == "succeeded", record
        assert record["result"] == ["from before and after", "/etc/passwd", ["link", "proj"]]
        # bob's files do not fit his quota: refused, and left where they are
        refused = bob.request("POST", "/v1/runs", {"code": "1", "working_dir": "."})
        assert refused.status == 400, refused.body
        assert "could not be moved" in refused.json()["error"]["message"]
        assert (ws / "bob" / "big").stat().st_size == 2 * QUOTA
    finally:
        server.stop()
    # stopped: nothing mounted any more, and the folder under the mount point is empty
    assert os.listdir(ws / "ann") == []
    again = start_gateway(backend_name, tokens=tokens, workspaces=ws, workspace_bytes=QUOTA)
    try:
        record = again.client(token_of["ann"]).run(
            code="result = open('proj/notes.txt').read()", working_dir="."
        )
        assert record["result"] == "from before and after", record
    finally:
        again.stop()


# --- a uid of its own per sandbox -------------------------------------------------------------


def test_sandboxes_alive_at_once_have_uids_of_their_own(backend_name: str, tmp_path: Path) -> None:
    tokens, token_of = tokens_for(tmp_path / "etc", "ann", "bob")
    server = start_gateway(backend_name, tokens=tokens, workspaces=tmp_path / "ws")

    async def both() -> tuple[int, int, list[int]]:
        headers = {"Authorization": f"Bearer {token_of['ann']}"}
        async with connect(server.port, headers=headers) as stream:
            code = "import os, time\nprint(os.getuid(), flush=True)\ntime.sleep(300)"
            stream.send({"type": "run", "ref": "a", "code": code, "timeout": 300})
            event = await stream.until(lambda e: e["type"] == "output" and e["ref"] == "a")
            first = int(event["output"]["text"])
            bob = server.client(token_of["bob"])
            seconds = [
                (await asyncio.to_thread(bob.run, code="import os\nresult = os.getuid()"))["result"]
                for _ in range(2)
            ]
            second = (
                await asyncio.to_thread(
                    bob.run, code="import os\nresult = os.getuid()", working_dir="."
                )
            )["result"]
            stream.send({"type": "cancel", "ref": "a"})
            await stream.done("a")
        return first, second, seconds

    try:
        first, in_workspace, others = asyncio.run(both())
    finally:
        server.stop()
    assert first not in others and first != in_workspace, (first, others, in_workspace)
    assert in_workspace not in others


def test_a_users_later_run_may_write_what_an_earlier_one_left(
    backend_name: str, tmp_path: Path
) -> None:
    tokens, token_of = tokens_for(tmp_path / "etc", "ann")
    server = start_gateway(backend_name, tokens=tokens, workspaces=tmp_path / "ws")
    try:
        ann = server.client(token_of["ann"])
        made = "import os\nos.makedirs('d/e')\nopen('d/e/f.txt', 'w').write('1')"
        assert ann.run(code=made, working_dir=".")["status"] == "succeeded"
        change = (
            "import os, shutil\n"
            "open('d/e/f.txt', 'a').write('2')\n"
            "result = open('d/e/f.txt').read()\n"
            "shutil.rmtree('d')\n"
        )
        record = ann.run(code=change, working_dir=".")
        assert record["status"] == "succeeded" and record["result"] == "12", record
    finally:
        server.stop()


def test_a_workspace_a_dead_gateway_left_mounted_is_found_again(tmp_path: Path) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    data.mkdir()
    process = GatewayProcess("local", data, workspaces=ws, workspace_bytes=QUOTA).start()
    try:
        made = process.client.run(code="open('kept.txt', 'w').write('kept')", working_dir=".")
        assert made["status"] == "succeeded", made
    finally:
        process.signal(signal.SIGKILL)
    assert mount_source(ws / "local") is not None  # what the dead gateway left
    server = start_gateway(
        "local", instance_id=process.instance, data_dir=data, workspaces=ws, workspace_bytes=QUOTA
    )
    try:
        assert mount_source(ws / "local") is None  # nobody held it: unmounted at start
        record = server.client().run(code="result = open('kept.txt').read()", working_dir=".")
        assert record["result"] == "kept", record
    finally:
        server.stop()
    assert mount_source(ws / "local") is None and os.listdir(ws / "local") == []


# --- issue 29 row 6, issue 30: every user's workspace runs as one uid ---------------------------

# ann's run fills her uid's queue of pending signals (RLIMIT_SIGPENDING, counted per uid) and
# holds it: a real-time signal, blocked, sent to its own thread until the queue is full.
FILL_SIGNALS = r"""
import os, signal, threading, time
sig = signal.SIGRTMIN + 5
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
queued = 0
try:
    while queued < 1 << 20:
        signal.pthread_kill(threading.get_ident(), sig)
        queued += 1
except BlockingIOError:
    pass
print(os.getuid(), queued, flush=True)
time.sleep(300)
"""
PAIRS = 30
# bob's bash kernel orders stdout and stderr by queueing a real-time signal per write
# (kernels/bash/pipes.py): with a full queue it falls back to arrival order
ALTERNATE = f"id -u\nfor i in $(seq 0 {PAIRS - 1}); do echo o$i; echo e$i >&2; done"


@pytest.mark.parametrize("workspace_bytes", [0, QUOTA], ids=["plain", "images"])
def test_users_in_their_workspaces_at_once_have_uids_of_their_own(
    backend_name: str, tmp_path: Path, workspace_bytes: int
) -> None:
    """Row 6: with `--workspace-bytes 0` every workspace ran as `sandbox_uid`: ann's queued
    signals left bob's bash run 5 parts of 61 in order. Issue 30: with images, every user
    was once given the first uid."""
    from gateway.settings import SANDBOX_ID

    server, token_of = ann_and_bobs_workspaces(backend_name, tmp_path, workspace_bytes)

    async def both() -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token_of['ann']}"}
        async with connect(server.port, headers=headers) as stream:
            run = {"type": "run", "ref": "a", "code": FILL_SIGNALS, "working_dir": "."}
            stream.send({**run, "timeout": 300})
            event = await stream.until(lambda e: e["type"] == "output", timeout=120)
            assert event["ref"] == "a" and event["output"].get("name") == "stdout", event
            bob = server.client(token_of["bob"])
            record = await asyncio.to_thread(
                bob.run, code=ALTERNATE, language="bash", working_dir="."
            )
            stream.send({"type": "cancel", "ref": "a"})
            await stream.done("a")
        return int(event["output"]["text"].split()[0]), record

    try:
        ann_uid, record = asyncio.run(both())
    finally:
        server.stop()
    assert record["status"] == "succeeded", record
    bob_uid = int(record["stdout"].split("\n", 1)[0])
    assert ann_uid != bob_uid, (ann_uid, bob_uid)
    for uid in (ann_uid, bob_uid):  # above the sandboxes' range
        assert uid > SANDBOX_ID + 65536, uid
    # ann's full signal queue is not bob's: his run's writes keep their order
    streams = [(o["name"], o["text"]) for o in record["outputs"]]
    pairs = [(name, f"{kind}{i}\n") for i in range(PAIRS) for name, kind in OUT_ERR]
    assert streams == [("stdout", f"{bob_uid}\n" + pairs[0][1]), *pairs[1:]], streams


OUT_ERR = (("stdout", "o"), ("stderr", "e"))


def test_a_plain_workspace_keeps_its_users_uid_and_their_files(
    backend_name: str, tmp_path: Path
) -> None:
    """Without quotas a user still has a uid of their own: what the old shared uid left in
    their folder becomes theirs, and a gateway started again gives them the same uid, so
    their later runs change and delete what the earlier ones left."""
    from gateway.settings import SANDBOX_ID

    tokens, token_of = tokens_for(tmp_path / "etc", "ann")
    ws = tmp_path / "ws"
    (ws / "ann" / "old").mkdir(parents=True)
    (ws / "ann" / "old" / "notes.txt").write_text("from before")
    outside = tmp_path / "outside.txt"
    outside.write_text("not ann's")
    (ws / "ann" / "link").symlink_to(outside)  # a link the old uid left: never followed
    for path in (ws / "ann", ws / "ann" / "old", ws / "ann" / "old" / "notes.txt", outside):
        os.lchown(path, SANDBOX_ID, SANDBOX_ID)  # what the shared uid's runs left
    os.lchown(ws / "ann" / "link", SANDBOX_ID, SANDBOX_ID)
    write = (
        "import os\n"
        "open('old/notes.txt', 'a').write(' and after')\n"
        "os.makedirs('d/e')\n"
        "open('d/e/f.txt', 'w').write('1')\n"
        "result = os.getuid()"
    )
    change = (
        "import os, shutil\n"
        "open('d/e/f.txt', 'a').write('2')\n"
        "shutil.rmtree('old')\n"
        "result = [os.getuid(), open('d/e/f.txt').read(), sorted(os.listdir('.'))]"
    )
    results = []
    for code in (write, change):  # each by a gateway of its own: the second a restart
        server = start_gateway(backend_name, tokens=tokens, workspaces=ws, workspace_bytes=0)
        try:
            record = server.client(token_of["ann"]).run(code=code, working_dir=".")
        finally:
            server.stop()
        assert record["status"] == "succeeded", record
        results.append(record["result"])
    first_uid, (later_uid, *rest) = results
    assert first_uid == later_uid and first_uid > SANDBOX_ID + 65536, results
    assert rest == ["12", ["d", "link"]], results
    assert os.stat(outside).st_uid == SANDBOX_ID  # the link's target stays whose it was


# One gateway giving uids (owners.py) to every user in its own order, from `start` on.
GIVE_UIDS = r"""
import json, random, sys, time
from pathlib import Path
from gateway.sandbox.owners import WorkspaceOwners
root, users, start, seed = Path(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
owners = WorkspaceOwners(root, 2_000_000_000, 1_000_000_000, 1_000_000_000)
random.Random(seed).shuffle(users)
time.sleep(max(0.0, start - time.time()))
print(json.dumps({user: owners.open_plain(user) for user in users}))
"""


def test_gateways_sharing_a_workspaces_root_never_give_two_users_one_uid(
    tmp_path: Path,
) -> None:
    """Eight gateways on one machine (processes) giving uids to the same 64 new users at
    once, each in its own order: each user one uid, every user another; and a gateway
    started later finds the same. (Without the lock on `.images/.lock`: two users shared a
    uid in every try.)"""
    from gateway.sandbox.owners import WorkspaceOwners

    ws = tmp_path / "ws"
    users = [f"user{i}" for i in range(64)]
    start = time.time() + 1.0
    argv = [sys.executable, "-c", GIVE_UIDS, str(ws), json.dumps(users), str(start)]
    gateways = [
        subprocess.Popen(
            [*argv, str(seed)], stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent
        )
        for seed in range(8)
    ]
    given = [json.loads(gateway.communicate(timeout=120)[0]) for gateway in gateways]
    assert all(gateway.returncode == 0 for gateway in gateways)
    assert all(uids == given[0] for uids in given), given
    assert len(set(given[0].values())) == len(users), given[0]
    later = WorkspaceOwners(ws, 2_000_000_000, 1_000_000_000, 1_000_000_000)
    assert {user: later.open_plain(user) for user in users} == given[0]
