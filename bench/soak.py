"""Soak: many runs of every kind against one gateway process, then count what it left.

Starts `python -m gateway serve` (Docker by default) in a process of its own, sends `--runs`
runs at `--concurrency`, mixing successes, errors, timeouts, limit kills (memory, pids,
output), floods, cancels, kernel crashes and hostile code (foreign-parent floods, oversized
messages, huge error values, escaping links, fork bombs), then reports:

- the answers by case and status (every request must get an answer; no 5xx);
- the gateway's memory (RSS), open descriptors and threads after a warm-up and at the end;
- what is left once the gateway stopped: containers and volumes of its instance, temp
  folders, cgroups and processes.

Beside the runs, an attacker (`Attacker`) keeps trying what issue 20 found against the
gateway's own resources: bodies on endpoints that take none, large bodies left half sent,
answers never read, and the gateway must refuse or bound each (a 4xx, a 503 `capacity`, a
closed connection; never a 500). The hostile-kernel cases of the mix send one message of
many 8 MiB frames, and one whose last frame never comes.

It exits 1 when anything leaked, a request got a 5xx or no answer, an attack got a 500,
or memory grew by more than `--max-growth` (10 %) after the warm-up. A script, not a test
(timings are never asserted); `tests/test_soak.py` runs a short variant in CI.

    .venv/bin/python bench/soak.py --runs 1000 [--concurrency 4] [--backend docker]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
POOL_SLACK = 6

# name -> (weight, request body, statuses it may end with)
Case = tuple[int, dict[str, Any], frozenset[str]]
OK = frozenset({"succeeded"})
FAILED = frozenset({"failed"})
KILLED = frozenset({"killed"})
FOREIGN = (
    "k = get_ipython().kernel\n"
    "p = {'header': {'msg_id': 'x', 'msg_type': 'execute_request', 'session': 's',\n"
    "     'username': 'u', 'date': '', 'version': '5.3'}}\n"
    "for _ in range(120): k.session.send(k.iopub_socket, 'stream',\n"
    "    {'name': 'stdout', 'text': 'x' * 100_000}, parent=p)\n"
    "import time; time.sleep(30)\n"
)
# One kernel message of 20 frames of 8 MiB, from the kernel's own iopub thread; and raw
# frames that all say "more follows", written to the gateway's iopub connection.
MANY_FRAMES = (
    "import time, zmq\n"
    "thread = get_ipython().kernel.iopub_thread\n"
    "chunk = bytearray(8 * 1024 * 1024)\n"
    "def flood():\n"
    "    socket = thread.socket\n"
    "    socket.send(b'', zmq.SNDMORE)\n"
    "    for _ in range(20):\n"
    "        socket.send(chunk, zmq.SNDMORE, copy=False)\n"
    "    socket.send(b'end')\n"
    "thread.schedule(flood)\n"
    "time.sleep(60)\n"
)
NEVER_ENDS = (
    "import os, socket, time\n"
    "for name in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        conn = socket.socket(fileno=os.dup(int(name)))\n"
    "    except OSError:\n"
    "        continue\n"
    "    try:\n"
    "        if conn.family == socket.AF_UNIX and str(conn.getsockname()).endswith('-2'):\n"
    "            conn.getpeername()\n"
    "            break\n"
    "    except OSError:\n"
    "        pass\n"
    "    conn.close()\n"
    "conn.setblocking(True)\n"
    "chunk = bytes(8 * 1024 * 1024)\n"
    "for _ in range(20):\n"
    "    conn.sendall(bytes([3]) + len(chunk).to_bytes(8, 'big') + chunk)\n"
    "time.sleep(60)\n"
)
CASES: dict[str, Case] = {
    "print": (20, {"code": "print(1)"}, OK),
    "bash": (8, {"language": "bash", "code": "echo hi; echo err >&2"}, OK),
    "chart": (6, {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])"}, OK),
    "files": (
        6,
        {
            "code": "open('out.txt', 'w').write(open('in.txt').read() * 2)",
            "files": [{"path": "in.txt", "content": "ab"}],
            "return_files": ["out.txt", "../../etc/passwd", "*.txt"],
        },
        OK,
    ),
    "error": (8, {"code": "raise ValueError('boom')"}, FAILED),
    "exit": (4, {"language": "bash", "code": "exit 3"}, FAILED),
    "crash": (4, {"code": "import os\nos._exit(9)"}, FAILED),
    "timeout": (5, {"code": "while True: pass", "timeout": 1}, frozenset({"timed_out"})),
    "memory": (
        3,
        {"code": "x = bytearray(2048 * 1024 * 1024)\nx[::4096] = b'1' * len(x[::4096])"},
        KILLED,
    ),
    "fork_bomb": (
        2,
        {"language": "bash", "code": ":(){ :|:& };:\nsleep 5", "timeout": 10},
        KILLED | OK | frozenset({"timed_out", "failed"}),  # bash may outlive the storm
    ),
    "flood": (4, {"code": "print('x' * 10_000_000)"}, OK | KILLED),
    "foreign_flood": (3, {"code": FOREIGN, "timeout": 20}, KILLED),
    "huge_error": (3, {"code": "raise ValueError('A' * 30_000_000)"}, FAILED),
    "links": (
        3,
        {
            "language": "bash",
            "code": "ln -s /etc/passwd p; ln -s / root; mkfifo f",
            "return_files": ["p", "root/etc/shadow", "f", "**/*"],
        },
        OK,
    ),
    "cancel": (
        5,
        {"code": "import time\ntime.sleep(60)", "background": True},
        frozenset({"cancelled"}),
    ),
    "many_frames": (2, {"code": MANY_FRAMES, "timeout": 60}, KILLED),
    "never_ends": (2, {"code": NEVER_ENDS, "timeout": 60}, KILLED),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Attacker:
    """Runs the front-door attacks one after another, in a thread of its own, until
    stopped; `outcomes` counts how each ended ("refused 413", "closed", ...)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.thread = threading.Thread(target=self._loop, name="attacker", daemon=True)

    def start(self) -> Attacker:
        self.thread.start()
        return self

    def finish(self) -> dict[str, int]:
        self.stop.set()
        self.thread.join(120)
        return dict(self.outcomes)

    def _loop(self) -> None:
        attacks = (self.body_on_a_get, self.half_sent_body, self.unread_answers)
        while not self.stop.is_set():
            for attack in attacks:
                if self.stop.is_set():
                    return
                try:
                    self.outcomes[f"{attack.__name__}: {attack()}"] += 1
                except OSError as exc:
                    self.outcomes[f"{attack.__name__}: {exc.__class__.__name__}"] += 1
                self.stop.wait(0.5)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        return sock

    def _head(self, request: str, *headers: str) -> bytes:
        lines = [f"{request} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", *headers, "", ""]
        return "\r\n".join(lines).encode()

    @staticmethod
    def _status(sock: socket.socket) -> str:
        head = sock.recv(256)
        if not head:
            return "closed"
        parts = head.split(b" ", 2)
        return f"refused {parts[1].decode()}" if len(parts) > 1 else "garbled"

    def body_on_a_get(self) -> str:
        """A 40 MiB body announced on `GET /v1/health`: refused at the headers."""
        with self._connect() as sock:
            sock.sendall(self._head("GET /v1/health", "Content-Length: 41943040"))
            with contextlib.suppress(OSError):
                sock.sendall(b"x" * (4 * MiB))
            return self._status(sock)

    def half_sent_body(self) -> str:
        """A 40 MiB run body, 8 MiB of it sent, then the client goes quiet for a while."""
        with self._connect() as sock:
            sock.sendall(
                self._head(
                    "POST /v1/runs", "Content-Type: application/json", "Content-Length: 41943040"
                )
            )
            with contextlib.suppress(OSError):
                sock.sendall(b" " * (8 * MiB))
            self.stop.wait(2)
            return "held and dropped"

    def unread_answers(self) -> str:
        """Eight requests for the OpenAPI document whose answers are never read."""
        socks = [self._connect() for _ in range(8)]
        try:
            for sock in socks:
                sock.sendall(self._head("GET /openapi.json"))
            self.stop.wait(2)
            return "left unread"
        finally:
            for sock in socks:
                sock.close()


