"""`StoreConfig`: the settings the run store reads, and no other. Each field is the setting
of its name (`gateway.config.config_from`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    store: str | None  # sqlite:///PATH or postgresql://...; None: SQLite under data_dir
    data_dir: Path  # the SQLite store's default file, and (with SQLite) the uploads' folder
    lease_seconds: float  # PostgreSQL: how long a replica's runs are its own unrenewed
    upload_ttl: float  # how long an upload is kept
