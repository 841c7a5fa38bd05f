"""The client side (`gateway.client`, the typed client, and `gateway.commands`: `gateway
run`, `gateway mcp`) and the server meet only in `gateway/cli.py`, the command line; the
client side imports nothing of the server but the one exception vocabulary they share
(tests/test_layers.py checks the layers of the server side)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.fast

GATEWAY = REPO / "gateway"
CLIENT_SIDE = (GATEWAY / "client", GATEWAY / "commands")
# What the client side may import of the gateway: itself and the bottom of the layers, the
# exception vocabulary (`gateway.errors`, a leaf that imports nothing of ours) among them.
CLIENT_MAY_IMPORT = (
    "gateway.client",
    "gateway.commands",
    "gateway.errors",
    "gateway.models",
    "gateway.terminal",
    "gateway.version",
)
LOADED_WITH_THEM: tuple[str, ...] = ()


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[str]:
    """Every module `path` imports, at the top or inside a function, relative ones resolved
    (`from gateway import client` names `gateway.client`)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_module_walk_sees_the_imports_it_must_judge() -> None:
    """The check below cannot pass by reading nothing: the command line is seen importing
    both sides."""
    names = set(imported(GATEWAY / "cli.py"))
    assert any(within(name, "gateway.commands") for name in names)
    assert any(within(name, "gateway.server") for name in names)


def test_the_server_side_never_imports_the_client_side() -> None:
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted(GATEWAY.rglob("*.py"))
        if not any(path.is_relative_to(side) for side in CLIENT_SIDE) and path != GATEWAY / "cli.py"
        for name in imported(path)
        if within(name, "gateway.client") or within(name, "gateway.commands")
    ]
    assert offenders == []


def test_the_client_side_imports_nothing_of_the_server() -> None:
    modules = sorted(path for side in CLIENT_SIDE for path in side.rglob("*.py"))
    assert {module_name(path) for path in modules} >= {
        "gateway.client",
        "gateway.commands.run",
        "gateway.commands.mcp",
    }
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in modules
        for name in imported(path)
        if within(name, "gateway")
        and name != "gateway"
        and not any(within(name, allowed) for allowed in CLIENT_MAY_IMPORT)
    ]
    assert offenders == []


def test_importing_the_client_side_loads_no_server_module() -> None:
    """Transitively too: what the allowed modules import must not pull the server in."""
    probe = (
        "import sys, gateway.client, gateway.commands.run, gateway.commands.mcp\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    server = [
        name
        for name in loaded
        if within(name, "gateway")
        and not any(within(name, allowed) for allowed in CLIENT_MAY_IMPORT + LOADED_WITH_THEM)
        and name != "gateway"
    ]
    assert server == []
    assert not any(within(name, "tornado") or within(name, "docker") for name in loaded)
