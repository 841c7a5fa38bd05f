-- Uploaded archives, so that a run on any replica can use an upload made on another.
CREATE TABLE uploads (
    id text PRIMARY KEY,
    owner text NOT NULL,
    created timestamptz NOT NULL DEFAULT now(),
    entries integer NOT NULL,
    unpacked_bytes bigint NOT NULL,
    size bigint NOT NULL,
    archive bytea NOT NULL
);
CREATE INDEX uploads_owner_created ON uploads (owner, created);
