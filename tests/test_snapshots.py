"""Snapshots (issue 32, DESIGN decision 24): a run with `keep` leaves its kernel's final
state as a snapshot; a run `from` it gets a fresh sandbox whose kernel is a copy-on-write
fork of the snapshot's. Real forked kernels throughout.

The promises: the state is carried (variables, imports, the working folder's files);
branches are apart from each other and from the snapshot (files, /tmp, processes, the
network, signals), which never changes; what a continuation does not carry (threads,
subprocesses, open files, /tmp) is not there; a snapshot is its owner's alone (404 for
anyone else, as for an unknown id); one that went is 410 snapshot_gone, whichever way it
went (deleted, evicted by its owner's limits, expired); languages and backends that
cannot keep a kernel say so (400)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gateway.runs.snapshots import IDLE_CPU_MS
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, forget_snapshots, serving, wait_for

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


@pytest.fixture(scope="module")
def forked() -> Iterator[GatewayThread]:
    users = {ALICE: ("alice", "user"), BOB: ("bob", "user")}
    yield from serving(start_gateway("forkserver", users=users, snapshots_per_user=3))


@pytest.fixture
def alice(forked: GatewayThread) -> Iterator[Client]:
    yield forked.client(ALICE)
    forget_snapshots(forked)


@pytest.fixture
def bob(forked: GatewayThread) -> Client:
    return forked.client(BOB)


def kept(client: Client, code: str) -> str:
    record = client.run(code=code, keep=True)
    assert record["status"] == "succeeded", record
    assert record["snapshot"] is not None, (record["notes"], record["status"])
    return str(record["snapshot"]["id"])


def continued(client: Client, snapshot: str, code: str) -> dict[str, object]:
    record = client.run(code=code, **{"from": snapshot})
    assert record["status"] == "succeeded", record
    assert record["continued_from"] == snapshot
    return record


def error_of(client: Client, body: dict[str, object]) -> tuple[int, str, str]:
    response = client.request("POST", "/v1/runs", body)
    error = response.json()["error"]
    return response.status, error["code"], error["message"]


STATE = """\
import json, os
import numpy as np
x = 41
a = np.arange(10)
def twice(v):
    return 2 * v
with open('data.txt', 'w') as f:
    f.write('kept')
os.makedirs('folder/deeper', exist_ok=True)
with open('folder/deeper/more.txt', 'w') as f:
    f.write('also kept')
print('state made')
"""


def test_a_run_from_a_snapshot_starts_with_its_state(alice: Client) -> None:
    before = datetime.now(UTC)
    record = alice.run(code=STATE, keep=True)
    assert record["status"] == "succeeded", record
    assert record["stdout"] == "state made\n"
    snapshot = record["snapshot"]
    assert re.fullmatch(r"snap_[A-Za-z0-9_-]{16,64}", snapshot["id"])
    expires = datetime.fromisoformat(snapshot["expires_at"].replace("Z", "+00:00"))
    assert expires > before  # the gateway's default TTL is an hour
    assert snapshot["bytes"] > 1 << 20  # a kernel with numpy holds megabytes
    result = continued(
        alice,
        snapshot["id"],
        "print(twice(x), int(a.sum()), open('data.txt').read(), "
        "open('folder/deeper/more.txt').read())",
    )
    assert result["stdout"] == "82 45 kept also kept\n"
    assert result["snapshot"] is None  # kept only when asked


def test_a_chain_of_continuations_carries_each_step(alice: Client) -> None:
    first = kept(alice, "steps = ['one']")
    second = alice.run(code="steps.append('two')", keep=True, **{"from": first})
    assert second["status"] == "succeeded" and second["snapshot"], second
    third = alice.run(code="steps.append('three')", keep=True, **{"from": second["snapshot"]["id"]})
    assert third["status"] == "succeeded" and third["snapshot"], third
    last = continued(alice, third["snapshot"]["id"], "print(steps)")
    assert last["stdout"] == "['one', 'two', 'three']\n"
    # each step is a state of its own: the first still has only its own
    assert continued(alice, first, "print(steps)")["stdout"] == "['one']\n"


# The `sleep` processes this kernel can see (the image has no pgrep)
SLEEPERS = """\
import os
def sleepers():
    found = 0
    for pid in (p for p in os.listdir('/proc') if p.isdigit()):
        try:
            found += open(f'/proc/{pid}/cmdline', 'rb').read().startswith(b'sleep')
        except OSError:
            pass
    return found
