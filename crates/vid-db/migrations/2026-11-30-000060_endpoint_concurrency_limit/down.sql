ALTER TABLE webhook_endpoints DROP COLUMN concurrency_limit;
