-- What each user spent, a row a minute (GET /v1/usage, the CPU-second budgets), and the
-- runs they started in the last minute (the runs-per-minute budget): gateway/runs/quotas.py.
CREATE TABLE usage (
    owner text NOT NULL,
    minute bigint NOT NULL,
    cpu_ms bigint NOT NULL DEFAULT 0,
    runs bigint NOT NULL DEFAULT 0,
    peak_memory_bytes bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, minute)
);
CREATE INDEX usage_minute ON usage (minute);
CREATE TABLE starts (owner text NOT NULL, at double precision NOT NULL);
CREATE INDEX starts_owner_at ON starts (owner, at);
