"""The sandbox user's name: a passwd and a group entry for the uid and gid a kernel runs as.

Each sandbox runs as a uid of its own (`tenancy.py`, 1000000001 and up) that no account
file names, so without this `getpass.getuser()` raised, `whoami` failed and `ls -l` printed
numbers. Every sandbox with a mount namespace of its own therefore sees `/etc/passwd` and
`/etc/group` as its root file system has them (the kernel image's; the host's for the local
backend, which shows the host's root already) with one entry added for the sandbox's uid
and one for its gid, read-only, made for that sandbox and gone with it (DESIGN.md, "The
sandbox user's name"): Docker binds files of the sandbox's own folder, the forkserver's pid
1 writes them on the sandbox's own `/run` tmpfs, bubblewrap copies them into its own
tmpfs (`--ro-bind-data`). A base entry of the same name or id gives way to the sandbox's.

The user is `jovyan` of group `users`, as in Jupyter's docker-stacks images, so that a
cell's `whoami`, `getpass.getuser()` and `ls -l` print what they print there. Its home is
the kernel's `HOME`; its shell `/bin/bash` where the root's `/etc/shells` lists it.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

USER_NAME = "jovyan"
GROUP_NAME = "users"
MAX_BASE_BYTES = 256 * 1024  # a base file larger than this is not copied: the minimal one
# what a root file system without readable account files gets besides the sandbox user
MINIMAL_USERS = (
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
MINIMAL_GROUPS = "root:x:0:\nnogroup:x:65534:\n"
BASE_FILES = ("etc/passwd", "etc/group", "etc/shells")  # below a root file system


@dataclasses.dataclass(frozen=True)
class AccountFiles:
    """One sandbox's `/etc/passwd` and `/etc/group`."""

    passwd: str
    group: str


@dataclasses.dataclass(frozen=True)
class RootAccounts:
    """A root file system's own account files, and the shell its sandbox user gets."""

    passwd: str = MINIMAL_USERS
    group: str = MINIMAL_GROUPS
    shell: str = "/bin/sh"

    @classmethod
    def parse(cls, passwd: bytes | None, group: bytes | None, shells: bytes | None) -> RootAccounts:
        """From the files' bytes (None: missing); a file that is missing or too large is
        the minimal one."""
        listed = _text(shells, "").splitlines()
        return cls(
            passwd=_text(passwd, MINIMAL_USERS),
            group=_text(group, MINIMAL_GROUPS),
            shell="/bin/bash" if "/bin/bash" in listed else "/bin/sh",
        )

    @classmethod
    def read(cls, root: Path) -> RootAccounts:
        """The account files below `root` (blocking; a link is not followed)."""
        found = [_read_file(root / name) for name in BASE_FILES]
        return cls.parse(*found)

    def for_sandbox(self, uid: int, gid: int, home: str) -> AccountFiles:
        """The files a sandbox of `uid` and `gid` sees: these, with its own entries."""
        passwd = _without(self.passwd, USER_NAME, uid)
        passwd.append(f"{USER_NAME}:x:{uid}:{gid}::{home}:{self.shell}")
        group = _without(self.group, GROUP_NAME, gid)
        group.append(f"{GROUP_NAME}:x:{gid}:")
        return AccountFiles("\n".join(passwd) + "\n", "\n".join(group) + "\n")


def _text(data: bytes | None, default: str) -> str:
    if data is None or len(data) > MAX_BASE_BYTES:
        return default
    return data.decode("utf-8", "replace")


def _read_file(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read(MAX_BASE_BYTES + 1)


def _without(text: str, name: str, ident: int) -> list[str]:
    """The lines of an account file but those that name `name` or the id `ident`."""
    kept = []
    for line in text.splitlines():
        fields = line.split(":")
        if not line.strip() or fields[0] == name or fields[2:3] == [str(ident)]:
            continue
        kept.append(line)
    return kept
