-- Each run's language and summary beside its record, for GET /v1/runs: a page reads these,
-- never the records (each may be 64 MiB). Older rows get their language from their
-- records now; their summaries are made from the records when first listed.
ALTER TABLE runs ADD COLUMN language text, ADD COLUMN summary text;
UPDATE runs SET language = record::json->>'language';
CREATE INDEX runs_owner_listing ON runs (owner, created, id);
