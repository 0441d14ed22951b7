-- webhook-dispatcher: the claim reads only claimable deliveries.
--
-- Before, the claim's per-endpoint scan (webhook_deliveries_endpoint_due)
-- also held the endpoint's leased (in-flight) deliveries and the dead index
-- entries every lease left behind, and had to visit the heap for each to
-- read `locked_until`; under load most of the claim's time went there
-- (measured with pg_stat_statements during scripts/bench-dispatch.sh).
-- Now the index holds only pending deliveries that nobody leases: a lease
-- takes a row out of it, and the scan starts at the first claimable one.
-- Expired leases (a crashed replica) are put back by the dispatcher's
-- periodic `release_expired` (webhook_deliveries_leased), not by the claim.
DROP INDEX IF EXISTS webhook_deliveries_endpoint_due;
CREATE INDEX webhook_deliveries_claimable ON webhook_deliveries (endpoint_id, next_attempt_at, id)
    WHERE status = 'pending' AND locked_until IS NULL;

-- Same columns as the UNIQUE (delivery_id, attempt_number) constraint's own
-- index: a second copy only cost every attempt insert one more index write.
DROP INDEX IF EXISTS webhook_attempts_delivery;

