"""The store `--store` names: `sqlite:///PATH` (the default: `runs.sqlite3` under
`--data-dir`) or `postgresql://...` (a libpq URL; `postgres://` too). The settings already
checked the URL's shape (`gateway.store_url.parse_store_url`)."""

from __future__ import annotations

from gateway.store.base import RecordStore
from gateway.store.config import StoreConfig
from gateway.store.sqlite import SQLiteStore
from gateway.store_url import parse_store_url


def make_store(config: StoreConfig, replica: str) -> RecordStore:
    """The store of this gateway (not yet open), owning runs as `replica`."""
    if config.store is None:
        return SQLiteStore(config.data_dir / "runs.sqlite3", replica)
    _, where = parse_store_url(config.store)
    if where is not None:  # sqlite:///PATH
        return SQLiteStore(where, replica)
    from gateway.store.postgres import PostgresStore  # psycopg only when asked for

    return PostgresStore(config.store, replica, lease=config.lease_seconds)
