"""Where the machine's CPU goes for one isolated run: the profile behind issue 10's cold path.

Starts `python -m gateway serve` (Docker, pools off unless `--pooled`) in a process of its
own, sends `--runs` sequential `print(1)` runs, and splits the machine's CPU time over
them (from /proc/stat) into:

- the kernel and everything in its container: the run record's `usage.cpu_ms` (the
  container's cgroup, read before it is removed);
- the gateway process itself (its utime + stime, threads included);
- dockerd and containerd (long-lived: their utime + stime);
- the rest: per-container shims, runc, docker-init and the kernel of the host (container
  and volume set-up and teardown), which live too briefly to sample.

Machine CPU counts every process, so on a shared machine other work lands in "the rest".
The runs are measured in batches (`--batch`); besides the mean over all runs, the table
gives the quietest batch (least machine CPU per run): other work only ever adds, so that
batch is the closest to the gateway's own cost. The load average is recorded with it.

With `--perf` (Debian's `linux-perf`), `perf record -a -e cpu-clock` samples every CPU
during the measured runs, and every sample is attributed to the thread it caught: the
table then also splits "the rest" exactly, short-lived processes included (runc and its
init, the shims, docker-init, the host kernel's worker threads), whatever else runs on the
machine (it is listed as such, not guessed away).

With `--backend forkserver` (root, cgroups, bubblewrap, the kernel image) the same runs go
to forked kernels: the table's kernel is the sandbox's cgroup and dockerd + containerd give
way to the warm parents (their own CPU: each fork is charged to them). With `--perf` every
sample is then attributed to its thread as well (`perf script -F comm,pid,tid`, the process
tree from perf's fork events): the gateway's threads by name (its main thread is the
asyncio loop; Python threads all bear the interpreter's name, so `asyncio.to_thread` and
the executors' workers are one group), the warm parents, the forked kernels' processes
(pid 1 of the sandbox, the kernel, and a first child where an older zygote makes one)
and the kernel's threads (its main thread, ZMQbg/IO, ZMQbg/Reaper, its other Python
threads), the host kernel's threads and every other process on the machine by name.

With `--continue` (forkserver) every run starts `from` one snapshot kept before the
measured runs (issue 32): the continuation's processes (forked by the snapshot, whose
tree perf did not see begin: it is read from /proc first) are their own group, and the
branch's sandbox (forked by the `exec` warm parent) is the forked `exec` kernels'.

Prints a table (ms of CPU per run) and writes JSON to bench/results/. A script, not a test:
nothing is asserted.

    .venv/bin/python bench/cpu_profile.py [--runs 30] [--batch 5] [--pooled] [--perf]
        [--backend docker|forkserver] [--continue]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.sandbox.forkserver.parent import PROGRAM  # noqa: E402 - the warm parent's

TICK = os.sysconf("SC_CLK_TCK")
PERF_HZ = 999  # samples per second per CPU: each one stands for 1/PERF_HZ s of that CPU

# who a sampled thread is, by its command name (the gateway and this script by pid)
PERF_GROUPS = (
    ("runc (create, start, delete) and its init", ("runc",)),
    ("containerd-shim", ("containerd-shim",)),
    ("dockerd", ("dockerd",)),
    ("containerd", ("containerd",)),
    ("dockerd's hooks (re-exec'd dockerd)", ("exe",)),
    ("the kernel, its shell and docker-init", ("python", "ZMQbg", "sh", "docker-init")),
    ("host kernel threads", ("kworker", "ksoftirqd", "rcu", "kthreadd", "migration", "jbd2")),
    ("perf itself", ("perf",)),
)  # fmt: skip


SAMPLE = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s*$")  # `comm pid/tid`
FORK = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):\d+\)")  # (pid:tid):(ppid:ptid)
KTHREADD = 2  # the parent of every host kernel thread


def perf_groups(
    script_output: str,
    gateway_pid: int,
    runs: int,
    warm: dict[int, str] | None = None,
    known: dict[int, int] | None = None,
) -> dict[str, float]:
    """ms of CPU per run by group, from `perf script -F comm,pid,tid --show-task-events`:
    by process (Docker), or by thread and process tree with `warm` (the forkserver's warm
    parents: pid -> kind)."""
    counts: dict[str, int] = {}
    # pid -> parent pid, from the fork events (and `known`: the tree before perf began)
    parents: dict[int, int] = dict(known or {})
    threaded: set[int] = set()  # processes that started threads (of those forked: the kernel)
    samples: dict[tuple[str, int, int], int] = {}  # (comm, pid, tid) -> samples
    for line in script_output.splitlines():
        if fork := FORK.search(line):
            pid, tid, ppid = int(fork[1]), int(fork[2]), int(fork[3])
            if pid == tid:
                parents[pid] = ppid
            else:
                threaded.add(pid)
        elif (sample := SAMPLE.match(line)) and sample[1] != "swapper":  # the idle task
            key = (sample[1], int(sample[2]), int(sample[3]))
            samples[key] = samples.get(key, 0) + 1
    inits = {parents.get(pid) for pid in threaded}  # a forked kernel's pid 1 among them
    for (comm, pid, tid), n in samples.items():
        if pid == gateway_pid:
            group = "the gateway process" if warm is None else f"gateway: {thread(comm, pid, tid)}"
        elif pid == os.getpid():
            group = "this script (the client)"
        elif warm is None:
            group = next(
                (name for name, prefixes in PERF_GROUPS if comm.startswith(prefixes)),
                f"other: {comm}",
            )
        else:
            group = forked_group(comm, pid, tid, gateway_pid, warm, parents, threaded, inits)
        counts[group] = counts.get(group, 0) + n
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return {group: round(n * 1000 / PERF_HZ / runs, 1) for group, n in ordered}


def thread(comm: str, pid: int, tid: int) -> str:
    if tid == pid:
        return "main thread"
    # Python threads keep the name the interpreter was started by
    return "other Python threads" if comm.startswith("python") else f"{comm} thread"


def forked_group(
    comm: str,
    pid: int,
    tid: int,
    gateway_pid: int,
    warm: dict[int, str],
    parents: dict[int, int],
    threaded: set[int],
    inits: set[int | None],
) -> str:
    """Who a sample of the forkserver's machine is, by its process's place in the tree."""
    if pid in warm:
        return f"warm parent ({warm[pid]})"
    chain = ancestors(pid, parents)
    if pid in SNAPSHOTS:
        return "continuation: the snapshot (its fork for each)"
    if any(p in SNAPSHOTS for p in chain):  # `--continue`: what a kept kernel forked
        if pid in threaded:
            return f"continuation: the kernel's {thread(comm, pid, tid)}"
        return "continuation: the snapshot's fork (joins the branch, forks the kernel)"
    below = next((i for i, p in enumerate(chain) if p in warm), None)
    if below is not None:
        forked = f"forked {warm[chain[below]]} kernels"
        chain = chain[:below]  # pid's ancestors below the warm parent (it may have threads)
        if pid in threaded:
            return f"{forked}: the kernel's {thread(comm, pid, tid)}"
        if any(p in threaded for p in chain):
            return f"{forked}: the kernel's child processes ({comm})"
        if pid in inits:
            return f"{forked}: pid 1 (the sandbox's set-up, then its reaper)"
        return f"{forked}: the first child (cgroups, namespaces)"
    if gateway_pid in chain:
        return f"gateway's child processes: {comm}"
    if KTHREADD in (pid, *chain):
        return "host kernel threads"
    return "perf itself" if comm.startswith("perf") else f"other: {comm}"


SNAPSHOTS: set[int] = set()  # `--continue`: the kept kernels' processes, read from /proc


def process_tree() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    tree = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            path = f"/proc/{entry}/stat"
            with contextlib.suppress(OSError), open(path, encoding="ascii", errors="replace") as f:
                tree[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
    return tree


def ancestors(pid: int, parents: dict[int, int]) -> list[int]:
    chain: list[int] = []
    while (pid := parents.get(pid, 0)) > 0 and len(chain) < 64:  # 64: a reused pid's loop
        chain.append(pid)
    return chain


def machine_ms() -> float:
    """CPU time of the whole machine (all cores, idle and iowait excluded), in ms."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # idle, iowait
    return busy * 1000 / TICK


