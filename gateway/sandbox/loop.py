"""Loop devices (Linux, root): a file system image attached to a free loop device and
mounted by descriptor, gone with its last unmount.

The device is attached with `LO_FLAGS_AUTOCLEAR`: the kernel detaches it when its file
system is unmounted (or when a failed mount closes it), so no loop device outlives its
mount, whoever unmounts it and however the gateway ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
from pathlib import Path

from gateway.sandbox.mounts import mount_device

LOOP_CONTROL = "/dev/loop-control"
LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_SET_STATUS64 = 0x4C04
LOOP_CTL_GET_FREE = 0x4C82
LO_FLAGS_AUTOCLEAR = 4
ATTEMPTS = 20  # a free device another process takes first: ask again


def _info64(image: Path) -> bytes:
    """A `struct loop_info64` with autoclear and the image's name (for `losetup -l`)."""
    name = os.fsencode(image)[-63:]
    return struct.pack(
        "=QQQQQIIII64s64s32sQQ", 0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0
    )


def mount_image(image: Path, target_fd: int, fstype: str, flags: int, options: str) -> str:
    """Mount `image` on the folder open at `target_fd` through a loop device; the device's
    name. Blocking.

    A loop device that holds the image already (its file system still mounted somewhere:
    a container of a gateway that died, another gateway) is mounted again, never a
    second one: two devices on one image would be two ext4 file systems writing one
    file. Callers serialise mounts of one image (workspace_images.py's per-user lock)."""
    held = loop_holding(image)
    if held is not None:
        mount_device(held, target_fd, fstype, flags, options)
        return held
    control = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        for _ in range(ATTEMPTS):
            number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
            device = f"/dev/loop{number}"
            loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                try:
                    fcntl.ioctl(loop, LOOP_SET_FD, backing)
                except OSError as exc:
                    if exc.errno == errno.EBUSY:
                        continue  # taken meanwhile
                    raise
                try:
                    fcntl.ioctl(loop, LOOP_SET_STATUS64, _info64(image))
                except OSError:
                    with contextlib.suppress(OSError):
                        fcntl.ioctl(loop, LOOP_CLR_FD)
                    raise
                # a failed mount leaves only our descriptor: closing it detaches (autoclear)
                mount_device(device, target_fd, fstype, flags, options)
                return device
            finally:
                os.close(loop)
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(backing)
        os.close(control)


def backing_file(device: str) -> str | None:
    """The file a loop device (`/dev/loopN`) holds, from sysfs; None if it holds none."""
    name = os.path.basename(device)
    try:
        text = Path(f"/sys/block/{name}/loop/backing_file").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text.rstrip("\n")


def loop_holding(image: Path) -> str | None:
    """The loop device (`/dev/loopN`) that holds `image` now, if one does."""
    wanted = str(image)
    for name in _loop_names():
        if backing_file(name) == wanted:
            return f"/dev/{name}"
    return None


def _loop_names() -> list[str]:
    try:
        return [name for name in os.listdir("/sys/block") if name.startswith("loop")]
    except OSError:
        return []
