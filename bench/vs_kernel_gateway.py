"""The gateway against Jupyter Kernel Gateway, side by side in one run.

Kernel Gateway (the peer) runs local kernels with no isolation; per request it does what a
client of it would: `POST /api/kernels`, execute over the kernel's WebSocket, `DELETE`.
The gateway runs each request in a fresh sandboxed kernel (Docker by default), from its
warm pool when one is ready. Same workloads on both, in the same run:

- `print(1)`, a matplotlib chart saved with `savefig`, and (gateway only) bash `echo`:
  latency p50/p90/p99 over `--runs` sequential requests;
- `print(1)` throughput at concurrency 1, 4 and 8 (runs/s), and the machine's CPU time
  per run (all processes: /proc/stat) during the concurrency-4 pass;
- the gateway with its pools off (`--pool-python 0 ...`): what a run costs when the pool is
  empty;
- steady use: one client sending `print(1)` (and a chart) one run after another with
  `STEADY_GAP` s between them, never waiting for the pools to refill (the latencies above
  wait until they are full: `settle()`);
- the forkserver backend: an idle pooled kernel's own memory (USS: copy-on-write pages it
  still shares with its warm parent excluded), its pid 1 and kernel process together;

`--backend` takes several backends (`docker,forkserver`): each is measured in the same run,
beside the one peer measurement, and the table has a column per backend.

The peer is installed by this script into a virtual environment of its own (cached under
`--cache`), with the kernel packages pinned as in docker/requirements.txt. Results (JSON) go
to bench/results/; the table with ratios is printed for bench/README.md. Timings are never
asserted anywhere.

    .venv/bin/python bench/vs_kernel_gateway.py [--runs 30] [--backend docker,forkserver]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PRINT = "print(1)"
CHART = (
    "import matplotlib.pyplot as plt\n"
    "fig, ax = plt.subplots(); ax.plot([1, 3, 2]); ax.set_title('bench')\n"
    "fig.savefig('chart.png'); plt.close(fig)\n"
)
BASH = "echo 1"
STEADY_GAP = 0.25  # seconds between one steady client's runs
PEER_PACKAGES = ["jupyter-kernel-gateway==3.0.1", "websocket-client"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": pick(0.5) * 1000, "p90": pick(0.9) * 1000, "p99": pick(0.99) * 1000}


def machine_cpu_seconds() -> float:
    """CPU time all processes of the machine used so far (user, nice, system, irq...)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # not idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def pinned_kernel_packages() -> list[str]:
    lines = (REPO / "docker" / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --- the peer -------------------------------------------------------------------------------

PEER_DRIVER = textwrap.dedent(
    """
    import json, sys, time, uuid, http.client, concurrent.futures
    import websocket

    port, runs, code_by_name = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])

    def one(code):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/api/kernels", body=json.dumps({"name": "python3"}))
        kernel = json.loads(conn.getresponse().read())["id"]
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}/api/kernels/{kernel}/channels", timeout=120)
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False}}))
        replied = idle = False
        while not (replied and idle):
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            replied = replied or kind == "execute_reply"
            idle = idle or (kind == "status" and msg["content"]["execution_state"] == "idle")
        ws.close()
        conn.request("DELETE", f"/api/kernels/{kernel}")
        conn.getresponse().read()
        conn.close()

    def timed(code):
        started = time.perf_counter()
        one(code)
        return time.perf_counter() - started

    result = {}
    for name, code in code_by_name.items():
        timed(code)  # warm the caches once
        result[name] = [timed(code) for _ in range(runs)]
    for concurrency in (1, 4, 8):
        n = max(runs, concurrency * 4)
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: one("print(1)"), range(n)))
        result[f"throughput_{concurrency}"] = [n, time.perf_counter() - started]
    print(json.dumps(result))
    """
)


def ensure_peer(cache: Path) -> Path:
    """The peer's virtual environment (made once, then reused)."""
    venv = cache / "kernel-gateway-venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        packages = PEER_PACKAGES + [
            p for p in pinned_kernel_packages() if p.split("==")[0] != "pandas"
        ]
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
        stamp.touch()
    return python


