"""Dependencies split by use (issue 9): the core installs neither backend's packages nor
MCP, and a part whose extra is missing says which extra to install.

A Python with the extras "uninstalled" is this one with their modules blocked
(`sys.modules[name] = None` makes every import of them fail, as if absent); what pip
would install for the bare project is asked of pip itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_gateway
from tests.support import REPO, GatewayThread, serving

TOKEN = "extras-test-token-0123456789"
KERNEL_SIDE = ("ipykernel", "matplotlib", "matplotlib_inline", "numpy", "pandas", "deno")
BLOCKED = ("docker", "mcp", "psycopg", "psycopg_pool", "tqdm", *KERNEL_SIDE)


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local", users={TOKEN: ("extras", "user")}))


def bare_gateway(
    cwd: Path, *args: str, blocked: tuple[str, ...] = BLOCKED
) -> subprocess.CompletedProcess[str]:
    """`gateway ARGS` in a Python where the `blocked` modules cannot be imported."""
    program = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "from gateway.cli import main\n"
        "code = main(sys.argv[1:])\n"
        f"leaked = sorted(n for n in sys.modules if n.split('.')[0] in {blocked!r}"
        " and sys.modules[n] is not None)\n"
        "assert not leaked, leaked\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "GATEWAY_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_client_needs_no_extra(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text("import sys\nprint('hi'); print('err', file=sys.stderr)\n")
    done = bare_gateway(tmp_path, "run", "hello.py", "--url", f"http://127.0.0.1:{server.port}")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n" and done.stderr.startswith("err\n")
    # a notebook's progress without the client extra (tqdm): plain lines
    cell = {"cell_type": "code", "metadata": {}, "source": "print(1)", "outputs": []}
    notebook = {"nbformat": 4, "nbformat_minor": 4, "metadata": {}, "cells": [cell]}
    (tmp_path / "one.ipynb").write_text(
        json.dumps({**notebook, "cells": [cell | {"execution_count": None}]})
    )
    done = bare_gateway(tmp_path, "run", "one.ipynb", "--url", f"http://127.0.0.1:{server.port}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[1/1] In [1] · "), done.stdout


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("serve", "--backend", "local"), "local"),
        (("serve", "--backend", "docker"), "docker"),
        (("mcp",), "mcp"),
        (("serve", "--store", "postgresql://gw@127.0.0.1/gw"), "postgres"),
    ],
)
def test_a_part_without_its_extra_names_the_extra(
    tmp_path: Path, args: tuple[str, ...], extra: str
) -> None:
    options = ("--data-dir", str(tmp_path / "data"), "--port", "0")
    done = bare_gateway(tmp_path, *args, *(options if args[0] == "serve" else ()))
    assert done.returncode != 0
    assert f"pip install 'kernel-gateway[{extra}]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_core_install_brings_no_backend_packages(tmp_path: Path) -> None:
    """What pip resolves for the bare project, and for its extras."""

    def resolved(spec: str) -> set[str]:
        report = tmp_path / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                spec,
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        installs = json.loads(report.read_text())["install"]
        return {item["metadata"]["name"].lower().replace("_", "-") for item in installs}

    core = resolved(str(REPO))
    heavy = {
        "docker",
        "mcp",
        "ipykernel",
        "numpy",
        "pandas",
        "matplotlib",
        "deno",
        "psycopg",
        "tqdm",
    }
    assert not core & heavy, core & heavy
    assert {"tornado", "pydantic", "jupyter-client", "nbformat"} <= core
    assert heavy <= resolved(f"{REPO}[all]")
