"""Each user's own uid: the owner of their workspace, which every run in it runs as.

One uid per user, above the sandboxes' range (`sandbox_uid + sandbox_uids + 1` up), given
the first time the user's workspace is used and kept for good, with a quota (the uid owns
the user's image, workspace_images.py) or without one (a plain folder: `--workspace-bytes
0`, or a machine that cannot mount images). So per-uid kernel counters (`RLIMIT_NPROC`,
`RLIMIT_SIGPENDING` that the bash kernel's write order relies on, inotify instances,
message queue bytes) are never shared with another tenant's runs, and a user's later runs
can write what the earlier ones left. A user's own runs share their uid, as they share
their files.

The uids are names in the workspaces root's `.images` folder (root-only; no user's folder
can be named so): `<uid>.<user>.uid`, an empty file, and an image `<uid>.<user>.img`
names its owner too (images made before these records named it alone). A new uid is one
above the highest any name there holds, taken under `.images/.lock` (`flock`) and written
before the lock is let go: gateways on one machine that share a root never give two users
one uid, and a gateway that restarts reads the same names. A uid is never given again,
also when its user's workspace is deleted.

A plain folder used before it had an owner (its runs ran as `sandbox_uid`, then shared by
every user) is adopted the first time it is used as one: the folder, and what the old
shared uid owned in it, become the user's, walked by descriptor without following links.
Until then the record is `<uid>.<user>.uid.new` (a uid given for an image, whose making
moves the files itself, or an adoption cut short), so a folder is adopted, with the same
uid, whenever it is first used without an image.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from pathlib import Path

from gateway.errors import InvalidPath, SandboxError

IMAGES = ".images"  # the gateway's folder in the workspaces root (the images, the owners)
LAST_UID = 2**32 - 2  # (uid_t)-1 and -2 mean "no change" and "nobody" to some calls
_NAME = re.compile(r"(\d+)\.(.+)\.(img|img\.new|uid|uid\.new)")
_MINE = ("img", "uid", "uid.new")  # what names a user's uid, in order of trust
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def flock(path: Path, how: int) -> int:
    """A descriptor of `path` (made if missing) holding `flock(how)`; close it to let go."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
    return fd


def adopt(folder_fd: int, legacy_uid: int, uid: int, gid: int) -> None:
    """Give the folder open at `folder_fd`, and what `legacy_uid` owns below it, to `uid`
    (blocking). No link is followed: a folder swapped for one meanwhile is skipped."""
    os.fchown(folder_fd, uid, gid)
    for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=folder_fd, follow_symlinks=False):
        for name in [*dirs, *files]:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid == legacy_uid:
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)


class WorkspaceOwners:
    """The users' uids under one workspaces root. Every method blocks: call them in a
    thread."""

    def __init__(self, root: Path, first_uid: int, gid: int, legacy_uid: int) -> None:
        self.root = root
        self.folder = root / IMAGES
        self.first_uid = first_uid
        self.gid = gid
        self.legacy_uid = legacy_uid  # what every workspace run ran as before owners
        self._known: dict[str, int] = {}  # user folder -> uid, once its record is final
        self._opening: dict[str, threading.Lock] = {}  # one thread at a time per user

    def names_of(self, user: str, names: list[str] | None = None) -> dict[str, int]:
        """The user's names in `.images` (`img`, `img.new`, `uid`, `uid.new`) and the uid
        each holds."""
        if names is None:
            try:
                names = os.listdir(self.folder)
            except FileNotFoundError:
                names = []
        found: dict[str, int] = {}
        for name in names:
            match = _NAME.fullmatch(name)
            if match and match[2] == user:
                found[match[3]] = int(match[1])
        return found

    def give(self, user: str) -> int:
        """The user's uid, given now if they have none (their image is about to be made,
        with their folder's files moved into it: the folder itself is not adopted)."""
        return self._take(user, "uid.new")

    def refuse_hidden(self, user: str) -> None:
        """Refuse a plain folder whose user has an image: a gateway without quotas would
        hide the image's files (under its mount point) and write beside them."""
        if "img" in self.names_of(user):
            raise InvalidPath(
                f"The workspace {self.root / user} lives in a file system image, and this "
                "gateway runs without workspace quotas: its files would be hidden. Ask the "
                "operator to run it with quotas again.",
                field="working_dir",
            )

    def open_plain(self, user: str) -> int:
        """The uid a run in the user's plain folder (no image) runs as; given, and the
        folder adopted, the first time."""
        known = self._known.get(user)
        if known is not None:
            return known
        with self._opening.setdefault(user, threading.Lock()):
            self.refuse_hidden(user)
            uid = self.names_of(user).get("uid")
            if uid is None:
                self.make_folder()
                lock = flock(self.folder / f"{user}.lock", fcntl.LOCK_EX)
                try:
                    self.refuse_hidden(user)  # made meanwhile by a gateway with quotas
                    uid = self.names_of(user).get("uid")
                    if uid is None:
                        uid = self._take(user, "uid.new")
                        self._adopt(user, uid)
                        new = self.folder / f"{uid}.{user}.uid.new"
                        os.rename(new, self.folder / f"{uid}.{user}.uid")
                except OSError as exc:
                    raise SandboxError(
                        f"The workspace {self.root / user} could not be given to its user: {exc}"
                    ) from exc
                finally:
                    os.close(lock)
            self._known[user] = uid
            return uid

    def make_folder(self) -> None:
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            self.folder.mkdir(mode=0o700)

    def _take(self, user: str, kind: str) -> int:
        """The uid the user's names hold, else a new one recorded as `kind`."""
        self.make_folder()
        lock = flock(self.folder / ".lock", fcntl.LOCK_EX)
        try:
            names = os.listdir(self.folder)
            mine = self.names_of(user, names)
            for held in _MINE:
                if held in mine:
                    return mine[held]
            taken = [int(m[1]) for m in map(_NAME.fullmatch, names) if m]
            uid = max([self.first_uid - 1, *taken]) + 1
            if uid > LAST_UID:
                raise SandboxError("No uid is left for a new user's workspace.")
            record = self.folder / f"{uid}.{user}.{kind}"
            os.close(os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            return uid
        finally:
            os.close(lock)

    def _adopt(self, user: str, uid: int) -> None:
        point = self.root / user
        with contextlib.suppress(FileExistsError):
            os.mkdir(point, 0o755)
        fd = os.open(point, _DIR)  # the root is the operator's: no link in the way
        try:
            adopt(fd, self.legacy_uid, uid, self.gid)
        finally:
            os.close(fd)
