-- api: Idempotency-Key leases and the purge of expired keys
-- (services/api/src/idempotency.rs).
--
-- A key row is written, with response_status NULL, before its request runs.
-- The run keeps `locked_until` (now + 60 s) renewed every 20 s while it is
-- alive and stores its answer (or deletes the row) when it ends. A row still
-- NULL after `locked_until` belongs to a run that died with its process
-- (crash, kill, deploy); a retry with the same key and body may then take the
-- key over, under a new `lock_token`. The token fences the runs: only the
-- run holding the current token may renew, store or release the row. Both
-- are NULL once the answer is stored. Rows of earlier versions that are still
-- in progress get a lease that ended 60 s after they began, so their keys are
-- free again.
ALTER TABLE idempotency_keys
    ADD COLUMN locked_until TIMESTAMPTZ,
    ADD COLUMN lock_token TEXT;
UPDATE idempotency_keys SET locked_until = created_at + interval '60 seconds'
    WHERE response_status IS NULL;

-- The index for the janitor's purge is 2026-11-30-000075 (built CONCURRENTLY).

-- Only 2xx answers are stored from now on (see the module docs): stored 4xx
-- answers of earlier versions would keep replaying a state that may have
-- changed (`upload_incomplete`, `too_many_requests`); drop them, so their
-- keys run again.
DELETE FROM idempotency_keys WHERE response_status >= 300;
