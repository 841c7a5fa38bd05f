"""Layers import downward only (issue 9, docs/DESIGN.md "Layers"): a module of the gateway
imports modules of its own package or of a lower layer, never of a higher one. Following one
`POST /v1/runs` through the code so reads in one direction."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.fast

# The gateway's packages and loose modules, bottom first.
LAYERS: list[set[str]] = [
    {
        "__init__",
        "errors",
        "version",
        "jsoncodec",
        "terminal",
        "extras",
        "plugins",
        "budget",
        "offload",
        "config",
        "store_url",
    },
    {"models", "settings", "auth", "metrics", "configure", "instance"},
    {"sandbox"},
    {"execution"},
    {"uploads"},
    {"store"},
    {"runs"},
    {"tools"},
    {"openapi", "handlers"},
    {"app", "http_server"},
    {"server"},
    {"client"},  # client-side code (tests/test_client_isolation.py): above the server
    {"commands"},  # `gateway run` and `gateway mcp`, on the client
    {"cli", "__main__"},  # the command line: `serve`, and the client-side commands
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def imported(tree: ast.AST) -> list[str]:
    """The gateway modules a module imports (at its top or inside a function)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "gateway":
                found += [f"gateway.{alias.name}" for alias in node.names]
            elif node.module.startswith("gateway."):
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("gateway.")]
    return found


def test_every_module_has_a_layer() -> None:
    tops = {
        path.relative_to(REPO / "gateway").parts[0].removesuffix(".py")
        for path in (REPO / "gateway").rglob("*.py")
    }
    assert tops <= set(RANK), tops - set(RANK)


def test_imports_point_downward() -> None:
    upward = []
    for path in sorted((REPO / "gateway").rglob("*.py")):
        top = path.relative_to(REPO / "gateway").parts[0].removesuffix(".py")
        for name in imported(ast.parse(path.read_text())):
            other = name.split(".")[1]
            if other != top and RANK.get(other, len(LAYERS)) > RANK[top]:
                upward.append(f"{path.relative_to(REPO)} imports {name}")
    assert not upward, upward


def test_the_check_sees_an_upward_import() -> None:
    tree = ast.parse("def f():\n    from gateway.runs.service import RunService\n")
    assert imported(tree) == ["gateway.runs.service"]
    assert RANK["runs"] > RANK["execution"]


def test_design_md_names_the_same_layers_in_the_same_order() -> None:
    """DESIGN.md's "Layers" table is this list, rank by rank."""
    text = (REPO / "docs" / "DESIGN.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
    table = [set(re.findall(r"`([a-z_]+)`", names)) for _, names in rows]
    assert [int(rank) for rank, _ in rows] == list(range(len(LAYERS)))
    assert table == [names - {"__init__"} for names in LAYERS]  # the package's own module


def test_no_two_classes_of_the_gateway_share_a_name() -> None:
    """One name per concept (issue 30): the server and the client raised `GatewayError`s of
    two trees with the same names, and `Upload`, `Cell` and `Unavailable` each named two
    things. A public class's name says which one it is, anywhere in the gateway (a private
    one, `_Name`, is its module's own)."""
    homes: dict[str, list[str]] = {}
    for path in sorted((REPO / "gateway").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                homes.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1}
    assert len(homes) > 100 and shared == {}


# The modules that see the whole `Settings` (issue 30): the command's (`configure`), the
# gateway's life (`server`), and the settings themselves. Every other part gets a frozen
# config of the settings it reads (`gateway.config`), built by these and passed down.
COMPOSITION_ROOT = {"gateway/settings.py", "gateway/configure.py", "gateway/server.py"}


def settings_importers(root: Path) -> set[str]:
    """The modules under `root` (a `gateway/` folder) that import `gateway.settings`."""
    return {
        str(path.relative_to(root.parent))
        for path in sorted(root.rglob("*.py"))
        if any(
            name == "gateway.settings" or name.startswith("gateway.settings.")
            for name in imported(ast.parse(path.read_text(encoding="utf-8")))
        )
    }


def test_only_the_composition_root_imports_the_settings() -> None:
    assert settings_importers(REPO / "gateway") <= COMPOSITION_ROOT


def test_the_check_sees_a_part_that_imports_the_settings(tmp_path: Path) -> None:
    part = tmp_path / "gateway" / "runs"
    part.mkdir(parents=True)
    (part / "service.py").write_text("def f():\n    from gateway.settings import Settings\n")
    (part / "slots.py").write_text("from gateway import settings\n")
    (part / "bounds.py").write_text("from gateway.store_url import parse_store_url\n")
    assert settings_importers(tmp_path / "gateway") == {
        "gateway/runs/service.py",
        "gateway/runs/slots.py",
    }


def module_graph(root: Path) -> dict[str, set[str]]:
    """The gateway's modules under `root` (a `gateway/` folder), each with the modules it
    imports (at its top or inside a function; a package is its `__init__`)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for target in imported(ast.parse(path.read_text(encoding="utf-8"))):
            while target not in modules and "." in target:  # a name imported from a module
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A chain of modules that imports its own start again, or None."""
    done: set[str] = set()

    def visit(name: str, chain: list[str]) -> list[str] | None:
        if name in chain:
            return [*chain[chain.index(name) :], name]
        if name in done:
            return None
        for target in sorted(graph[name]):
            found = visit(target, [*chain, name])
            if found is not None:
                return found
        done.add(name)
        return None

    for name in sorted(graph):
        found = visit(name, [])
        if found is not None:
            return found
    return None


def test_no_module_imports_itself_through_others() -> None:
    """No circle of imports, deferred ones included (issue 30: the PostgreSQL store and its
    lease link and upload shelf imported each other inside functions; what they share is a
    module of its own now, `store/postgres_connection.py`)."""
    assert import_cycle(module_graph(REPO / "gateway")) is None


def test_the_check_sees_a_circle_held_by_a_deferred_import(tmp_path: Path) -> None:
    store = tmp_path / "gateway" / "store"
    store.mkdir(parents=True)
    (store / "__init__.py").write_text("")
    (store / "postgres.py").write_text(
        "def shelf():\n    from gateway.store.postgres_uploads import PostgresShelf\n"
    )
    (store / "postgres_uploads.py").write_text("from gateway.store.postgres import lock_user\n")
    assert import_cycle(module_graph(tmp_path / "gateway")) == [
        "gateway.store.postgres",
        "gateway.store.postgres_uploads",
        "gateway.store.postgres",
    ]
