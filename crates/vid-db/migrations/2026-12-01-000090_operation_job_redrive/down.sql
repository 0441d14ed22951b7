ALTER TABLE operations DROP COLUMN job_published_at, DROP COLUMN job_attempt, DROP COLUMN run_id;
