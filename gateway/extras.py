"""The optional parts of the gateway and the pip extras that install them (pyproject.toml):
a part whose packages are missing says which extra to install, instead of an ImportError."""

from __future__ import annotations

import importlib.util

# extra -> the modules it provides, and what needs them
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "docker": (("docker",), "the Docker backend"),
    "forkserver": (("docker", "pyseccomp"), "the forkserver backend"),
    "local": (
        ("ipykernel", "matplotlib_inline", "matplotlib", "numpy", "pandas"),
        "the local backend (it runs kernels from this Python environment)",
    ),
    "mcp": (("mcp",), "`gateway mcp`"),
    "postgres": (("psycopg", "psycopg_pool"), "the PostgreSQL store (`--store postgresql://`)"),
    # optional even where it is used: without it `gateway run` shows plain lines
    "client": (("tqdm",), "`gateway run`'s progress line on a terminal"),
}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None
        return False


def missing(extra: str) -> str | None:
    """None when the extra's packages are installed, else a sentence saying how to get them."""
    modules, needed_by = EXTRAS[extra]
    absent = [name for name in modules if not installed(name)]
    if not absent:
        return None
    return (
        f"{needed_by} needs {', '.join(absent)}, which this Python environment lacks: "
        f"install them with `pip install 'kernel-gateway[{extra}]'` (or scripts/setup.sh)"
    )


def providing(module: str) -> str | None:
    """The extra that installs `module` (or the package it is part of), if one does."""
    top = module.split(".")[0]
    for extra, (modules, _) in EXTRAS.items():
        if top in modules:
            return extra
    return None
