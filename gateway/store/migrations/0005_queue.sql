-- Background runs waiting for a slot on any replica (gateway/runs/claims.py): the request as
-- it was admitted (the run's record is in `runs`, `queued`, unleased), who queued it, and
-- since when (the oldest is taken first). A row is deleted when a replica claims the run or
-- it is cancelled while queued.
CREATE TABLE queued_runs (
    id text PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    owner text NOT NULL,
    origin text NOT NULL,
    queued timestamptz NOT NULL DEFAULT clock_timestamp(),
    request text NOT NULL,
    -- the version of the request's form (gateway/runs/carried.py): a replica claims only
    -- the forms it reads, so a rolling update never hands a run to one that cannot
    version integer NOT NULL DEFAULT 1,
    size bigint NOT NULL
);
CREATE INDEX queued_runs_order ON queued_runs (queued, id);
CREATE INDEX queued_runs_origin ON queued_runs (origin);