"""


# Everything one branch may leave: a variable, files in the working folder and /tmp, a
# process, a listening socket; then what it can see of anything else.
BRANCH = """\
import os, socket, subprocess, json
mark = '{mark}'
x = mark
open(f'/workspace/{mark}', 'w').write(mark)
open(f'/tmp/{mark}', 'w').write(mark)
sleeper = subprocess.Popen(['sleep', '300'])
server = socket.socket()
server.bind(('127.0.0.1', 7777))
server.listen()
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
killed = []
for pid in pids:
    if pid not in (1, os.getpid(), sleeper.pid):
        try:
            os.kill(pid, 9)
            killed.append(pid)
        except OSError:
            pass
print(json.dumps({{
    'files': sorted(os.listdir('/workspace')),
    'tmp': sorted(n for n in os.listdir('/tmp') if not n.startswith('.')),
    'pids': pids,
    'host': socket.gethostname(),
}}))
"""


def test_branches_are_apart_and_the_snapshot_never_changes(alice: Client) -> None:
    import json

    snapshot = kept(alice, "x = 'original'\nopen('base.txt', 'w').write('base')")
    seen = []
    for mark in ("left", "right"):
        record = continued(alice, snapshot, BRANCH.format(mark=mark))
        seen.append(json.loads(str(record["stdout"])))
    left, right = seen
    # each sees the snapshot's files and its own, never the other's (or its /tmp)
    assert left["files"] == ["base.txt", "left"]
    assert right["files"] == ["base.txt", "right"]
    assert left["tmp"] == ["left"] and right["tmp"] == ["right"]
    # its own PID namespace: its pid 1, the kernel, its own process and the tools it ran
    assert 1 in right["pids"] and len(right["pids"]) <= 5, right["pids"]
    assert left["host"] != right["host"]
    # the right one could bind the port the left one held: its own network namespace
    # (binding it again in the same namespace would have raised)
    after = continued(
        alice,
        snapshot,
        f"{SLEEPERS}\nprint(x, sorted(os.listdir('.')), sleepers())",
    )
    assert after["stdout"] == "original ['base.txt'] 0\n"


def test_fifty_branches_leave_the_snapshot_as_it_was(alice: Client) -> None:
    snapshot = kept(alice, "counter = 0\nopen('n.txt', 'w').write('0')")
    for _ in range(50):
        continued(alice, snapshot, "counter += 1\nopen('n.txt', 'w').write(str(counter))")
    last = continued(alice, snapshot, "print(counter, open('n.txt').read())")
    assert last["stdout"] == "0 0\n"


NOT_CARRIED = """\
import os, subprocess, threading, time, random
ticks = []
def tick():
    while True:
        ticks.append(1)
        time.sleep(0.01)
threading.Thread(target=tick, daemon=True).start()
child = subprocess.Popen(['sleep', '300'])
kept_file = open('/workspace/open.txt', 'w')
kept_file.write('before')
kept_file.flush()
open('/tmp/scratch', 'w').write('t')
random.seed(7)
time.sleep(0.1)
"""

AFTER = (
    SLEEPERS
    + """
