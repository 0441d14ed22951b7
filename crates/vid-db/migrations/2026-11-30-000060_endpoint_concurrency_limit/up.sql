-- webhook-dispatcher: slow an endpoint down after 429/503 (AIMD).
--
-- NULL: the configured per_endpoint_concurrency applies. A 429 or 503 that
-- starts a throttle halves the endpoint's limit (multiplicative decrease, at
-- least 1); every recorded success raises it by one (additive increase) until
-- it reaches the configured value again, where it returns to NULL. So an
-- endpoint that rate-limited us is not hit by a full burst the moment its
-- `throttled_until` passes. Owned by the dispatcher, like the other health
-- columns (see 2026-11-29-000005_dispatcher).
ALTER TABLE webhook_endpoints ADD COLUMN concurrency_limit INTEGER
    CONSTRAINT webhook_endpoints_concurrency_limit_positive CHECK (concurrency_limit >= 1);
