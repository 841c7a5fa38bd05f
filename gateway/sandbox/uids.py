"""A uid of its own for each sandbox alive: per-uid kernel counters are never shared.

`RLIMIT_NPROC` and `RLIMIT_SIGPENDING`, inotify instances and watches, user namespaces,
POSIX message queue bytes and key quotas are counted per uid across every namespace: one
uid for every kernel let one tenant use up what all the others count on. Each sandbox
without a workspace therefore takes a uid of the range `sandbox_uid + 1 ...
sandbox_uid + sandbox_uids` when it is created (a pooled kernel's too) and gives it back
when it is destroyed. Runs in a workspace run as its owner's uid instead (owners.py), so
that a user's later runs can write what the earlier ones left.

A uid is held by a `flock` on a file of its own in a root-only folder (`LEASE_DIR`),
whatever process holds it: gateways on one machine (replicas, tests) never hand out the
same uid twice, and a gateway that dies lets go of its uids with its descriptors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

from gateway.errors import SandboxError

LEASE_DIR = Path("/run/kernel-gateway/uids")


class UidLease:
    """One uid, held until `release()` (idempotent)."""

    def __init__(self, leases: UidLeases, uid: int, fd: int) -> None:
        self._leases = leases
        self.uid = uid
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._leases.give_back(self.uid, fd)


class UidLeases:
    """The range's uids, leased one per live sandbox, lowest free first."""

    def __init__(self, first: int, count: int, folder: Path = LEASE_DIR) -> None:
        self.first = first
        self.count = count
        self.folder = folder
        self._held: set[int] = set()
        self._lock = threading.Lock()  # takes run in threads

    def prepare(self) -> None:
        """Make the lease folder (blocking; root)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)

    def take(self) -> UidLease:
        """The lowest uid no sandbox on this machine holds (blocking: a few syscalls per
        uid other processes hold)."""
        with self._lock:
            for uid in range(self.first, self.first + self.count):
                if uid in self._held:
                    continue
                fd = os.open(self.folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held.add(uid)
                return UidLease(self, uid, fd)
        raise SandboxError(
            f"Every one of the {self.count} sandbox uids (--sandbox-uids) is in use on this "
            "machine: no sandbox can start until one ends."
        )

    def give_back(self, uid: int, fd: int) -> None:
        with self._lock:
            self._held.discard(uid)
            with contextlib.suppress(OSError):
                os.close(fd)  # the flock goes with the descriptor
