"""How a kernel is started, the same for every backend: its command line, its environment,
and its connection file (ZMQ over ipc sockets, DESIGN.md decision 3)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from gateway.models.common import Language
from gateway.models.languages import traits
from gateway.sandbox.accounts import USER_NAME

# Ports are only suffixes of the socket file names with the ipc transport.
_CHANNELS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
CHANNEL_SUFFIXES = tuple(_CHANNELS.values())
SOCKET_PATH_MAX = 107
IMAGE_PATH = "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"  # in the kernel image
IMAGE_HOME = "/tmp"  # a kernel's HOME in the kernel image (a tmpfs of the sandbox's own)


def connection_info(prefix: str, key: str) -> dict[str, Any]:
    """Connection info for sockets named `<prefix>-1` ... `<prefix>-5`."""
    if len(prefix) + 2 > SOCKET_PATH_MAX:
        raise ValueError(f"socket path {prefix!r} is too long for a unix socket")
    return {
        **_CHANNELS,
        "ip": prefix,
        "transport": "ipc",
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "",
    }


def new_key() -> str:
    return secrets.token_hex(32)


def write_connection_file(path: Path, info: dict[str, Any]) -> None:
    path.write_text(json.dumps(info), encoding="utf-8")
    path.chmod(0o444)


def kernel_argv(language: Language, python: str, connection_file: str) -> list[str]:
    """The kernel's command line. `-P` keeps the working folder off `sys.path` while the
    kernel starts, and our launcher imports the startup extension first: a
    `sitecustomize.py`, `ipykernel_launcher.py` or `kernels/` planted in a persistent
    workspace never runs at kernel start. Our extension then puts the
    working folder on `sys.path` for the user's code, as Jupyter does. Bash and Deno
    kernels start the same way, from our own `kernels` package; so does R's, whose launcher
    then becomes `R --vanilla` (nothing of the working folder loads at start either)."""
    kernel = traits(language).kernel
    if kernel == "ipykernel":
        return [
            python,
            "-P",
            "-m",
            "kernels.python.launch",
            "-f",
            connection_file,
            "--IPKernelApp.extensions=kernels.python.startup",
            "--HistoryManager.enabled=False",
            "--InlineBackend.figure_formats=png",
        ]
    if kernel == "bash":
        return [python, "-P", "-m", "kernels.bash", "-f", connection_file]
    if kernel == "irkernel":  # replaced by R running IRkernel (kernels/r/__main__.py)
        return [python, "-P", "-m", "kernels.r", "-f", connection_file]
    # JavaScript and TypeScript: Deno's kernel behind our relay (kernels/deno/relay.py)
    return [python, "-P", "-m", "kernels.deno", "-f", connection_file]


def kernel_env(home: str, extra: dict[str, str], path: str) -> dict[str, str]:
    """The kernel's whole environment: nothing of the gateway's own leaks in. `USER` and
    `LOGNAME` name the sandbox's user (accounts.py), as a login would set them."""
    env = {
        "PATH": path,
        "HOME": home,
        "USER": USER_NAME,
        "LOGNAME": USER_NAME,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": f"{home}/.mpl",
        "IPYTHONDIR": f"{home}/.ipython",
        "JUPYTER_PLATFORM_DIRS": "1",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "TERM": "dumb",
        "DENO_DIR": f"{home}/.deno",
        "DENO_NO_UPDATE_CHECK": "1",
    }
    env.update(extra)
    return env


def image_env() -> dict[str, str]:
    """A kernel's environment in the kernel image (Docker's and the forkserver's), before a
    run's own `env`: the forkserver's warm parent runs in it too, so that what it builds
    is what a kernel would build."""
    env = kernel_env(IMAGE_HOME, {}, IMAGE_PATH)
    env.update({"PYTHONPATH": "/opt/gateway", "GATEWAY_MPL_CACHE": "/opt/gateway/mplcache"})
    return env


def log_tail(path: str | Path, dir_fd: int | None = None, limit: int = 4096) -> str:
    """The last `limit` bytes of a kernel's own output file, as text ("" when it cannot be
    read), never through a link the kernel made."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        with open(fd, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - limit))
            return log.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