class Gateway:
    """The gateway under test, in a process of its own."""

    def __init__(self, backend: str, workdir: Path) -> None:
        self.instance = "soak" + secrets.token_hex(6)
        self.port = free_port()
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True)
        command = [sys.executable, "-m", "gateway", "serve", "--backend", backend]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        command += ["--instance-id", self.instance, "--output-limit-bytes", str(8 * MiB)]
        command += ["--max-queued-runs", "64", "--max-runs-per-user", "64"]
        image = os.environ.get("GATEWAY_DOCKER_IMAGE")
        if image:
            command += ["--docker-image", image]
        self.log = (workdir / "gateway.log").open("ab")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log, cwd=REPO)
        deadline = time.monotonic() + 60
        while not self.answers():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the gateway did not start; see {workdir / 'gateway.log'}")
            time.sleep(0.2)

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 180
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def answers(self) -> bool:
        try:
            return self.request("GET", "/v1/health", timeout=2)[0] == 200
        except OSError:
            return False

    def resources(self) -> dict[str, int]:
        pid = self.process.pid
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {
            "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
            "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
        }

    def settled(self, timeout: float = 120.0) -> dict[str, int]:
        """The resources once the warm pools are full again (each pooled kernel holds its
        sockets and descriptors, so an empty pool and a full one differ by dozens), or
        after `timeout` s, whatever they are then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, health = self.request("GET", "/v1/health", timeout=5)
            except OSError:
                status, health = 0, None
            pools = (health or {}).get("pools") or {}
            if status == 200 and all(p["ready"] >= p["size"] for p in pools.values()):
                break
            time.sleep(0.5)
        time.sleep(1.0)  # the last teardowns
        return self.resources()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(120)
        self.log.close()
        return code


def one_run(gateway: Gateway, name: str, body: dict[str, Any]) -> tuple[str, str]:
    """Send one run; its final status (or what went wrong) for the tally."""
    try:
        code, answer = gateway.request("POST", "/v1/runs", body)
        if code == 202:
            run_id = answer["id"]
            while gateway.request("GET", f"/v1/runs/{run_id}")[1]["status"] == "queued":
                time.sleep(0.05)
            code, answer = gateway.request("DELETE", f"/v1/runs/{run_id}")
        if code >= 500:
            return name, f"http {code}"
        if code != 200:
            return name, f"http {code} {answer['error']['code']}"
        return name, str(answer["status"])
    except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
        return name, f"no answer ({exc.__class__.__name__})"


def leftovers(instance: str) -> dict[str, list[str]]:
    prefix = f"gw{instance[:6]}-"
    found: dict[str, list[str]] = {
        "folders": sorted(str(p) for p in Path(tempfile.gettempdir()).glob(prefix + "*")),
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/gateway-{prefix}*")),
        "containers": [],
        "volumes": [],
    }
    if shutil.which("docker"):
        label = f"label=gateway.instance={instance}"
        for kind, command in (("containers", ["ps", "-aq"]), ("volumes", ["volume", "ls", "-q"])):
            out = subprocess.run(
                ["docker", *command, "--filter", label],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            found[kind] = out.stdout.split()
    return found


def soak(args: argparse.Namespace) -> dict[str, Any]:
    names = list(CASES)
    weights = [CASES[n][0] for n in names]
    rng = random.Random(args.seed)
    plan = rng.choices(names, weights=weights, k=args.runs)
    warmup = max(1, args.runs // 10)
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    gateway = Gateway(args.backend, workdir)
    attacker = Attacker(gateway.port)
    tally: collections.Counter[tuple[str, str]] = collections.Counter()
    started = time.monotonic()
    after_warmup: dict[str, int] = {}
    try:
        send: Callable[[str], tuple[str, str]] = lambda n: one_run(gateway, n, CASES[n][1])  # noqa: E731
        trend: list[dict[str, int]] = []
        with ThreadPoolExecutor(args.concurrency) as pool:
            attacker.start()  # in the warm-up too: its steady buffers are no growth
            for name, status in pool.map(send, plan[:warmup]):
                tally[(name, status)] += 1
            after_warmup = gateway.settled()
            step = max(1, (len(plan) - warmup) // 10)
            for start in range(warmup, len(plan), step):
                for name, status in pool.map(send, plan[start : start + step]):
                    tally[(name, status)] += 1
                trend.append({"runs": start + step, **gateway.resources()})
        attacks = attacker.finish()
        at_end = gateway.settled()
        exit_code = gateway.stop()
    except BaseException:
        attacker.stop.set()
        gateway.process.kill()
        raise
    seconds = time.monotonic() - started
    left = leftovers(gateway.instance)
    unexpected = {
        f"{name}: {status}": count
        for (name, status), count in tally.items()
        if status not in CASES[name][2]
    }
    growth = at_end["rss_bytes"] / after_warmup["rss_bytes"] - 1
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "backend": args.backend,
        "runs": args.runs,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 1),
        "statuses": {f"{n}: {s}": c for (n, s), c in sorted(tally.items())},
        "attacks": attacks,
        "unexpected": unexpected,
        "after_warmup": after_warmup,
        "trend": trend,
        "at_end": at_end,
        "rss_growth": round(growth, 4),
        "gateway_exit_code": exit_code,
        "leftovers": left,
    }
    result["ok"] = (
        exit_code == 0
        and not any(left.values())
        and growth <= args.max_growth
        and not any(s.startswith(("http 5", "no answer")) for _, s in tally)
        and not any(": refused 5" in a and "503" not in a for a in attacks)
        # bounded pools start threads (and the engine client connections) lazily
        and at_end["fds"] <= after_warmup["fds"] + POOL_SLACK
        and at_end["threads"] <= after_warmup["threads"] + POOL_SLACK
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--backend", default="docker", choices=["docker", "local"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-growth", type=float, default=0.10)
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    result = soak(args)
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"soak-{args.backend}-{args.runs}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"{'OK' if result['ok'] else 'FAILED'}: written to {out}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    threading.current_thread().name = "soak"
    sys.exit(main())
