"""This gateway on this machine: its instance id, and its own files that no kernel may see.

The instance id names everything the gateway makes (containers, folders, cgroups, the
store's leases), so that a gateway started again with the same data dir finds what a
crashed one left; it is the `instance_id` setting, else kept in the data dir.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from gateway.store_url import parse_store_url


def instance_id(configured: str | None, data_dir: Path) -> str:
    """The gateway's instance id: `configured`, else stable across restarts, kept in the
    data dir (blocking: a small file)."""
    if configured:
        return configured
    path = data_dir / "instance-id"
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        value = secrets.token_hex(8)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value, encoding="ascii")
        return value


def private_paths(
    data_dir: Path,
    workspaces: Path | None,
    secrets: tuple[Path | None, ...],
    store: str | None,
) -> tuple[Path, ...]:
    """The gateway's own files, which a sandbox must hide: the data dir, the workspaces root
    (each run sees only its own folder), the files of tokens (`secrets`: the token file,
    the metrics token's), and a SQLite store kept outside the data dir with its journal
    files."""
    paths = [p for p in (data_dir, workspaces, *secrets) if p is not None]
    if store is not None:
        kind, path = parse_store_url(store)
        if kind == "sqlite" and path is not None and not path.is_relative_to(data_dir):
            paths += [path.with_name(path.name + s) for s in ("", "-wal", "-shm", "-journal")]
    return tuple(paths)