def processes() -> Iterator[tuple[int, str, list[str]]]:
    """Every live process: its pid, its command name and the /proc/PID/stat fields after it."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        yield int(entry.name), name, stat[stat.rindex(")") + 2 :].split()


def process_ms(names: tuple[str, ...]) -> float:
    """utime + stime of every live process whose command name is among `names`, in ms."""
    total = 0
    for _, name, fields in processes():
        if name in names:
            total += int(fields[11]) + int(fields[12])
    return total * 1000 / TICK


def warm_parents(gateway_pid: int) -> dict[int, str]:
    """The forkserver's warm parents under the gateway (bubblewrap's children that run
    zygote.py): pid -> kind (`ipykernel`, `bash`, `exec`)."""
    parents = {pid: int(fields[1]) for pid, _, fields in processes()}
    found = {}
    for pid in parents:
        if gateway_pid not in ancestors(pid, parents):
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv[1:3] == ["-P", PROGRAM]:  # python -P PROGRAM FD KIND ... (not bubblewrap)
            found[pid] = argv[4]
    # the forked kernels' first child and pid 1 (and a kernel before it execs) share it
    return {pid: kind for pid, kind in found.items() if not found.keys() & ancestors(pid, parents)}


def thread_names(pid: int) -> list[str]:
    """The command name of each of `pid`'s threads, the main thread first."""
    tasks = sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda task: int(task.name) != pid)
    return [(task / "comm").read_text().strip() for task in tasks]


