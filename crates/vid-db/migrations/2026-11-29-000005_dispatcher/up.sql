-- webhook-dispatcher: endpoint health and delivery bookkeeping.
--
-- The dispatcher owns these columns of webhook_endpoints (the api owns the
-- configuration columns): it counts failures to decide when to disable an
-- endpoint, and records 429/503 slow-downs.

-- Deliveries that ended `failed` (retries exhausted) since the last success.
ALTER TABLE webhook_endpoints ADD COLUMN consecutive_failures INTEGER NOT NULL DEFAULT 0;
-- Start of the current run of failed attempts (NULL after a success).
ALTER TABLE webhook_endpoints ADD COLUMN failing_since TIMESTAMPTZ;
-- Last 2xx answer.
ALTER TABLE webhook_endpoints ADD COLUMN last_success_at TIMESTAMPTZ;
-- After a 429/503 no attempt to this endpoint starts before this time.
ALTER TABLE webhook_endpoints ADD COLUMN throttled_until TIMESTAMPTZ;

-- A resend requested through the api: the next attempt is the only one
-- (no retry schedule after it).
ALTER TABLE webhook_deliveries ADD COLUMN manual_retry BOOLEAN NOT NULL DEFAULT false;

-- Counting each endpoint's leased (in-flight) deliveries in the claim query.
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (endpoint_id, locked_until)
    WHERE status = 'pending' AND locked_until IS NOT NULL;
