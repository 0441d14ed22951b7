DROP INDEX IF EXISTS idempotency_keys_created_at;
