-- Issue 24: transcode jobs are re-driven from PostgreSQL (the broker is a
-- transport, not the truth). Written by the api only (domain::operation):
-- - run_id: the transcoder run that owns the operation ("the latest Started
--   wins"); NULL until a Started is accepted. Reports of other runs are ignored.
-- - job_attempt: how many times the job was published (1 at `complete`,
--   n+1 after the n-th re-drive); carried by TranscodeJob.attempt.
-- - job_published_at: when the job was last published (queued in the outbox).
--   `now()` is stable, so existing rows take the migration's time without a
--   table rewrite (PostgreSQL 11+ fast default): a pending operation of before
--   this migration is re-driven `operations.redrive_after_seconds` after it.
ALTER TABLE operations
    ADD COLUMN run_id TEXT,
    ADD COLUMN job_attempt INTEGER NOT NULL DEFAULT 1,
    ADD COLUMN job_published_at TIMESTAMPTZ NOT NULL DEFAULT now();
