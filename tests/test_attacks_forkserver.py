"""Attacks on what is particular to forked kernels (README, "What each backend isolates";
DESIGN.md decision 23): a kernel is a fork of a warm parent that runs as root, so each test
tries to reach what a fork could inherit or share: the kernel's system calls (the seccomp
filter), the parent's descriptors, the parent and other sandboxes through /proc and the
namespaces, the random state and the key of another kernel, and the parent's own life."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.sandbox.forkserver.parent import PROGRAM
from gateway.sandbox.forkserver.rootfs import image_layers
from tests import census
from tests.api import full, pools
from tests.conftest import start_gateway
from tests.support import DOCKER_IMAGE, Client, GatewayThread, serving, wait_for

pytestmark = pytest.mark.attack


@pytest.fixture(scope="module")
def forked() -> Iterator[GatewayThread]:
    # numpy's global generator made in the parent: each kernel must still draw its own
    preload = ("matplotlib.pyplot", "numpy", "numpy.random", "pandas")
    # a pool of two: two runs in a row take kernels that were alive at once, so that their
    # namespaces' ids can be told apart (a destroyed namespace's id is given out again)
    gateway = start_gateway("forkserver", max_concurrent_runs=4, preload=preload, pool_python=2)
    yield from serving(gateway)


@pytest.fixture
def fclient(forked: GatewayThread) -> Client:
    return forked.client()


# Each call as the kernel's user would make it, through libc: the errno it ends with.
SYSCALLS = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    ctypes.set_errno(0)
    result = libc.syscall(*args)
    return 'ok' if result >= 0 else errno.errorcode[ctypes.get_errno()]
buf = ctypes.create_string_buffer(256)
result = {
    'unshare_user': call(272, 0x10000000),            # unshare(CLONE_NEWUSER)
    'unshare_net': call(272, 0x40000000),             # unshare(CLONE_NEWNET)
    'mount': call(165, b'none', b'/tmp', b'tmpfs', 0, 0),
    'keyctl': call(250, 0, 0, 0, 0, 0),
    'add_key': call(248, b'user', b'k', b'v', 1, -2),
    'bpf': call(321, 0, buf, 64),
    'perf_event_open': call(298, buf, 0, -1, -1, 0),
    'userfaultfd': call(323, 0),
    'ptrace_traceme': call(101, 0, 0, 0, 0),
    'process_vm_readv': call(310, 1, 0, 0, 0, 0, 0),
    'io_uring_setup': call(425, 1, buf),
    'personality_no_aslr': call(135, 0x0040000),
    'clone3': call(435, 0, 0),
    'clone_newpid': call(56, 0x20000000 | 17, 0, 0, 0, 0),
    'setns': call(308, 0, 0),                         # allowed: fd 0 is no namespace
    # a namespace of its own: setns needs a capability in its owner, which it has not
    'setns_own_net': call(308, os.open('/proc/self/ns/net', os.O_RDONLY), 0x40000000),
    'chroot': call(161, b'/tmp'),
    'kexec_load': call(246, 0, 0, 0, 0),
    'init_module': call(175, 0, 0, b''),
    'open_by_handle_at': call(304, 0, buf, 0),
    'getpid': call(39),
    # AF_VSOCK with a bit above the int's 32: the kernel reads 40 (Docker's rule lets it by)
    'vsock_high_bits': call(41, ctypes.c_long(0x100000028), 1, 0),
    'unix': call(41, 1, 1, 0),                        # socket(AF_UNIX): allowed
    'inet6': call(41, 10, 2, 0),                      # socket(AF_INET6, SOCK_DGRAM): allowed
    'kcm': call(41, 41, 2, 0),                        # AF_KCM, a family above AF_VSOCK
}
try:
    socket.socket(40, socket.SOCK_STREAM)            # AF_VSOCK
    result['vsock'] = 'ok'
except OSError as exc:
    result['vsock'] = errno.errorcode[exc.errno]
status = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
result['seccomp'] = status['Seccomp'].strip()
result['no_new_privs'] = status['NoNewPrivs'].strip()
result['caps'] = [status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')]
"""


