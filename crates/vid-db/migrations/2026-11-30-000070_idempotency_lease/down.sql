ALTER TABLE idempotency_keys DROP COLUMN lock_token, DROP COLUMN locked_until;
