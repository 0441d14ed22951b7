-- Issue 24 (review): the attempt (TranscodeJob.attempt) of the run that owns
-- the operation (operations.run_id). A Started of another attempt is refused
-- while the owner's heartbeat is fresh (a re-driven copy must not restart a
-- healthy run). NULL: no owner, or an owner from before this migration
-- (treated as the same attempt). Nullable, no default: no table rewrite.
-- Written by the api only (domain::operation).
ALTER TABLE operations ADD COLUMN owner_attempt INTEGER;
