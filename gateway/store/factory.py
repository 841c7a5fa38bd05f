"""The store `--store` names: `sqlite:///PATH` (the default: `runs.sqlite3` under
`--data-dir`) or `postgresql://...` (a libpq URL; `postgres://` too). The settings already
checked the URL's shape (`gateway.store_url.parse_store_url`)."""

from __future__ import annotations

from gateway.settings import Settings
from gateway.store.base import RecordStore
from gateway.store.sqlite import SQLiteStore
from gateway.store_url import parse_store_url


def make_store(settings: Settings, replica: str) -> RecordStore:
    """The store of this gateway (not yet open), owning runs as `replica`."""
    if settings.store is None:
        return SQLiteStore(settings.data_dir / "runs.sqlite3", replica)
    _, where = parse_store_url(settings.store)
    if where is not None:  # sqlite:///PATH
        return SQLiteStore(where, replica)
    from gateway.store.postgres import PostgresStore  # psycopg only when asked for

    return PostgresStore(settings.store, replica, lease=settings.lease_seconds)
