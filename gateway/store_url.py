"""What `--store` may name: `sqlite:///PATH` or a PostgreSQL URL that libpq accepts,
checked when the settings load (`gateway.settings`) and read by those that open the store
(`gateway.store.factory`) or hide its files from kernels (`gateway.instance`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from gateway.extras import missing

StoreKind = Literal["sqlite", "postgresql"]


def parse_store_url(url: str) -> tuple[StoreKind, Path | None]:
    """Check a `--store` URL: ("sqlite", its file) or ("postgresql", None). A bad one raises
    ValueError saying what is wrong (never repeating a password)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("sqlite", "postgresql", "postgres"):
        raise ValueError("the store must be sqlite:///PATH or postgresql://USER@HOST/DB")
    if scheme == "sqlite":
        if not rest.startswith("/") or rest.endswith("/") or "?" in rest or "\0" in rest:
            raise ValueError("sqlite:///PATH needs the absolute path of a file (three slashes)")
        return "sqlite", Path(os.path.abspath(rest))
    absent = missing("postgres")
    if absent is not None:
        raise ValueError(f"a PostgreSQL store: {absent}")
    from psycopg import ProgrammingError, conninfo  # only for a PostgreSQL store

    try:
        conninfo.conninfo_to_dict(url)
    except ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
        raise ValueError(f"not a PostgreSQL URL libpq accepts ({reason})") from None
    return "postgresql", None
