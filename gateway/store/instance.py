"""One live process per instance id, and one gateway per SQLite file.

A gateway's instance id names its sandboxes (a restart removes what a crashed gateway of
that id left behind) and, on a shared store, the runs it owns (a replica fails the runs of
its id left unfinished, and renews their leases). Two live processes with one id would
remove each other's sandboxes and fail each other's runs, so a start is refused while
another live process holds the id:

- on one machine, by an exclusive `flock` on `gateway-<id>.lock` in the machine's lock
  folder (`/run/lock`, else the temp folder): whatever their data dirs, two gateways of
  one id on one machine share the sandboxes' names (cgroups, temp folders, Docker labels);
- across machines, on a PostgreSQL store, by a session advisory lock on the id
  (`instance_lock_key`), held by the heartbeat's own connection
  (`gateway/store/postgres_leases.py`);
- a SQLite file is one gateway's (it fails every unfinished run in it at start), so its
  store holds an exclusive `flock` on `<file>.lock` while open.

A lock is released by the kernel or the database when its holder dies, however it dies,
so a stale lock never blocks a start; a lock file is removed when its gateway stops (one
that died leaves a small file, used again by the next start). The lock file says who holds
it (pid, host, data dir), for the one-line refusal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import tempfile
import time
from pathlib import Path

MACHINE_LOCK_FOLDERS = (Path("/run/lock"),)  # FHS: machine-wide, sticky, on tmpfs


class InstanceTaken(RuntimeError):
    """Another live process holds this instance id (or this SQLite file)."""


def instance_lock_key(instance_id: str) -> int:
    """The 64-bit key of the instance id's advisory lock in PostgreSQL (one-key form; the
    store's per-user locks use the two-key form, another key space)."""
    digest = hashlib.blake2b(f"gateway-instance:{instance_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def process_name() -> str:
    """`<pid>@<host>`: who this process is, in refusals and in PostgreSQL's
    `application_name` of the connection that holds the id."""
    return f"{os.getpid()}@{socket.gethostname()}"


class FileLock:
    """An exclusive `flock` on a file, held until `release()` (or the process's death)."""

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path = path
        self._descriptor: int | None = descriptor

    @classmethod
    def take(cls, path: Path, what: str, about: str = "") -> FileLock:
        """Lock `path` (created if missing) and write who holds it; raise InstanceTaken
        naming `what` and the holder if another live process holds it."""
        while True:
            descriptor = _open(path)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read(descriptor)
                os.close(descriptor)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise RuntimeError(f"cannot lock {path}: {exc.strerror}") from None
                raise InstanceTaken(
                    f"{what} is held by another live gateway ({holder or 'unknown'}; "
                    f"lock {path}): refusing to start"
                ) from None
            if _same_file(descriptor, path):
                break
            os.close(descriptor)  # its holder removed it as we opened it: a new one
        with contextlib.suppress(OSError):  # a lock file of another user: read-only
            os.ftruncate(descriptor, 0)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            os.pwrite(descriptor, f"pid {process_name()}{about} since {stamp}\n".encode(), 0)
        return cls(path, descriptor)

    def release(self) -> None:
        """Remove the file (while still holding it: whoever opened it meanwhile sees that it
        is gone, and makes a new one), then unlock."""
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(self._descriptor)  # the lock goes with the last descriptor
            self._descriptor = None


def machine_lock(instance_id: str, data_dir: Path) -> FileLock:
    """This machine's lock on the instance id; raises InstanceTaken if a live process holds it."""
    folder = next(
        (f for f in MACHINE_LOCK_FOLDERS if f.is_dir() and os.access(f, os.W_OK | os.X_OK)),
        Path(tempfile.gettempdir()),
    )
    return FileLock.take(
        folder / f"gateway-{instance_id}.lock",
        f"the instance id {instance_id!r}",
        f", data dir {data_dir}",
    )


def _open(path: Path) -> int:
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, os.O_RDWR | flags, 0o644)
    except PermissionError:  # another user's lock file in a shared folder: flock still works
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        found = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(descriptor)
    return (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino)


def _read(descriptor: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(descriptor, 300, 0).decode(errors="replace").strip()
    return ""