def test_the_seccomp_filter_refuses_what_dockers_default_profile_refuses(fclient: Client) -> None:
    record = fclient.run(code=SYSCALLS)
    assert record["status"] == "succeeded", record
    result = record["result"]
    assert result.pop("getpid") == "ok"
    # families but AF_VSOCK reach the kernel, which decides (AF_KCM: made, or not built in)
    assert result.pop("unix") == result.pop("inet6") == "ok"
    assert result.pop("kcm") in ("ok", "EAFNOSUPPORT")
    assert result.pop("seccomp") == "2"  # a filter is installed
    assert result.pop("no_new_privs") == "1"
    assert result.pop("caps") == ["0000000000000000"] * 5
    # clone3 answers ENOSYS (as in Docker's profile, so that libc falls back to clone)
    assert result.pop("clone3") == "ENOSYS"
    # setns reaches the kernel (a continuation of a snapshot joins its branch with it:
    # DESIGN decision 24), which refuses what is not a namespace, and any namespace whose
    # owner gives the kernel no capability (setns_own_net: EPERM, checked below)
    assert result.pop("setns") == "EINVAL"
    # everything else a container without capabilities may not do: EPERM from the filter
    assert result == dict.fromkeys(result, "EPERM"), result


PROBE = r"""
import os, random, socket, stat, json
fds = {}
for name in os.listdir('/proc/self/fd'):
    try:
        target = os.readlink(f'/proc/self/fd/{name}')
    except OSError:
        continue
    kind = None
    if target.startswith('socket:'):
        s = socket.socket(fileno=os.dup(int(name)))
        kind = [s.family, s.type, s.getsockname() if s.family == socket.AF_UNIX else None]
        s.close()
    fds[name] = [target, kind]
try:
    import numpy
    numbers = [random.random(), float(numpy.random.random())]
except ImportError:
    numbers = [random.random()]
result = {
    'fds': fds,
    'numbers': numbers,
    'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
    'key': json.load(open('/run/gateway/connection.json'))['key'],
    'hostname': socket.gethostname(),
    'ns': {n: os.readlink(f'/proc/self/ns/{n}') for n in ('mnt', 'pid', 'net', 'ipc', 'uts', 'cgroup')},
    'cgroup': open('/proc/self/cgroup').read().split(),
    'run': sorted(os.listdir('/run')),
    'mounts': sorted(line.split()[4] for line in open('/proc/self/mountinfo')),
}
"""


def test_forked_kernels_share_no_descriptor_randomness_key_or_namespace(
    forked: GatewayThread,
) -> None:
    client = forked.client()
    assert wait_for(lambda: full(client), timeout=120), pools(client)
    first, second = (client.run(code=PROBE)["result"] for _ in range(2))
    for probe in (first, second):
        targets = [target for target, _ in probe["fds"].values()]
        # nothing of the parent's files (its program, filter, log) and none of its sockets
        # to the gateway or its first child (SOCK_SEQPACKET)
        assert not [t for t in targets if "forkserver" in t or "parent-" in t], targets
        kinds = [kind for _, kind in probe["fds"].values() if kind is not None]
        # but its own, the one a snapshot of it would serve on (kernels/python/snapshot.py)
        assert [kind for kind in kinds if kind[1] == 5] == [[1, 5, "/run/kernel/snapshot"]], probe[
            "fds"
        ]
        # its own PID namespace: pid 1 (its reaper), the kernel, and what the kernel started
        assert probe["pids"][:2] == [1, 2] and len(probe["pids"]) < 8, probe["pids"]
        # its own cgroup namespace: its group is its root
        assert all(line.endswith(":/") for line in probe["cgroup"]), probe["cgroup"]
        # its /run: the socket folder and the gateway's (connection file), nothing else
        assert probe["run"] == ["gateway", "kernel"], probe["run"]
    # every generator re-seeded in the child: Python's `random`, numpy's global one
    assert len(first["numbers"]) == 2, first["numbers"]
    for one, other in zip(first["numbers"], second["numbers"], strict=True):
        assert one != other, (first["numbers"], second["numbers"])
    assert first["key"] != second["key"]  # a fresh HMAC key per kernel
    assert first["hostname"] != second["hostname"]
    for name, link in first["ns"].items():  # no namespace shared with the other kernel...
        assert link != second["ns"][name], name
        assert link != os.readlink(f"/proc/self/ns/{name}"), name  # ...nor with the host