import time, random
n = len(ticks)
time.sleep(0.2)
print(len(ticks) == n, child.poll(), 'scratch' in os.listdir('/tmp'), sleepers())
kept_file.write(' written after')
kept_file.flush()
print(open('/workspace/open.txt').read(), random.random())
"""
)


def test_what_a_continuation_does_not_carry(alice: Client) -> None:
    """Threads, subprocesses, open files and /tmp stay behind (API.md, "Snapshots"); the
    random generators carry their state."""
    snapshot = kept(alice, NOT_CARRIED)
    first = continued(alice, snapshot, AFTER)
    lines = str(first["stdout"]).splitlines()
    # no tick thread; the child is not its child (poll: ECHILD reads as ended, 0); no /tmp;
    # no sleep process at all
    assert lines[0] == "True 0 False 0"
    # the file object of the snapshot writes nowhere: the copy of the file is as it was
    text, number = lines[1].rsplit(" ", 1)
    assert text == "before"
    # the same random state in every continuation
    second = continued(alice, snapshot, AFTER)
    assert str(second["stdout"]).splitlines()[1].rsplit(" ", 1)[1] == number


def test_a_snapshot_is_its_owners_alone(alice: Client, bob: Client) -> None:
    snapshot = kept(alice, "secret = 'alice'")
    status, code, _ = error_of(bob, {"code": "print(secret)", "from": snapshot})
    assert (status, code) == (404, "not_found")  # exactly as for an id that never was
    unknown = "snap_" + "A" * 24
    assert error_of(bob, {"code": "1", "from": unknown})[:2] == (404, "not_found")
    assert bob.request("GET", "/v1/snapshots").json() == {"snapshots": []}
    assert bob.request("DELETE", f"/v1/snapshots/{snapshot}").status == 404
    listed = alice.request("GET", "/v1/snapshots").json()["snapshots"]
    assert [s["id"] for s in listed] == [snapshot]


def test_a_deleted_snapshot_is_gone(alice: Client) -> None:
    snapshot = kept(alice, "x = 1")
    assert alice.request("DELETE", f"/v1/snapshots/{snapshot}").status == 204
    status, code, message = error_of(alice, {"code": "print(x)", "from": snapshot})
    assert (status, code) == (410, "snapshot_gone")
    assert "deleted" in message
    assert alice.request("DELETE", f"/v1/snapshots/{snapshot}").status == 410
    assert alice.request("GET", "/v1/snapshots").json() == {"snapshots": []}


def test_past_the_limit_the_owners_least_recently_used_goes(alice: Client, bob: Client) -> None:
    theirs = kept(bob, "mine = 'bob'")
    first, second, third = (kept(alice, f"n = {i}") for i in range(3))
    continued(alice, first, "n")  # first is now more recently used than second
    fourth = alice.run(code="n = 3", keep=True)
    assert fourth["snapshot"] is not None
    assert any("went to keep this one" in note for note in fourth["notes"]), fourth["notes"]
    status, code, message = error_of(alice, {"code": "n", "from": second})
    assert (status, code) == (410, "snapshot_gone") and "evicted" in message
    for still in (first, third, fourth["snapshot"]["id"]):
        continued(alice, still, "n")
    continued(bob, theirs, "print(mine)")  # another user's never goes for alice's


def test_an_idle_snapshot_expires() -> None:
    server = start_gateway("forkserver", snapshot_ttl=1.0)
    try:
        client = server.client()
        snapshot = kept(client, "x = 1")
        time.sleep(1.5)
        status, code, message = error_of(client, {"code": "x", "from": snapshot})
        assert (status, code) == (410, "snapshot_gone") and "expired" in message
    finally:
        server.stop()


def test_what_cannot_be_kept_says_so(alice: Client) -> None:
    body = {"code": "console.log(1)", "language": "javascript", "keep": True}
    status, code, _ = error_of(alice, body)
    assert (status, code) == (400, "snapshot_unsupported")
    status, code, _ = error_of(alice, {"code": "1", "keep": True, "network": True})
    assert (status, code) == (400, "conflicting_fields")
    status, code, _ = error_of(alice, {"code": "1", "from": "not-a-snapshot"})
    assert (status, code) == (400, "invalid_request")
    # a run that timed out keeps nothing, and says why
    record = alice.run(code="import time; time.sleep(30)", keep=True, timeout=1)
    assert record["status"] == "timed_out" and record["snapshot"] is None
    assert any("not kept" in note for note in record["notes"]), record["notes"]


BRANCH_PRIVILEGES = """\
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    ctypes.set_errno(0)
    return 'ok' if libc.syscall(*args) >= 0 else errno.errorcode[ctypes.get_errno()]
