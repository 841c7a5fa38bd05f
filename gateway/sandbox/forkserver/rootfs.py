"""The kernel image's root file system for the warm parents: the image's own layers (Docker's
overlay2 folders), mounted read-only as one overlay, so that forked kernels see exactly
the files a container of that image sees; nothing is copied."""

from __future__ import annotations

import os
from pathlib import Path

import docker.errors

import docker
from gateway.sandbox.mounts import MS_NODEV, MS_NOSUID, _check, _libc

MS_RDONLY = 0x1


def _inspect(image: str) -> dict[str, object]:
    client = docker.from_env(timeout=10)
    try:
        found: dict[str, object] = client.api.inspect_image(image)  # type: ignore[no-untyped-call]
        return found
    finally:
        client.close()


def image_layers(image: str) -> list[str]:
    """The image's layer folders, topmost first (RuntimeError when there are none)."""
    try:
        attrs = _inspect(image)
    except docker.errors.ImageNotFound:
        raise RuntimeError(
            f"the Docker engine has no image {image} (run docker/build.sh)"
        ) from None
    except docker.errors.DockerException as exc:
        raise RuntimeError(
            f"no Docker engine answers with the image {image}'s layers, which the forkserver "
            f"backend runs kernels from ({exc.__class__.__name__})"
        ) from None
    driver = attrs.get("GraphDriver")
    if not isinstance(driver, dict) or driver.get("Name") != "overlay2":
        raise RuntimeError(
            f"the image {image} is not stored by Docker's overlay2 driver: the forkserver "
            "backend mounts its layers"
        )
    data = driver.get("Data") or {}
    layers = [str(data["UpperDir"])] if data.get("UpperDir") else []
    layers += [p for p in str(data.get("LowerDir") or "").split(":") if p]
    if not layers or not all(Path(p).is_dir() for p in layers):
        raise RuntimeError(f"the image {image}'s layers are not readable here")
    return layers


def probe_rootfs(image: str) -> tuple[bool, str]:
    try:
        image_layers(image)
    except RuntimeError as exc:
        return False, str(exc)
    return True, (
        f"root, cgroups, bubblewrap and the image {image}'s layers: kernels forked from a "
        "warm parent, as strict as a container"
    )


def mount_rootfs(layers: list[str], target: Path) -> None:
    """Mount the layers read-only, as one file system, on `target` (nosuid, nodev).

    Each layer is named to the kernel as a descriptor of this process opened on it
    (`/proc/self/fd/N`), not by its path: overlayfs keeps its options as they were given, and
    every process that sees the mount reads them in /proc/self/mountinfo (a forked kernel
    would read Docker's overlay2 folders and the gateway's state folder)."""
    fds = [os.open(layer, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for layer in layers]
    try:
        named = [f"/proc/self/fd/{fd}" for fd in fds]
        if len(named) == 1:  # overlayfs wants two lower layers without an upper one
            named.append(named[0])
        options = "lowerdir=" + ":".join(named)
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        result = _libc.mount(b"overlay", str(target).encode(), b"overlay", flags, options.encode())
        _check(result, f"overlay {target}")
    finally:
        for fd in fds:
            os.close(fd)


IMAGE_KERNELS = "opt/gateway/kernels"  # where the image holds our `kernels` package


def stale_kernel_code(rootfs: Path, ours: Path) -> list[str]:
    """The files of our `kernels` package (`ours`) that the image mounted at `rootfs` holds
    otherwise, or not at all: the warm parent runs this gateway's `zygote.py` over the
    image's `kernels`, so both must come from one checkout. A file of the image that is a
    link counts as a difference, not followed (its target would be read on the host; the
    folders above are the operator's own build's)."""
    theirs = rootfs / IMAGE_KERNELS
    differ = []
    for path in sorted(ours.rglob("*.py")):
        relative = path.relative_to(ours)
        if "__pycache__" in relative.parts:
            continue
        try:
            fd = os.open(theirs / relative, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            differ.append(str(relative))
            continue
        with open(fd, "rb") as image_file:
            if image_file.read() != path.read_bytes():
                differ.append(str(relative))
    return differ