def test_a_kernel_sees_neither_the_parent_nor_another_sandbox(forked: GatewayThread) -> None:
    client = forked.client()
    body = {"code": "import time; time.sleep(60)", "background": True}
    other = client.request("POST", "/v1/runs", body).json()["id"]
    try:
        running = lambda: client.request("GET", f"/v1/runs/{other}").json()["status"] == "running"  # noqa: E731
        assert wait_for(running, timeout=60)
        parents = forked.resident().pids
        code = (
            "import os, signal\n"
            "seen = [open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit()]\n"
            "killed = []\n"
            f"for pid in {list(parents)!r}:\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        killed.append(pid)\n"
            "    except OSError as exc:\n"
            "        killed.append(exc.errno)\n"
            "result = [seen, killed]\n"
        )
        seen, killed = client.run(code=code)["result"]
        # its own two processes (pid 1, the reaper, and the kernel: forks of the parent,
        # hence its command line), never the other run's kernel nor a parent
        assert len(seen) == 2 and not [c for c in seen if "sleep(60)" in c], seen
        assert all(k == 3 for k in killed), killed  # ESRCH: no such process, from inside
        assert forked.resident().pids == parents  # the parents live on
    finally:
        client.request("DELETE", f"/v1/runs/{other}")


def test_a_parent_that_dies_is_started_again(fclient: Client, forked: GatewayThread) -> None:
    assert fclient.run(code="print(1)")["stdout"] == "1\n"
    backend = forked.gateway.services.backend  # type: ignore[union-attr]
    parent = backend.parents["ipykernel"]
    old = parent.pid
    assert old is not None
    os.kill(old, 9)
    # started again at once when the pools refill, else by the next run's fork
    record = fclient.run(code="print(2)")
    assert record["status"] == "succeeded" and record["stdout"] == "2\n", record
    # its kernels lived on; the next fork (the pool's refill) starts a new parent
    assert wait_for(lambda: parent.pid != old and parent.alive, timeout=60)
    assert parent.restarts >= 1
    assert fclient.run(code="print(3)")["stdout"] == "3\n"


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether a process's readable memory holds `needle` (read as root from the host)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, OverflowError, ValueError):
                continue
    return False


def test_a_kernels_request_never_enters_the_warm_parents_memory() -> None:
    """What a warm parent's memory holds, every later fork copies (another tenant's kernel
    can read its own memory): nothing of a kernel's request may pass through it, even freed:
    neither its HMAC key nor its hostname (read from the host, right after the fork, before
    a later request could take the freed memory it used)."""
    server = start_gateway("forkserver", pool_python=0, pool_bash=0, pool_deno=0, pool_r=0)
    try:
        read = (
            "import json, socket\n"
            "print(json.load(open('/run/gateway/connection.json'))['key'], socket.gethostname())"
        )
        record = server.client().run(code=read)
        assert record["status"] == "succeeded", record
        key, hostname = (value.encode() for value in record["stdout"].split())
        assert len(key) >= 16 and len(hostname) == 12, record
        # this gateway's own parents (a kernel of another gateway may end while it is read)
        backend = server.gateway.services.backend  # type: ignore[union-attr]
        parents = [p.pid for p in backend.parents.values() if p.pid is not None and p.alive]
        assert parents, "no warm parent found"
        for needle in (key, hostname):
            assert not [pid for pid in parents if _memory_holds(pid, needle)], needle
    finally:
        server.stop()