def measure_peer(python: Path, runs: int) -> dict[str, Any]:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="kg-bench-"))
    server = subprocess.Popen(
        [
            str(python),
            "-m",
            "kernel_gateway",
            "--KernelGatewayApp.ip=127.0.0.1",
            f"--KernelGatewayApp.port={port}",
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        driver = workdir / "driver.py"
        driver.write_text(PEER_DRIVER)
        cpu = machine_cpu_seconds()
        out = subprocess.run(
            [
                str(python),
                str(driver),
                str(port),
                str(runs),
                json.dumps({"print": PRINT, "chart": CHART}),
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=workdir,
        )
        if out.returncode != 0:  # the driver's own words, not only its status
            raise RuntimeError(f"the Kernel Gateway driver failed: {out.stderr[-3000:]}")
        raw = json.loads(out.stdout)
        raw["cpu_seconds_all"] = machine_cpu_seconds() - cpu
        return raw
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


def wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


# --- the gateway ----------------------------------------------------------------------------


class Gateway:
    def __init__(self, backend: str, extra: list[str]) -> None:
        self.port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix="gw-bench-"))
        command = [sys.executable, "-m", "gateway", "serve", "--backend", backend]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        command += ["--instance-id", "bench" + secrets.token_hex(5)]
        command += ["--max-runs-per-user", "64", "--max-queued-runs", "64"]
        image = os.environ.get("GATEWAY_DOCKER_IMAGE")
        if image:
            command += ["--docker-image", image]
        self.process = subprocess.Popen(
            [*command, *extra], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_port(self.port)

    def run(self, body: dict[str, Any]) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            conn.request("POST", "/v1/runs", json.dumps(body), {"Content-Type": "application/json"})
            answer: dict[str, Any] = json.loads(conn.getresponse().read())
            return answer
        finally:
            conn.close()

    def health(self) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/v1/health")
            answer: dict[str, Any] = json.loads(conn.getresponse().read())
            return answer
        finally:
            conn.close()

    def settle(self, timeout: float = 60) -> None:
        """Wait until the pools are full again (nothing is measured while they refill)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pools = self.health().get("pools") or {}
            if all(p.get("ready", 0) >= p.get("size", 0) for p in pools.values()):
                return
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(120)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def timed_runs(gateway: Gateway, body: dict[str, Any], runs: int) -> list[float]:
    samples = []
    gateway.run(body)  # warm
    for _ in range(runs):
        gateway.settle()
        started = time.perf_counter()
        record = gateway.run(body)
        samples.append(time.perf_counter() - started)
        if record.get("status") != "succeeded":
            raise RuntimeError(f"a benchmark run did not succeed: {record}")
    return samples


def steady_runs(gateway: Gateway, body: dict[str, Any], runs: int) -> list[float]:
    """One client, one run after another, `STEADY_GAP` s apart: the pools never settle."""
    samples = []
    gateway.settle()
    for _ in range(runs):
        started = time.perf_counter()
        record = gateway.run(body)
        samples.append(time.perf_counter() - started)
        if record.get("status") != "succeeded":
            raise RuntimeError(f"a benchmark run did not succeed: {record}")
        time.sleep(STEADY_GAP)
    return samples


def forked_kernel_uss(gateway: Gateway) -> list[int]:
    """USS of each idle forked kernel (its pid 1 and its kernel process together): the
    processes the forkserver's parents forked that run as a sandbox user."""
    import psutil

    gateway.settle()
    time.sleep(2)  # the refilled kernels idle
    parents = [
        p
        for p in psutil.process_iter(["cmdline", "uids"])
        if any("zygote.py" in part for part in (p.info["cmdline"] or []))
        and p.info["uids"]
        and p.info["uids"].real == 0
    ]
    found = []
    for parent in parents:
        for init in parent.children():
            with contextlib.suppress(psutil.Error):
                if init.uids().real == 0:
                    continue
                total = init.memory_full_info().uss
                total += sum(c.memory_full_info().uss for c in init.children(recursive=True))
                found.append(total)
    return found


def pool_hits(gateway: Gateway) -> int:
    return sum(p.get("hits", 0) for p in (gateway.health().get("pools") or {}).values())


def throughput(gateway: Gateway, concurrency: int, runs: int) -> tuple[int, float, float, int]:
    """Runs, seconds, machine CPU seconds, and how many of the runs a pooled kernel served."""
    n = max(runs, concurrency * 4)
    gateway.settle()
    hits = pool_hits(gateway)
    cpu = machine_cpu_seconds()
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        records = list(pool.map(lambda _: gateway.run({"code": PRINT}), range(n)))
    seconds = time.perf_counter() - started
    failed = [r for r in records if r.get("status") != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} throughput runs did not succeed: {failed[0]}")
    return n, seconds, machine_cpu_seconds() - cpu, pool_hits(gateway) - hits


def measure_gateway(backend: str, runs: int, extra: list[str]) -> dict[str, Any]:
    gateway = Gateway(backend, extra)
    try:
        result: dict[str, Any] = {
            "print": timed_runs(gateway, {"code": PRINT}, runs),
            "chart": timed_runs(gateway, {"code": CHART}, runs),
            "bash": timed_runs(gateway, {"code": BASH, "language": "bash"}, runs),
            "steady_print": steady_runs(gateway, {"code": PRINT}, runs * 2),
            "steady_chart": steady_runs(gateway, {"code": CHART}, runs),
        }
        if backend == "forkserver":
            result["kernel_uss"] = forked_kernel_uss(gateway)
        for concurrency in (1, 4, 8):
            result[f"throughput_{concurrency}"] = throughput(gateway, concurrency, runs)
        result["health"] = gateway.health()
        return result
    finally:
        gateway.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--cache", type=Path, default=Path("/var/cache/gateway-bench"))
    parser.add_argument("--cold-flags", default="--pool-python 0 --pool-bash 0 --pool-deno 0")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    peer = measure_peer(ensure_peer(args.cache), args.runs)
    backends = args.backend.split(",")
    measured: dict[str, dict[str, Any]] = {}
    for backend in backends:
        pooled = measure_gateway(backend, args.runs, [])
        cold = measure_gateway(backend, args.runs, args.cold_flags.split())
        measured[backend] = {"gateway": pooled, "cold": cold, "rows": table(peer, pooled, cold)}
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"vs-kernel-gateway-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"peer": peer, "backends": measured}, indent=2))
    print("\n".join(markdown({b: m["rows"] for b, m in measured.items()})))
    print(f"written to {out}", file=sys.stderr)
    return 0


def table(
    peer: dict[str, Any], pooled: dict[str, Any], cold: dict[str, Any]
) -> list[dict[str, Any]]:
    rows = []
    for name in ("print", "chart", "bash"):
        ours = percentiles(pooled[name])
        theirs = percentiles(peer[name]) if name in peer else None
        rows.append({"what": f"`{name}` latency", "ours": ours, "peer": theirs})
        rows.append(
            {
                "what": f"`{name}` latency, pool empty",
                "ours": percentiles(cold[name]),
                "peer": theirs,
            }
        )
    for name, peer_name in (("steady_print", "print"), ("steady_chart", "chart")):
        rows.append(
            {
                "what": f"`{peer_name}` latency, steady use ({STEADY_GAP:g} s apart)",
                "ours": percentiles(pooled[name]),
                "peer": percentiles(peer[peer_name]),
            }
        )
    for concurrency in (1, 4, 8):
        n, seconds, cpu, hits = pooled[f"throughput_{concurrency}"]
        peer_n, peer_seconds = peer[f"throughput_{concurrency}"]
        rows.append(
            {
                "what": f"runs/s at concurrency {concurrency}",
                "ours": n / seconds,
                "peer": peer_n / peer_seconds,
                "cpu_ms_per_run": cpu / n * 1000,
                "pooled": f"{hits} of {n}",
            }
        )
    if pooled.get("kernel_uss"):
        uss = sorted(pooled["kernel_uss"])
        rows.append(
            {"what": "idle forked kernel USS (MB)", "ours": uss[len(uss) // 2] / 1e6, "peer": None}
        )
    rows.append({"what": "pools", "ours": pooled["health"].get("pools"), "peer": None})
    return rows


def markdown(by_backend: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One column per backend, then Kernel Gateway's, then each backend's ratio to it."""
    names = list(by_backend)
    head = (
        "| | "
        + " | ".join(names)
        + " | Kernel Gateway | "
        + " | ".join(f"{n} vs KG" for n in names)
        + " |"
    )
    lines = [head, "|---|" + "---:|" * (2 * len(names) + 1)]
    first = by_backend[names[0]]
    whats = [row["what"] for row in first]
    for rows in by_backend.values():  # rows one backend has alone (the forked kernels' USS)
        whats += [row["what"] for row in rows if row["what"] not in whats]
    by_what = {name: {row["what"]: row for row in rows} for name, rows in by_backend.items()}
    for what in whats:
        row = next(by_what[name][what] for name in names if what in by_what[name])
        cells, ratios = [], []
        peer = row["peer"]
        for name in names:
            other = by_what[name].get(what, {"ours": None})
            ours = other["ours"]
            if ours is None:
                cells.append("—")
                ratios.append("")
                continue
            if isinstance(ours, dict) and "p50" in ours:
                cells.append(f"{ours['p50']:.0f} ms ({ours['p90']:.0f} / {ours['p99']:.0f})")
                ratios.append(f"{peer['p50'] / ours['p50']:.1f}x faster" if peer else "")
            elif isinstance(ours, float):
                extra = ""
                if "cpu_ms_per_run" in other:
                    extra = f"; {other['cpu_ms_per_run']:.0f} ms CPU/run; pooled {other['pooled']}"
                cells.append(f"{ours:.2f}{extra}")
                ratios.append(f"{ours / peer:.2f}x" if isinstance(peer, float) else "")
            else:
                cells = []
                break
        if not cells or all(c == "—" for c in cells):
            continue
        if isinstance(peer, dict):
            theirs = f"{peer['p50']:.0f} ms ({peer['p90']:.0f} / {peer['p99']:.0f})"
        elif isinstance(peer, float):
            theirs = f"{peer:.2f}"
        else:
            theirs = "—"
        what += " p50 (p90 / p99)" if isinstance(row["ours"], dict) else ""
        lines.append(
            f"| {what} | " + " | ".join(cells) + f" | {theirs} | " + " | ".join(ratios) + " |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
