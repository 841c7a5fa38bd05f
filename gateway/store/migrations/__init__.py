"""The PostgreSQL store's schema, as an ordered list of SQL files (`NNNN_name.sql`), each
applied once, in order, in one transaction with its row in `schema_version`."""