# Inside a kernel: which needles are in its own readable memory (/proc/self/mem through
# /proc/self/maps, as any tenant may read its own), and how many bytes it read. No needle
# comes in whole, or this code would bring it: WANTED holds for each its second half (an
# anchor to look for), the length before it, its length and its sha256.
MEMORY_SCAN = r"""
import hashlib
found, scanned, step = set(), 0, 1 << 24
with open('/proc/self/maps') as maps:
    spans = [line.split()[:2] for line in maps]
with open('/proc/self/mem', 'rb', 0) as mem:
    for span, perms in spans:
        if not perms.startswith('r'):
            continue
        start, end = (int(x, 16) for x in span.split('-'))
        for at in range(start, end, step):
            try:
                mem.seek(at)
                chunk = mem.read(min(end, at + step + 64) - at)  # a needle across the seam too
            except (OSError, OverflowError, ValueError):
                break
            scanned += len(chunk)
            for anchor, before, length, digest in WANTED:
                where = chunk.find(anchor)
                while where >= 0:
                    begin = where - before
                    whole = chunk[max(begin, 0):begin + length]
                    if begin >= 0 and hashlib.sha256(whole).hexdigest() == digest:
                        found.add(digest)
                    where = chunk.find(anchor, where + 1)
result = {'found': sorted(found), 'scanned': scanned}
"""


def _wanted(needles: list[str]) -> list[tuple[bytes, int, int, str]]:
    """MEMORY_SCAN's WANTED for these needles."""
    wanted = []
    for needle in needles:
        half = len(needle) // 2
        digest = hashlib.sha256(needle.encode()).hexdigest()
        wanted.append((needle[half:].encode(), half, len(needle), digest))
    return wanted


def test_a_kernels_memory_holds_nothing_of_the_spawn_request_before_its_own() -> None:
    """A forked kernel's memory is a copy of its warm parent's, and every tenant can read its
    own: the parent must keep nothing of the requests it forked earlier kernels for (their
    uid and hostname, read by the parent, stayed in its heap and reached the next kernels).
    A kernel is kept running; the next one, forked right after it, looks for its hostname
    and uid in its own memory, and finds what the parent does hold: its program's path."""
    server = start_gateway("forkserver")  # no pools: the test forks the two kernels itself
    client = server.client()
    instance = server.settings.instance_id or ""
    body = {"code": "import time; time.sleep(60)", "background": True}
    first = client.request("POST", "/v1/runs", body).json()["id"]
    try:
        assert wait_for(lambda: len(census.forked_roots(instance)) == 1, timeout=60)
        (root,) = census.forked_roots(instance)  # /proc/<its pid 1>/root
        hostname = (root / "run/gateway/hostname").read_text().strip()
        status = (root.parent / "status").read_text()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        assert len(hostname) == 12 and len(uid) == 10, (hostname, uid)
        needles = {hashlib.sha256(v.encode()).hexdigest(): v for v in (hostname, uid, PROGRAM)}
        scan = MEMORY_SCAN.replace("WANTED", repr(_wanted(list(needles.values()))))
        record = client.run(code=scan, timeout=120)
        assert record["status"] == "succeeded", record
        found = [needles[digest] for digest in record["result"]["found"]]
        assert PROGRAM in found, record["result"]  # the scan reads what came with the fork
        assert [needle for needle in found if needle != PROGRAM] == []
    finally:
        client.request("DELETE", f"/v1/runs/{first}")
        server.stop()


def test_a_kernels_mounts_show_no_path_of_the_host(fclient: Client, forked: GatewayThread) -> None:
    """/proc/self/mountinfo shows each mount's root, source and options: none may name a
    host path of the gateway's (the image's layers in Docker's overlay2 store, the backend's
    state folder, the gateway's data folder). A kernel's mount table starts as a copy of its
    warm parent's: that holds none either, and the parent's mounts a sandbox mounts its own
    over are gone from it, not only covered (a covered mount is still listed)."""
    backend = forked.gateway.services.backend  # type: ignore[union-attr]
    record = fclient.run(code="print(open('/proc/self/mountinfo').read())")
    assert record["status"] == "succeeded", record
    kernel = record["stdout"]
    assert " / / " in kernel, kernel  # the root's line: it is the kernel's own table
    parent = Path(f"/proc/{backend.parents['ipykernel'].pid}/mountinfo").read_text()
    host = [*image_layers(DOCKER_IMAGE), "/var/lib/docker", "overlay2", str(backend.state)]
    host += [str(forked.settings.data_dir), f"gwfs{(forked.settings.instance_id or '')[:6]}"]
    for table in (kernel, parent):
        assert [path for path in host if path in table] == [], table
    points = [line.split()[4] for line in kernel.splitlines() if line.strip()]
    assert sorted(points) == sorted(set(points)), kernel  # nothing mounted over another
