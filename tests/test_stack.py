"""The Docker Swarm stack (deploy/stack.yaml), deployed for real on this machine's engine
with `deploy/stack.sh up`: PostgreSQL, two gateway replicas on the Docker backend, HAProxy
in front. Through the load balancer: a background run submitted and polled to its end, a
cancel, the per-user limit across replicas, a WebSocket stream. A replica's task killed
(`docker kill`): Swarm starts it again, its running run is failed with a reason, another
user's run on the other replica finishes. Background runs queued on a full replica are
run by the other, and outlive the replica that queued them. A rolling update to the same image retagged,
with runs going on: no run fails (each replica drains before it stops). Then
`deploy/stack.sh down --volumes`: the swarm left, docker_gwbridge removed, nothing of the
replicas' left (containers, sandbox folders and mounts, cgroups).

Marked `stack`: CI runs it once, as a step of its own (.ci/run), not in scripts/test.sh's
tiers. It needs root, a Docker engine that is in no swarm yet (it makes one and leaves it),
debootstrap (the images are built offline on first use, about 3 minutes), and the kernel
image. With GATEWAY_REQUIRE naming docker, anything missing fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import census, needs
from tests.support import Client, wait_for
from tests.ws_client import open_stream, receive

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parent.parent
STACK_SH = REPO / "deploy" / "stack.sh"
USERS = {"ann": "user", "bob": "user", "carol": "user", "dave": "user", "root": "admin"}
MAX_RUNS_PER_USER = 2
LEASE = 5  # seconds: a dead replica's runs are failed soon after it died
SETTINGS = f"""
pool_python = 0
pool_bash = 0
pool_deno = 0
pool_r = 0
max_concurrent_runs = 4
max_runs_per_user = {MAX_RUNS_PER_USER}
max_timeout = 120
drain_timeout = 120
lease_seconds = {LEASE}
"""
SLEEP = {"code": "import time; time.sleep(600)", "background": True}


def short(seconds: float, value: int) -> dict[str, Any]:
    return {"code": f"import time; time.sleep({seconds}); result = {value}", "background": True}


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_prefix() -> str:
    """A two-digit port prefix P with P00 (the LB), P01, P02 (replicas), P99 (PostgreSQL)
    free."""
    for prefix in range(61, 100):
        if all(port_free(prefix * 100 + n) for n in (0, 1, 2, 3, 99)):
            return str(prefix)
    raise AssertionError("no free port prefix for the stack")


def requirements() -> None:
    """Fail (GATEWAY_REQUIRE=docker) or skip when the stack cannot be deployed here."""
    if os.geteuid() != 0:
        needs.missing("docker", "the stack's gateways mount as root: run the test as root")
    if shutil.which("docker") is None:
        needs.missing("docker", "no docker CLI")
    state = subprocess.run(
        ["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if state.returncode != 0:
        needs.missing("docker", f"the Docker engine does not answer: {state.stderr.strip()}")
    if state.stdout.strip() != "inactive":
        needs.missing("docker", f"the engine is in a swarm already ({state.stdout.strip()})")
    if shutil.which("debootstrap") is None and not docker(
        "images", "-q", "kernel-gateway-base", check=False
    ):
        needs.missing("docker", "no debootstrap to build the stack's images with")


@dataclass
class Stack:
    name: str
    folder: Path
    prefix: str
    tokens: dict[str, str]
    env: dict[str, str]
    retagged: list[str] = field(default_factory=list)

    @property
    def lb(self) -> int:
        return int(f"{self.prefix}00")

    def replica_port(self, slot: int) -> int:
        return int(f"{self.prefix}{slot:02d}")

    def client(self, user: str, port: int | None = None) -> Client:
        return Client(port or self.lb, self.tokens[user])

    def instances(self) -> set[str]:
        found = set()
        for path in self.folder.glob("replica-*/instance-id"):
            with contextlib.suppress(OSError):
                found.add(path.read_text().strip())
        return found

    def service(self, what: str) -> str:
        return f"{self.name}_{what}"

    def containers(self, slot: int) -> list[str]:
        """The running containers of the gateway's task in `slot`."""
        lines = docker(
            "ps",
            "--filter",
            f"label=com.docker.swarm.service.name={self.service('gateway')}",
            "--format",
            '{{.ID}} {{.Label "com.docker.swarm.task.name"}}',
        ).splitlines()
        prefix = f"{self.service('gateway')}.{slot}."
        return [line.split()[0] for line in lines if line.split()[1].startswith(prefix)]

    def healthy(self, port: int) -> bool:
        with contextlib.suppress(OSError):
            return Client(port).request("GET", "/v1/health", timeout=5).status == 200
        return False

    def stack_sh(self, *args: str, timeout: float = 1200) -> str:
        done = subprocess.run(
            [str(STACK_SH), *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"deploy/stack.sh {' '.join(args)}: {done.stderr[-4000:]}"
        return done.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    requirements()
    ident = secrets.token_hex(3)
    # short: the sandboxes' socket paths are under it (107 bytes at most)
    folder = Path(f"/tmp/gws-{ident}")
    scratch = tmp_path_factory.mktemp("stack")
    tokens = {user: f"{user}-{secrets.token_hex(16)}" for user in USERS}
    (scratch / "tokens.json").write_text(
        json.dumps({tokens[u]: {"user": u, "role": role} for u, role in USERS.items()})
    )
    (scratch / "settings.toml").write_text(SETTINGS)
    prefix = free_prefix()
    env = {
        "GATEWAY_STACK_NAME": f"gwtest{ident}",
        "GATEWAY_STACK_DIR": str(folder),
        "GATEWAY_STACK_TOKENS": str(scratch / "tokens.json"),
        "GATEWAY_STACK_SETTINGS": str(scratch / "settings.toml"),
        "GATEWAY_STACK_PORT_PREFIX": prefix,
        "GATEWAY_STACK_POSTGRES_PORT": f"{prefix}99",
        "GATEWAY_STACK_REPLICAS": "2",
    }
    if "GATEWAY_DOCKER_IMAGE" in os.environ:
        env["GATEWAY_STACK_KERNEL_IMAGE"] = os.environ["GATEWAY_DOCKER_IMAGE"]
    deployed = Stack(f"gwtest{ident}", folder, prefix, tokens, env)
    try:
        deployed.stack_sh("up")
        for slot in (1, 2):  # both replicas, not only the one the LB found first
            assert wait_for(lambda s=slot: deployed.healthy(deployed.replica_port(s)), 120)
        yield deployed
    finally:
        instances = deployed.instances()
        deployed.stack_sh("down", "--volumes", timeout=600)
        for tag in deployed.retagged:
            docker("rmi", tag, check=False)
        shutil.rmtree(folder, ignore_errors=True)
        assert_all_gone(deployed, instances)


def assert_all_gone(stack: Stack, instances: set[str]) -> None:
    """After `down`: no swarm, no docker_gwbridge, nothing of the stack or its replicas."""
    assert docker("info", "--format", "{{.Swarm.LocalNodeState}}") == "inactive"
    assert "docker_gwbridge" not in docker("network", "ls", "--format", "{{.Name}}").split()
    assert not docker("ps", "-aq", "--filter", f"label=com.docker.stack.namespace={stack.name}")
    assert not docker("volume", "ls", "-q", "--filter", f"name={stack.name}_")
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(stack.folder) not in mounts, "a mount of the stack's folder is left"
    # the repo's census, told the replicas' instance ids: their kernel containers (by label)
    # and the cgroups of their sandboxes (by name)
    assert instances, "the replicas never wrote their instance ids"
    census.INSTANCES.update(instances)
    census.DOCKER_INSTANCES.update(instances)
    left = census.docker_leftovers(set()) + census.sandbox_cgroups(set())
    assert not left, f"left behind by the stack's replicas: {left}"


def status_of(client: Client, run_id: str) -> dict[str, Any]:
    answer = client.request("GET", f"/v1/runs/{run_id}")
    assert answer.status == 200, answer.body[:500]
    record: dict[str, Any] = answer.json()
    return record


def submit(client: Client, body: dict[str, Any]) -> str:
    answer = client.request("POST", "/v1/runs", body)
    assert answer.status == 202, answer.body[:500]
    return str(answer.json()["id"])


def final(client: Client, run_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        record = status_of(client, run_id)
        if record["status"] not in ("queued", "running"):
            return record
        assert time.monotonic() < deadline, f"run {run_id} still {record['status']}"
        time.sleep(0.5)


# --- through the load balancer ----------------------------------------------------------------


def test_submit_poll_cancel_and_the_per_user_limit_through_the_load_balancer(
    stack: Stack,
) -> None:
    ann, bob = stack.client("ann"), stack.client("bob")
    done = final(ann, submit(ann, short(1, 41)))
    assert done["status"] == "succeeded" and done["result"] == 41, done
    # the per-user limit holds across the replicas the LB spreads ann's runs over
    sleeping = [submit(ann, SLEEP) for _ in range(MAX_RUNS_PER_USER)]
    refused = ann.request("POST", "/v1/runs", SLEEP)
    assert refused.status == 429, refused.body[:500]
    assert bob.request("POST", "/v1/runs", short(0, 1)).status == 202  # another user's room
    for run_id in sleeping:  # a cancel through the LB reaches the replica that runs it
        answer = ann.request("DELETE", f"/v1/runs/{run_id}")
        assert answer.status in (200, 202), answer.body[:500]
    for run_id in sleeping:
        assert final(ann, run_id)["status"] == "cancelled"
    assert final(ann, submit(ann, short(0, 2)))["status"] == "succeeded"


def test_a_websocket_stream_passes_through_the_load_balancer(stack: Stack) -> None:
    async def stream() -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {stack.tokens['bob']}"}
        messages = []
        async with open_stream(stack.lb, headers) as ws:
            code = "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')"
            await ws.write_message(json.dumps({"type": "run", "ref": "r", "code": code}))
            while (message := await receive(ws)) is not None:
                messages.append(message)
                if message["type"] == "done":
                    break
        return messages

    messages = asyncio.run(stream())
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "accepted" and kinds[-1] == "done", kinds
    assert "output" in kinds
    assert messages[-1]["run"]["stdout"] == "first\nsecond\n"


# --- a replica killed ---------------------------------------------------------------------------


def test_a_killed_replica_is_restarted_and_only_its_runs_fail(stack: Stack) -> None:
    ann = stack.client("ann", stack.replica_port(1))  # placed on each replica, directly
    bob = stack.client("bob", stack.replica_port(2))
    lb_admin = stack.client("root")
    doomed = submit(ann, SLEEP)
    survivor = submit(bob, short(12, 7))
    assert wait_for(lambda: status_of(lb_admin, doomed)["status"] == "running", 60)
    [container] = stack.containers(1)
    docker("kill", container)
    # Swarm starts slot 1 again: a new container, healthy on the same port
    assert wait_for(lambda: (found := stack.containers(1)) and found != [container], 60), (
        "Swarm did not start the killed replica again"
    )
    assert wait_for(lambda: stack.healthy(stack.replica_port(1)), 120)
    failed = final(lb_admin, doomed, timeout=60)
    assert failed["status"] == "failed", failed
    assert failed["notes"], "a failed run says why"
    finished = final(lb_admin, survivor, timeout=60)
    assert finished["status"] == "succeeded" and finished["result"] == 7, finished


# --- queued runs taken by the other replicas --------------------------------------------------


def running(client: Client, run_ids: list[str]) -> bool:
    return all(status_of(client, run_id)["status"] == "running" for run_id in run_ids)


def test_queued_runs_go_where_there_is_room_and_outlive_their_replica(stack: Stack) -> None:
    """Replica 1's four slots held (ann's and bob's long runs): carol's background runs sent
    to it wait in the store's queue and replica 2, idle, runs them. Then both replicas full
    (carol's and dave's long runs on replica 2), root queues two runs on replica 1 and its
    task is killed: its running runs fail, the queued ones wait in the store and are run
    once a replica has room again (the restarted one)."""
    one = {user: stack.client(user, stack.replica_port(1)) for user in USERS}
    two = {user: stack.client(user, stack.replica_port(2)) for user in USERS}
    lb_admin = stack.client("root")
    holding_one = [submit(one[user], SLEEP) for user in ("ann", "bob") for _ in range(2)]
    assert wait_for(lambda: running(lb_admin, holding_one), 90)
    moved = [submit(one["carol"], short(0, 10 + i)) for i in range(2)]
    for i, run_id in enumerate(moved):
        record = final(lb_admin, run_id)
        assert record["status"] == "succeeded" and record["result"] == 10 + i, record
        assert any("run by gateway replica" in note for note in record["notes"]), (
            record["notes"],
            [status_of(lb_admin, run_id)["status"] for run_id in holding_one],
        )
    assert running(lb_admin, holding_one)  # replica 1's slots were never free meanwhile
    holding_two = [submit(two[user], SLEEP) for user in ("carol", "dave") for _ in range(2)]
    assert wait_for(lambda: running(lb_admin, holding_two), 90)
    waiting = [submit(one["root"], short(0, 20 + i)) for i in range(2)]
    time.sleep(2)
    assert [status_of(lb_admin, run_id)["status"] for run_id in waiting] == ["queued"] * 2
    [container] = stack.containers(1)
    docker("kill", container)
    for run_id in holding_one:
        failed = final(lb_admin, run_id, timeout=90)
        assert failed["status"] == "failed" and failed["notes"], failed
    for i, run_id in enumerate(waiting):
        record = final(lb_admin, run_id, timeout=120)
        assert record["status"] == "succeeded" and record["result"] == 20 + i, record
    assert running(lb_admin, holding_two)  # the other replica's runs untouched
    for run_id in holding_two:
        assert lb_admin.request("DELETE", f"/v1/runs/{run_id}").status in (200, 202)
    for run_id in holding_two:
        assert final(lb_admin, run_id)["status"] == "cancelled"
    assert wait_for(lambda: stack.healthy(stack.replica_port(1)), 120)


# --- a rolling update ---------------------------------------------------------------------------


def test_a_rolling_update_fails_no_run(stack: Stack) -> None:
    image = docker(
        "service",
        "inspect",
        stack.service("gateway"),
        "--format",
        "{{.Spec.TaskTemplate.ContainerSpec.Image}}",
    ).split("@")[0]
    retag = f"{image.split(':')[0]}:rolling-{secrets.token_hex(4)}"
    docker("tag", image, retag)
    stack.retagged.append(retag)
    clients = [stack.client("ann"), stack.client("bob")]  # a long run each, before
    others = [stack.client("carol"), stack.client("dave")]  # a short run every 2 s, during
    submitted: list[tuple[Client, str]] = []
    refusals: list[str] = []
    stop = threading.Event()

    def keep_submitting() -> None:  # a run every 2 s through the LB while the update goes on
        n = 0
        while not stop.is_set():
            client = others[n % 2]
            try:
                answer = client.request("POST", "/v1/runs", short(1, n))
            except OSError as exc:
                refusals.append(repr(exc))
            else:
                if answer.status == 202:
                    submitted.append((client, str(answer.json()["id"])))
                else:
                    refusals.append(f"{answer.status} {answer.body[:300]!r}")
            n += 1
            stop.wait(2)

    before = [submit(client, short(8, 100 + i)) for i, client in enumerate(clients)]
    submitter = threading.Thread(target=keep_submitting)
    submitter.start()
    try:
        docker(
            "service", "update", "--detach=false", "--quiet", "--no-resolve-image",
            "--image", retag, stack.service("gateway"), timeout=600,
        )  # fmt: skip
        time.sleep(4)  # and a little after
    finally:
        stop.set()
        submitter.join()
    assert not refusals, f"submissions refused during the update: {refusals}"
    assert len(submitted) >= 5, submitted
    for i, run_id in enumerate(before):
        record = final(clients[i], run_id)
        assert record["status"] == "succeeded" and record["result"] == 100 + i, record
    for client, run_id in submitted:
        record = final(client, run_id)
        assert record["status"] == "succeeded", record
    tasks = docker(
        "service", "ps", stack.service("gateway"), "--filter", "desired-state=running",
        "--format", "{{.Image}}",
    ).split()  # fmt: skip
    assert tasks == [retag, retag], tasks
