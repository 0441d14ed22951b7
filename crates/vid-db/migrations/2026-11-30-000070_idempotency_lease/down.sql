DROP INDEX IF EXISTS idempotency_keys_created_at;
ALTER TABLE idempotency_keys DROP COLUMN lock_token, DROP COLUMN locked_until;
