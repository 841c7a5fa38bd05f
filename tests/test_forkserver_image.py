"""The forkserver runs this gateway's `kernels/zygote.py` over the kernel image's own
`kernels` package (DESIGN.md decision 23): an image built from another checkout would mix
two versions (a zygote that builds the kernel, over an image whose `kernels` cannot), so the
backend refuses to start with one and says how to build the right one."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

import kernels
from gateway.sandbox.forkserver.rootfs import IMAGE_KERNELS, stale_kernel_code
from tests import census
from tests.conftest import require_backend
from tests.support import DOCKER_IMAGE, GatewayThread

OURS = Path(kernels.__file__).parent


def image_root(tmp_path: Path) -> Path:
    """A root file system whose `kernels` is a copy of ours."""
    shutil.copytree(OURS, tmp_path / IMAGE_KERNELS, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.fast
def test_an_image_built_from_this_checkout_holds_the_same_kernel_code(tmp_path: Path) -> None:
    assert stale_kernel_code(image_root(tmp_path), OURS) == []


@pytest.mark.fast
def test_a_changed_missing_or_linked_file_is_named(tmp_path: Path) -> None:
    root = image_root(tmp_path)
    theirs = root / IMAGE_KERNELS
    (theirs / "python" / "prebuilt.py").unlink()  # an image from before it existed
    with (theirs / "zygote.py").open("a") as changed:
        changed.write("# another version\n")
    (theirs / "reaper.py").unlink()
    os.symlink(OURS / "reaper.py", theirs / "reaper.py")  # the same bytes, through a link
    assert stale_kernel_code(root, OURS) == ["python/prebuilt.py", "reaper.py", "zygote.py"]


def test_the_backend_refuses_an_image_of_other_kernel_code() -> None:
    require_backend("forkserver")
    tag = f"gateway-kernel-test-stale:{uuid.uuid4().hex[:8]}"
    changed = "echo '# another version' >> /opt/gateway/kernels/zygote.py"
    build = f"FROM {DOCKER_IMAGE}\nUSER root\nRUN {changed}\n"
    subprocess.run(
        ["docker", "build", "--network", "none", "-q", "-t", tag, "-"],
        input=build.encode(),
        check=True,
        capture_output=True,
    )
    server = GatewayThread(backend="forkserver", docker_image=tag, pool_python=0)
    try:
        with pytest.raises(RuntimeError, match=r"other kernel code .*zygote\.py.*docker/build\.sh"):
            server.start()
    finally:
        if server in census.LIVE_GATEWAYS:  # it started after all
            server.stop()
        subprocess.run(["docker", "rmi", "-f", tag], check=True, capture_output=True)
