"""Where everything that outlives a request is kept: run records, and (for replicas) who
owns which run, cancel requests and uploads. One interface (`base.RecordStore`), two
implementations: `sqlite.SQLiteStore` (the default, one gateway, nothing to install) and
`postgres.PostgresStore` (any number of gateway replicas on one database). `factory.py`
builds the one `--store` names."""
