"""Workspace images: each user's workspace is an ext4 image of its own, loop-mounted, whose
size (`workspace_bytes`) is the workspace's quota.

`<workspaces>/<user>` is the mount point of `<workspaces>/.images/<uid>.<user>.img`, a
sparse file of `workspace_bytes` (made with `mkfs.ext4 -m 0`, `workspace_inodes` inodes,
its root owned by the user's uid), mounted `nosuid,nodev,noatime,discard`: a run that
fills it gets ENOSPC, the host's disk holds at most the image, and files deleted inside
give their blocks back to the host (`discard` punches holes in the image). No user's
folder can be named `.images` (`gateway.auth.user_folder`), and an admin's working_dir
below the root must lie in a user's folder (`gateway.runs.requests`).

The image's root belongs to its user's own uid (owners.py: one per user, above the
sandboxes' range, the same a plain folder of theirs had), which the image's name carries
too. Every run in the workspace runs as it, so a user's later runs can write what earlier
ones left; no other tenant shares it.

Mounted on first use, under a lock per user (`.images/<user>.lock`: `flock`, exclusive
to mount, then shared while this gateway keeps the mount), kept while the gateway runs
(two runs of one user share it), unmounted at stop unless another gateway on this
machine still holds it. A mount left by a gateway that died is found at the next use
and reused, or unmounted when any gateway starts if nobody holds it. Loop devices go
with their last mount (loop.py): a bubblewrap sandbox (any gateway's on the machine)
started while an image was mounted holds a copy of that mount (its root is a recursive
bind of /, beneath the tmpfs that hides the workspaces) until it ends, so a device may
outlive our unmount that long; mounting the image again then reuses that device.

A user folder with files from before quotas is migrated when its image is made: copied
into the new image (`cp -a`; what the old shared sandbox uid owned becomes the user's,
what their own uid owned stays theirs),
the image renamed into place, then the folder emptied and the image mounted on it. Files
that do not fit fail the run with a clear message and nothing changes. A folder that
holds files *beside* an existing image (a run without quotas since, or a migration cut
short between the rename and the emptying) is refused: its files are never hidden under
the mount nor deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import stat
import subprocess
import threading
from pathlib import Path

from gateway.errors import InvalidPath, SandboxError
from gateway.sandbox.loop import LOOP_CONTROL, backing_file, mount_image
from gateway.sandbox.mounts import (
    MS_NOATIME,
    MS_NODEV,
    MS_NOSUID,
    mount_source,
    mounts_under,
    unmount,
)
from gateway.sandbox.owners import WorkspaceOwners, adopt, flock

log = logging.getLogger(__name__)

FSTYPE = "ext4"
MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOATIME
MOUNT_OPTIONS = "discard"
BYTES_PER_INODE = 4096  # at most one inode per 4 KiB: the inode tables stay under 1/16
COMMAND_TIMEOUT = 600.0  # mkfs, or copying a workspace from before quotas
_IMAGE_NAME = re.compile(r"(\d+)\.(.+)\.img(\.new)?")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def mkfs(image: Path, size: int, inodes: int, uid: int, gid: int) -> None:
    """A fresh, sparse ext4 image of `size` bytes (blocking). The inode tables need no
    zeroing (mkfs discards the file: it reads as zeros) and neither does the journal."""
    fd = os.open(image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    inodes = max(64, min(inodes, size // BYTES_PER_INODE))
    command = ["mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(inodes)]
    command += ["-E", f"root_owner={uid}:{gid},lazy_journal_init=1", str(image)]
    _check_run(command, "mkfs.ext4")


def _check_run(command: list[str], what: str, pass_fds: tuple[int, ...] = ()) -> None:
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
            pass_fds=pass_fds,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(errno.EIO, f"{what}: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip()[-500:]
        raise OSError(errno.EIO, f"{what} failed: {detail}")


class WorkspaceImages:
    """The users' workspace images under one workspaces root, and the mounts this gateway
    holds. Every method blocks: call them in a thread."""

    def __init__(self, owners: WorkspaceOwners, size: int, inodes: int) -> None:
        self.owners = owners  # each user's uid, the owner of their image
        self.root = owners.root
        self.folder = owners.folder
        self.size = size
        self.inodes = inodes
        self.gid = owners.gid
        self._held: dict[str, tuple[int, int]] = {}  # user folder -> (lock fd, uid)
        self._opening: dict[str, threading.Lock] = {}  # one thread at a time per user

    # --- the gateway's life -------------------------------------------------------------

    def probe(self) -> str | None:
        """None when images can be made and mounted here; else why not."""
        if os.geteuid() != 0:
            return "the gateway does not run as root"
        if not os.path.exists(LOOP_CONTROL):
            return f"there are no loop devices ({LOOP_CONTROL})"
        if shutil.which("mkfs.ext4", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return "mkfs.ext4 is missing (e2fsprogs)"
        name = f".probe-{os.getpid()}-{secrets.token_hex(4)}"
        image, point = self.folder / f"{name}.img", self.folder / name
        try:
            self.owners.make_folder()
            mkfs(image, 8 << 20, 64, 0, 0)
            point.mkdir(mode=0o700)
            fd = os.open(point, _DIR)
            try:
                mount_image(image, fd, FSTYPE, MOUNT_FLAGS, MOUNT_OPTIONS)
            finally:
                os.close(fd)
            unmount(point, lazy=False)
        except OSError as exc:
            return f"a test image could not be made and mounted ({exc})"
        finally:
            with contextlib.suppress(OSError):
                unmount(point)
            with contextlib.suppress(OSError):
                point.rmdir()
            image.unlink(missing_ok=True)
        return None

    def sweep(self) -> int:
        """Unmount what a gateway that died left mounted and nobody holds; how many."""
        count = 0
        for point in mounts_under(self.root):
            if point.parent == self.root:
                user = point.name
            elif point.parent == self.folder and point.name.endswith(".mnt"):
                user = point.name[: -len(".mnt")]  # a migration's staging mount
            else:
                continue
            try:
                lock = flock(self.folder / f"{user}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live gateway holds it
            try:
                _unmount(point)
                count += 1
            finally:
                os.close(lock)
        return count

    def close(self) -> None:
        """Let go of every mount this gateway holds; unmount those no other holds."""
        for user in list(self._held):
            lock, _ = self._held.pop(user)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass  # another gateway on this machine still uses it
            else:
                with contextlib.suppress(OSError):
                    _unmount(self.root / user)
            finally:
                os.close(lock)

    # --- a user's workspace -------------------------------------------------------------

    def open_user(self, user: str) -> int:
        """Mount the user's image on their folder (once; made on first use); the user's
        uid."""
        with self._opening.setdefault(user, threading.Lock()):
            if user in self._held:
                return self._held[user][1]
            self.owners.make_folder()
            lock = flock(self.folder / f"{user}.lock", fcntl.LOCK_EX)
            try:
                uid = self._mount(user)
                fcntl.flock(lock, fcntl.LOCK_SH)  # others may use it; none may unmount it
            except BaseException:
                os.close(lock)
                raise
            self._held[user] = (lock, uid)
            return uid

    def image_of(self, user: str) -> tuple[int, Path] | None:
        """The user's image and uid, if there is one."""
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.folder):
                found = _IMAGE_NAME.fullmatch(name)
                if found and found[2] == user and not found[3]:
                    return int(found[1]), self.folder / name
        return None

    def _mount(self, user: str) -> int:
        point = self.root / user
        with contextlib.suppress(FileExistsError):
            os.mkdir(point, 0o755)
        point_fd = os.open(point, _DIR)  # the root is the operator's: no link in the way
        try:
            image = self.image_of(user)
            source = mount_source(point)
            if source is not None:
                if image is not None and backing_file(source) == str(image[1]):
                    return image[0]  # left by a gateway that died, or another's: reused
                raise SandboxError(
                    f"The workspace {point} cannot be used: something else is mounted there "
                    f"({source})."
                )
            if image is None:
                image = self._create(user, point_fd)
            elif os.listdir(point_fd):
                raise InvalidPath(
                    f"The workspace {point} cannot be used: its folder holds files beside "
                    f"its image {image[1].name} (written without the quota, or a migration "
                    "cut short). Ask the operator to move them into the workspace or away.",
                    field="working_dir",
                )
            mount_image(image[1], point_fd, FSTYPE, MOUNT_FLAGS, MOUNT_OPTIONS)
            return image[0]
        except OSError as exc:
            raise SandboxError(f"The workspace {point} could not be mounted: {exc}") from exc
        finally:
            os.close(point_fd)

    def _create(self, user: str, point_fd: int) -> tuple[int, Path]:
        """Make the user's image, with what their folder held migrated into it."""
        staging = self.folder / f"{user}.mnt"
        with contextlib.suppress(OSError):
            _unmount(staging)  # a migration cut short
        cut_short = self.owners.names_of(user).get("img.new")
        if cut_short is not None:  # an image cut short: never renamed, so never used
            os.unlink(self.folder / f"{cut_short}.{user}.img.new")
        uid = self.owners.give(user)
        new = self.folder / f"{uid}.{user}.img.new"
        mkfs(new, self.size, self.inodes, uid, self.gid)
        with contextlib.suppress(FileExistsError):
            staging.mkdir(mode=0o700)
        migrated = False
        try:
            below = os.open(staging, _DIR)
            try:
                mount_image(new, below, FSTYPE, MOUNT_FLAGS, MOUNT_OPTIONS)
            finally:
                os.close(below)
            try:
                image_root = os.open(staging, _DIR)  # now the image's root (root-only path)
                try:
                    os.rmdir("lost+found", dir_fd=image_root)
                    if os.listdir(point_fd):
                        self._migrate(user, point_fd, image_root, uid)
                        migrated = True
                finally:
                    os.close(image_root)
            finally:
                _unmount(staging)
        except BaseException:
            new.unlink(missing_ok=True)
            raise
        finally:
            with contextlib.suppress(OSError):
                staging.rmdir()
        final = self.folder / f"{uid}.{user}.img"
        os.rename(new, final)
        if migrated:
            _empty(point_fd)
            log.warning("moved the files of workspace %s into its image %s", user, final.name)
        return uid, final

    def _migrate(self, user: str, point_fd: int, staging_fd: int, uid: int) -> None:
        """Copy the folder's files into the new image (links stay links, nothing outside
        is followed); what the old shared sandbox uid owned becomes the user's."""
        source, target = f"/proc/self/fd/{point_fd}/.", f"/proc/self/fd/{staging_fd}/"
        try:
            _check_run(
                ["cp", "-a", "--one-file-system", source, target],
                "cp",
                pass_fds=(point_fd, staging_fd),
            )
        except OSError as exc:
            raise InvalidPath(
                f"The workspace {self.root / user} holds files from before workspace quotas "
                f"that could not be moved into its image of {self.size} bytes "
                f"(--workspace-bytes): {exc.strerror}. Ask the operator to make room or to "
                "raise the quota.",
                field="working_dir",
            ) from exc
        # cp gave the root the old folder's owner, and kept the old shared uid's files its
        adopt(staging_fd, self.owners.legacy_uid, uid, self.gid)


def _unmount(point: Path) -> None:
    """Unmount at once if nothing uses the mount, else detach it (it goes when unused)."""
    try:
        unmount(point, lazy=False)
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        log.warning("%s is still in use: detached, it goes when its last user does", point)
        unmount(point)


def _empty(folder_fd: int) -> None:
    """Delete what the folder open at `folder_fd` holds, following no link."""
    for name in os.listdir(folder_fd):
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=folder_fd)
        else:
            os.unlink(name, dir_fd=folder_fd)
