"""Bind mounts the gateway makes itself (Linux, root), and removing folders that may hold one.

A sandbox's small file systems (the kernel's socket folder, a Docker run's working folder)
are tmpfs mounts of the gateway's own, each in the sandbox's root-only folder.
A persistent workspace is handed to Docker as a bind mount of an already opened folder
(`/proc/self/fd/N`: the kernel resolves that link to the opened folder itself, never to a
path string a tenant could swap), placed in a root-only folder of the gateway's, with
`nosuid,nodev`. `remove_tree` unmounts what lies below a folder before deleting it, and
never descends into another file system, so that cleaning up after a crash can never
delete a workspace through a mount left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
from pathlib import Path

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_NOATIME = 0x400
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def bind_fd(fd: int, target: Path) -> None:
    """Bind-mount the folder open at `fd` on `target` (an empty folder), nosuid and nodev."""
    source = f"/proc/self/fd/{fd}".encode()
    where = os.fsencode(target)
    _check(_libc.mount(source, where, None, MS_BIND, None), f"bind {target}")
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV
    try:
        _check(_libc.mount(None, where, None, flags, None), f"remount {target}")
    except OSError:
        unmount(target)
        raise


SYS_OPEN_TREE = 428  # x86_64 (and every architecture of the unified syscall table)
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 0x1
AT_EMPTY_PATH = 0x1000
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def clone_tree(fd: int) -> int:
    """A detached bind mount of the folder open at `fd`, nosuid and nodev, as a descriptor
    (`open_tree(OPEN_TREE_CLONE)`): another mount namespace can attach it (`move_mount`),
    where a bind of a path or of /proc/self/fd/N would be refused. The caller closes it."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    tree = _libc.syscall(SYS_OPEN_TREE, fd, b"", ctypes.c_uint(flags))
    if tree < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree: {os.strerror(err)}")
    attr = _MountAttr(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    result = _libc.syscall(
        SYS_MOUNT_SETATTR,
        tree,
        b"",
        ctypes.c_uint(AT_EMPTY_PATH),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if result != 0:
        err = ctypes.get_errno()
        os.close(tree)
        raise OSError(err, f"mount_setattr: {os.strerror(err)}")
    return int(tree)


def mount_tmpfs(target: Path, options: str, *, noexec: bool = False) -> None:
    """Mount a fresh tmpfs (`options`: size, nr_inodes, uid, gid, mode) on `target` (an empty
    folder), nosuid and nodev, and noexec if asked."""
    flags = MS_NOSUID | MS_NODEV | (MS_NOEXEC if noexec else 0)
    where = os.fsencode(target)
    _check(_libc.mount(b"tmpfs", where, b"tmpfs", flags, options.encode()), f"tmpfs {target}")


def mount_device(source: str, target_fd: int, fstype: str, flags: int, options: str) -> None:
    """Mount the block device `source` on the folder open at `target_fd` (resolved by the
    kernel through /proc/self/fd, never as a path a tenant could swap)."""
    where = f"/proc/self/fd/{target_fd}".encode()
    result = _libc.mount(source.encode(), where, fstype.encode(), flags, options.encode())
    _check(result, f"mount {source}")


def unmount(target: Path, *, lazy: bool = True) -> None:
    """Detach the mount at `target`, if there is one (`lazy`: at once, even while it is
    in use; else an OSError EBUSY says it is)."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH if lazy else 0) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def mounts_under(folder: Path) -> list[Path]:
    """Mount points at or below `folder` (deepest first), from /proc/self/mountinfo."""
    prefix = os.fsencode(folder).rstrip(b"/")
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            point = _unescape(line.split()[4])
            if point == prefix or point.startswith(prefix + b"/"):
                found.append(Path(os.fsdecode(point)))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def mount_source(point: Path) -> str | None:
    """What is mounted at `point` (its source, such as `/dev/loop3`), the topmost mount;
    None when `point` is no mount point."""
    where = os.fsencode(point).rstrip(b"/")
    found = None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            fields = line.split()
            if _unescape(fields[4]) == where:
                tail = fields[fields.index(b"-") + 1 :]
                found = os.fsdecode(_unescape(tail[1])) if len(tail) > 1 else ""
    return found


def _unescape(field: bytes) -> bytes:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    out, i = bytearray(), 0
    while i < len(field):
        if field[i : i + 1] == b"\\" and field[i + 1 : i + 4].isdigit():
            out.append(int(field[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def remove_tree(folder: Path) -> None:
    """Delete `folder` and what is in it, unmounting anything mounted below it first; if a
    mount cannot be detached, nothing is deleted (an OSError says why)."""
    for point in mounts_under(folder):
        with contextlib.suppress(OSError):
            unmount(point)
    left = mounts_under(folder)
    if left:
        raise OSError(f"refusing to delete {folder}: {left[0]} is still mounted")
    shutil.rmtree(folder, ignore_errors=True)