def opened(path):
    try:
        open(path, 'rb').close()
        return 'ok'
    except OSError as exc:
        return errno.errorcode[exc.errno]
status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)
print({
    'caps': sorted({status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')}),
    'no_new_privs': status['NoNewPrivs'].strip(),
    'seccomp': status['Seccomp'].strip(),
    'setns_own_net': call(308, os.open('/proc/self/ns/net', os.O_RDONLY), 0x40000000),
    'unshare_user': call(272, 0x10000000),
    'mount': call(165, b'none', b'/tmp', b'tmpfs', 0, 0),
    'uid': os.getuid(),
    'pid1_memory': opened('/proc/1/mem'),  # the branch's pid 1: the same uid, never dumpable
})
"""


@pytest.mark.attack
def test_a_branch_holds_no_privilege_in_its_own_namespaces(alice: Client) -> None:
    """The continuation gained every capability in its branch's user namespace to join it,
    and dropped them all: a branch's code can no more join, make or mount anything than a
    run's own kernel can."""
    import ast

    snapshot = kept(alice, "import os\nuid = os.getuid()")
    record = continued(alice, snapshot, BRANCH_PRIVILEGES)
    found = ast.literal_eval(str(record["stdout"]))
    assert found.pop("caps") == ["0000000000000000"]
    assert found.pop("no_new_privs") == "1" and found.pop("seccomp") == "2"
    uid = found.pop("uid")
    assert continued(alice, snapshot, "print(uid)")["stdout"] == f"{uid}\n"  # the same uid
    assert found.pop("pid1_memory") == "EACCES"
    # joining even its own namespaces needs a capability it has not; making one, the filter
    # refuses
    assert found == dict.fromkeys(found, "EPERM"), found


def test_the_clients_session_carries_state_and_forks(forked: GatewayThread) -> None:
    """`with client.session() as s`: each run starts from the state the one before kept; a
    fork goes its own way; leaving deletes what the session kept (the sync and the async
    client alike)."""
    import asyncio

    from gateway.client import AsyncGatewayClient, GatewayClient, SnapshotGone

    url = f"http://127.0.0.1:{forked.port}"
    with GatewayClient(url, token=ALICE) as client:
        with client.session() as session:
            session.run("x = 1")
            assert session.run("print(x)").stdout == "1\n"
            branch = session.fork()
            branch.run("x = 2")
            assert branch.run("print(x)").stdout == "2\n"
            assert session.run("print(x)").stdout == "1\n"
            first = session.snapshot
            assert first is not None
            branch.close()
        assert client.list_snapshots().snapshots == []
        with pytest.raises(SnapshotGone):
            client.run("print(x)", continue_from=first)

    async def asynchronous() -> list[str]:
        async with AsyncGatewayClient(url, token=ALICE) as client:
            async with client.session() as session:
                await session.run("y = 'async'")
                record = await session.run("print(y)")
            listed = (await client.list_snapshots()).snapshots
            return [record.stdout, *[s.id for s in listed]]

    assert asyncio.run(asynchronous()) == ["async\n"]


SPINNING = """\
import subprocess, sys, threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
spinner = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
x = 'kept while spinning'
"""


def test_a_snapshot_is_frozen(alice: Client, forked: GatewayThread) -> None:
    """Nothing of the run goes on in its snapshot: not a thread it started, not a process
    (the snapshot is a fork of the kernel's main thread alone; the rest ended)."""
    snapshot = kept(alice, SPINNING)
    services = forked.gateway.services
    assert services is not None
    sandbox = services.runs.snapshots.get(snapshot).sandbox

    def cpu_ms() -> int:
        return int(forked.call(sandbox.usage()).cpu_ms or 0)

    time.sleep(0.5)  # the kernel ends its other processes and becomes the snapshot
    before = cpu_ms()
    time.sleep(2.0)
    assert cpu_ms() - before < 100  # two spinners would have used 2,000 ms on two cores
    assert continued(alice, snapshot, "print(x)")["stdout"] == "kept while spinning\n"


def own_cpu_seconds(client: Client) -> float:
    """What the usage ledger says the caller spent in the last hour."""
    (mine,) = client.request("GET", "/v1/usage").json()["users"]
    return float(mine["last_hour"]["cpu_seconds"])


def listed(client: Client) -> dict[str, dict[str, object]]:
    return {s["id"]: s for s in client.request("GET", "/v1/snapshots").json()["snapshots"]}


# the user's code replaces what stops the kernel when it is kept: it spins instead
NEVER_STOPS = """\
import kernels.python.resume as resume
def stop():
    while True:
        pass
resume.stop = stop
"""


def test_a_kernel_that_keeps_running_once_kept_goes_and_its_owner_pays(alice: Client) -> None:
    """A snapshot is idle. One whose kernel spins (unheld, until its TTL, on a core of the
    machine) goes once it spent `IDLE_CPU_MS` idle, and what it spent is its owner's: the
    usage ledger counts it beside the runs' CPU."""
    before = own_cpu_seconds(alice)
    started = time.monotonic()
    record = alice.run(code=NEVER_STOPS, keep=True)
    assert record["snapshot"] is not None, record
    snapshot = record["snapshot"]["id"]

    assert wait_for(lambda: snapshot not in listed(alice), timeout=30)
    spun = time.monotonic() - started  # at most one CPU's worth of this
    status, code, message = error_of(alice, {"code": "print(1)", "from": snapshot})
    assert (status, code) == (410, "snapshot_gone") and "kept running" in message, message

    def charged() -> float:
        return own_cpu_seconds(alice) - before - record["usage"]["cpu_ms"] / 1000

    assert wait_for(lambda: charged() >= IDLE_CPU_MS / 1000, timeout=10), charged()
    assert charged() <= spun + 0.2, (charged(), spun)


# a continuation of the state starts a spinning thread as its kernel starts again
SPINS_WHEN_CONTINUED = """\
import threading
import kernels.python.startup as startup
attach = startup.attach_kernel
def spinning(shell):
    threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
    attach(shell)
startup.attach_kernel = spinning
"""


def test_a_continuation_made_ahead_that_spins_is_closed_and_paid_for(
    alice: Client, forked: GatewayThread
) -> None:
    """The continuation made ahead for the next run (`prepare`) is idle too: one that spins
    is closed once it spent `IDLE_CPU_MS` idle (the next run starts its own), its owner pays
    what it spent, and the snapshot stays."""
    services = forked.gateway.services
    assert services is not None
    before = own_cpu_seconds(alice)
    record = alice.run(code=SPINS_WHEN_CONTINUED, keep=True)
    snapshot = services.runs.snapshots.get(record["snapshot"]["id"])
    assert wait_for(lambda: snapshot.ready is not None, timeout=30)  # made, and spinning
    assert wait_for(lambda: snapshot.ready is None and snapshot.readying is None, timeout=30)
    charged = own_cpu_seconds(alice) - before - record["usage"]["cpu_ms"] / 1000
    assert charged >= IDLE_CPU_MS / 1000, charged
    assert snapshot.id in listed(alice)
    after = continued(alice, snapshot.id, "print('continued')")
    assert after["stdout"] == "continued\n"


def test_an_idle_snapshot_stays_and_costs_its_owner_little(alice: Client) -> None:
    """The other side of the rule above: a snapshot that does nothing for seconds stays
    (continuing from it works), and is charged no more than its continuation made ahead
    (`prepare`) spent starting."""
    before = own_cpu_seconds(alice)
    record = alice.run(code="x = 'idle'", keep=True)
    snapshot = record["snapshot"]["id"]
    time.sleep(4.0)  # four checks
    assert snapshot in listed(alice)
    charged = own_cpu_seconds(alice) - before - record["usage"]["cpu_ms"] / 1000
    assert charged < IDLE_CPU_MS / 1000, charged
    assert continued(alice, snapshot, "print(x)")["stdout"] == "idle\n"


BASH_STATE = """\
x=41
arr=(a 'b c' d)
declare -A m=([k]=v)
declare -r fixed=1
f() { echo "f:$1:$x"; }
export E=exported
alias ll='echo aliased'
shopt -s expand_aliases
set -o pipefail
mkdir -p sub && cd sub && echo data > file.txt
umask 027
IFS=:
sleep 300 &
trap 'echo trapped' USR1
"""
BASH_AFTER = """\
echo "$x|${arr[1]}|${m[k]}|$fixed|$E"
f hi
ll
[[ -o pipefail ]] && echo pipefail
echo "$PWD $(cat file.txt) $(umask)"
printf '%q\\n' "$IFS"
IFS=$' \\t\\n'
jobs | wc -l; trap -p USR1 | wc -l
n=0; for p in /proc/[0-9]*/comm; do [[ $(<$p) == sleep ]] && n=$((n + 1)); done; echo $n
"""


def test_a_bash_kernels_state_is_carried(alice: Client) -> None:
    """A bash snapshot carries its shell: variables (arrays, associative, read-only,
    exported), functions, aliases, options, folder, umask and IFS, and the working
    folder's files; not its jobs nor its traps (API.md, "Snapshots")."""
    record = alice.run(code=BASH_STATE, language="bash", keep=True)
    assert record["status"] == "succeeded" and record["snapshot"] is not None, record
    snapshot = record["snapshot"]["id"]
    after = alice.run(code=BASH_AFTER, language="bash", **{"from": snapshot})
    assert after["status"] == "succeeded", after
    assert after["stdout"].splitlines() == [
        "41|b c|v|1|exported",
        "f:hi:41",
        "aliased",
        "pipefail",
        "/workspace/sub data 0027",
        ":",
        "0",
        "0",
        "0",
    ], after["stdout"] + after["stderr"]
    # branches are apart: one's change is not the other's, nor the snapshot's
    changed = alice.run(
        code="x=1; echo data2 > file.txt; echo $x",
        language="bash",
        **{"from": snapshot, "keep": True},
    )
    assert changed["stdout"] == "1\n"
    other = alice.run(code="echo $x $(cat file.txt)", language="bash", **{"from": snapshot})
    assert other["stdout"] == "41 data\n"
    chained = alice.run(
        code="echo $x $(cat file.txt); f z", language="bash", **{"from": changed["snapshot"]["id"]}
    )
    assert chained["stdout"] == "1 data2\nf:z:1\n"
    # a snapshot is of one language's kernel
    status, _, message = error_of(alice, {"code": "print(x)", "from": snapshot})
    assert status == 400 and "bash kernel" in message


LARGE_PLOT = """\
import matplotlib.pyplot as plt
from mpl_toolkits import mplot3d
fig = plt.figure(dpi=150)
ax = plt.axes(projection='3d')
plt.show()
"""


def test_a_continuation_sends_what_is_large(alice: Client) -> None:
    """A PNG over pyzmq's zero-copy size is sent by a collector thread with a context of its
    own; pyzmq tells a fork by its pid, which a continuation shares with its snapshot's
    kernel (pid 2 of a PID namespace each), so the continuation must start its own."""
    record = alice.run(code=LARGE_PLOT, keep=True)
    assert record["status"] == "succeeded" and record["snapshot"] is not None, record
    pngs = [o for o in record["outputs"] if "image/png" in o.get("data", {})]
    assert pngs and len(pngs[0]["data"]["image/png"]) > 65536  # zero-copy: over 64 KiB
    again = continued(alice, record["snapshot"]["id"], LARGE_PLOT)
    assert [o for o in again["outputs"] if "image/png" in o.get("data", {})], again


def test_a_continuations_kernel_that_dies_is_seen_at_once(alice: Client) -> None:
    """A continuation's kernel is not its pid 1's child (its parent was the snapshot's
    fork): its end is still seen as it happens, not at the run's timeout."""
    snapshot = kept(alice, "x = 1")
    record = alice.run(
        code="import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        timeout=60,
        **{"from": snapshot},
    )
    assert record["status"] == "failed" and record["kill_reason"] is None, record
    assert any("died" in note for note in record["notes"]), record["notes"]
    assert record["usage"]["wall_ms"] < 10_000
