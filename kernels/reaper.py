"""``python -P -m kernels.reaper COMMAND...``: the local sandbox's init when it has neither
a pid namespace (bubblewrap) nor a cgroup.

It runs COMMAND (the kernel) as its child and is a *child subreaper*
(`PR_SET_CHILD_SUBREAPER`): every process the kernel starts stays its descendant however
it detaches (`setsid`, a double fork, `env -i`), because orphans are reparented to it
instead of to the host's init. When the kernel exits, or on SIGTERM from the gateway, it
kills every descendant until none is left, then exits with the kernel's status.
Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS = 200  # at most ~2 s of rounds: forks racing the kill are caught by later ones


def _parents() -> dict[int, int]:
    links: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            links[int(entry)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return links


def descendants(root: int) -> set[int]:
    links = _parents()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in links.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_all() -> None:
    me = os.getpid()
    for _ in range(KILL_ROUNDS):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        reap()
        time.sleep(0.01)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class _Stop(Exception):
    """SIGTERM: the gateway ends the sandbox."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m kernels.reaper COMMAND...", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("kernels.reaper: cannot become a subreaper", file=sys.stderr)
        return 126
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the kernel
    child = os.posix_spawnp(argv[0], argv, dict(os.environ), setsigdef=(signal.SIGINT,))
    status = 0
    try:
        while True:
            pid, wait_status = os.waitpid(-1, 0)
            if pid == child:
                status = os.waitstatus_to_exitcode(wait_status)
                break
    except (_Stop, ChildProcessError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kill_all()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
