-- Run records, who runs each (replica) and until when (lease_until, the database's clock),
-- and a cancel asked of that replica by another one (cancel_note).
CREATE TABLE runs (
    id text PRIMARY KEY,
    owner text NOT NULL,
    status text NOT NULL,
    created timestamptz NOT NULL DEFAULT now(),
    record text NOT NULL,
    size bigint NOT NULL,
    replica text NOT NULL,
    lease_until timestamptz,
    cancel_note text
);
CREATE INDEX runs_owner_created ON runs (owner, created);
CREATE INDEX runs_created ON runs (created);
CREATE INDEX runs_unfinished ON runs (replica, lease_until) WHERE status IN ('queued', 'running');