def pid_ms(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def profile(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="cpuprof-"))
    port = free_port()
    command = [sys.executable, "-m", "gateway", "serve", "--backend", args.backend]
    command += ["--port", str(port), "--data-dir", str(workdir / "data")]
    command += ["--instance-id", "prof" + secrets.token_hex(6)]
    if not args.pooled:
        command += ["--pool-python", "0", "--pool-bash", "0", "--pool-deno", "0"]
    image = os.environ.get("GATEWAY_DOCKER_IMAGE")
    if image:
        command += ["--docker-image", image]
    log = (workdir / "gateway.log").open("ab")
    gateway = subprocess.Popen(command, stdout=log, stderr=log, cwd=REPO)
    perf: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(port, "GET", "/v1/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start; see {workdir}/gateway.log")
            time.sleep(0.2)
        body: dict[str, Any] = {"code": "print(1)"}
        before = set(process_tree())
        if args.continue_:
            status, kept = request(port, "POST", "/v1/runs", {"code": "x = 1", "keep": True})
            assert status == 200 and kept["snapshot"], kept
            body["from"] = kept["snapshot"]["id"]
        for _ in range(3):  # warm-up: caches, threads, connections
            request(port, "POST", "/v1/runs", body)
        time.sleep(2)  # teardown of the warm-up runs, pool refills
        known = process_tree()
        if args.continue_:  # the kept kernel's processes: what the keep left running
            SNAPSHOTS.update(pid for pid in known if pid not in before)
        warm = warm_parents(gateway.pid) if args.backend == "forkserver" else None
        threads = thread_names(gateway.pid)

        def engine_ms() -> float:
            if warm is None:
                return process_ms(("dockerd", "containerd"))
            return sum(pid_ms(pid) for pid in warm)

        if args.perf:
            perf_data = workdir / "perf.data"
            record = ["perf", "record", "-a", "-e", "cpu-clock", "-F", str(PERF_HZ)]
            perf = subprocess.Popen(
                [*record, "-o", str(perf_data)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)  # perf is sampling
        load_before = os.getloadavg()
        began = time.monotonic()
        batches: list[dict[str, float]] = []
        left = args.runs
        while left > 0:
            size = min(args.batch, left)
            left -= size
            start = (machine_ms(), pid_ms(gateway.pid), engine_ms())
            kernel = 0.0
            for _ in range(size):
                status, record = request(port, "POST", "/v1/runs", body)
                assert status == 200 and record["stdout"] == "1\n", record
                kernel += (record.get("usage") or {}).get("cpu_ms") or 0
            if not left:
                time.sleep(2)  # the last teardowns (off the answer's path) and refills
            end = (machine_ms(), pid_ms(gateway.pid), engine_ms())
            total, own, engine = (b - a for a, b in zip(start, end, strict=True))
            batches.append(
                {"runs": size, "machine": total, "kernel": kernel, "gateway": own, "engine": engine}
            )
        wall = time.monotonic() - began
        load_after = os.getloadavg()
        by_thread = None
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(60)
            perf = None
            read = ["perf", "script", "-i", str(perf_data), "--show-task-events"]
            script = subprocess.run(
                [*read, "-F", "comm,pid,tid"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            by_thread = perf_groups(script, gateway.pid, args.runs, warm, known)
    finally:
        if perf is not None:  # the runs failed: perf must not go on sampling every CPU
            perf.kill()
            perf.wait(60)
        gateway.terminate()
        gateway.wait(60)
        log.close()
    quietest = min(batches, key=lambda b: b["machine"] / b["runs"])
    whole = {k: sum(b[k] for b in batches) for k in batches[0]}
    return {
        "date": time.strftime("%Y-%m-%d"),
        "runs": args.runs,
        "batch": args.batch,
        "pooled": args.pooled,
        "continued": args.continue_,
        "backend": args.backend,
        "warm_parents": warm,
        "gateway_threads": threads,
        "wall_seconds": round(wall, 1),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "cpu_ms_per_run": per_run(whole, args.backend),
        "cpu_ms_per_run_quietest_batch": per_run(quietest, args.backend),
        "machine_ms_per_run_each_batch": [round(b["machine"] / b["runs"]) for b in batches],
        "perf_ms_per_run": by_thread,
    }


SHARES = {  # the names of the kernel's, the engine's and the rest's shares
    "docker": (
        "kernel (container cgroup)",
        "dockerd + containerd",
        "rest (shims, runc, init, host kernel, other work)",
    ),
    "forkserver": (
        "kernel (sandbox cgroup)",
        "warm parents (their own CPU: the forks)",
        "rest (what no cgroup counted, host kernel, other work)",
    ),
}


def per_run(totals: dict[str, float], backend: str) -> dict[str, float]:
    runs = totals["runs"]
    rest = totals["machine"] - totals["kernel"] - totals["gateway"] - totals["engine"]
    kernel, engine, others = SHARES[backend]
    shares = {
        "machine": totals["machine"],
        kernel: totals["kernel"],
        "gateway process": totals["gateway"],
        engine: totals["engine"],
        others: rest,
    }
    return {k: round(v / runs, 1) for k, v in shares.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=5, help="runs per measured batch")
    parser.add_argument("--pooled", action="store_true", help="keep the warm pools on")
    parser.add_argument("--perf", action="store_true", help="attribute every CPU sample (perf)")
    parser.add_argument("--backend", choices=sorted(SHARES), default="docker")
    parser.add_argument(
        "--continue", dest="continue_", action="store_true", help="every run `from` a snapshot"
    )
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    result = profile(args)
    args.results.mkdir(parents=True, exist_ok=True)
    kind = "pooled" if args.pooled else "cold"
    stem = kind if args.backend == "docker" else f"{args.backend}-{kind}"
    out = args.results / f"cpu-profile-{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    quiet = result["cpu_ms_per_run_quietest_batch"]
    backend = "Docker" if args.backend == "docker" else args.backend
    print(
        f"| CPU per {kind} {backend} run `print(1)`, ms | all {args.runs} runs "
        f"| quietest batch of {args.batch} |\n|---|---:|---:|"
    )
    for name, ms in result["cpu_ms_per_run"].items():
        print(f"| {name} | {ms:.0f} | {quiet[name]:.0f} |")
    before, after = result["load_average_before"], result["load_average_after"]
    print(f"load average {before[0]:.2f} before, {after[0]:.2f} after")
    print("machine ms per run, each batch:")
    print(" ".join(str(ms) for ms in result["machine_ms_per_run_each_batch"]))
    if args.backend != "docker":
        print("gateway threads (/proc, main first): " + ", ".join(result["gateway_threads"]))
        print(
            "warm parents: "
            + ", ".join(f"{k} (pid {p})" for p, k in result["warm_parents"].items())
        )
    if result["perf_ms_per_run"] is not None:
        print(f"\n| sampled by perf (cpu-clock, {PERF_HZ} Hz, all CPUs) | ms per run |\n|---|---:|")
        for name, ms in result["perf_ms_per_run"].items():
            print(f"| {name} | {ms:.0f} |")
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
