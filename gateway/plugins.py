"""Plug-ins found by entry point: the sandbox backends, group `gateway.backends`.

A backend is a `gateway.sandbox.base.SandboxBackend` subclass that a distribution
declares as an entry point of that group (pyproject.toml: `[project.entry-points.
"gateway.backends"]`, `docker = "gateway.sandbox.docker:DockerBackend"`). Only the names
are read here, from the installed distributions' metadata, without importing anything:
`--backend` is checked against them and `gateway serve --help` lists them;
`gateway.sandbox.factory` loads the one the gateway starts with.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

BACKENDS = "gateway.backends"


def backend_entry_points() -> dict[str, EntryPoint]:
    """The backends installed, by name (of two with one name, the first on `sys.path`)."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=BACKENDS):
        found.setdefault(entry.name, entry)
    return found


def backend_names() -> list[str]:
    """The names of the backends installed, sorted."""
    return sorted(backend_entry_points())
