-- webhook-dispatcher (issue 22): one claim body.
--
-- 2026-12-05-000220 added the five-argument webhook_deliveries_claim (the
-- caller's answered leases left out of each endpoint's count) as a copy of
-- 000210's three-argument claim with that count added, and kept the
-- three-argument one for replicas of the previous release during a rolling
-- update. Two bodies of the same claim had to be kept in step. Here the
-- three-argument claim becomes the five-argument one with nothing answered,
-- which is exactly its old behaviour (with empty arrays the `over` counts
-- are empty and every lease counts, as in 000210): its checks, its lock
-- timeout (the five-argument function's SET lock_timeout = '2s' applies to
-- the call) and its errors are the five-argument function's.
--
-- A SQL function (not inlined: it is itself VOLATILE), so a caller of the
-- old signature pays one extra function call.

CREATE OR REPLACE FUNCTION webhook_deliveries_claim(per_endpoint bigint, max_leases bigint, lease_ms bigint)
RETURNS TABLE (id text, endpoint_id text, tenant_id text, event_id text, payload text,
               attempt_count integer, manual_retry boolean, locked_until timestamptz)
LANGUAGE sql VOLATILE
AS $$
    SELECT c.id, c.endpoint_id, c.tenant_id, c.event_id, c.payload, c.attempt_count, c.manual_retry, c.locked_until
    FROM webhook_deliveries_claim(per_endpoint, max_leases, lease_ms, '{}'::text[], '{}'::timestamptz[]) c
$$;
