DROP INDEX webhook_deliveries_leased;
ALTER TABLE webhook_deliveries DROP COLUMN manual_retry;
ALTER TABLE webhook_endpoints DROP COLUMN throttled_until;
ALTER TABLE webhook_endpoints DROP COLUMN last_success_at;
ALTER TABLE webhook_endpoints DROP COLUMN failing_since;
ALTER TABLE webhook_endpoints DROP COLUMN consecutive_failures;
