-- Back to 2026-12-05-000220's five-argument claim: its lock statement left to
-- the plan cache, its claim planned on every call (force_custom_plan).

CREATE OR REPLACE FUNCTION webhook_deliveries_claim(per_endpoint bigint, max_leases bigint, lease_ms bigint,
                                         answered_ids text[], answered_tokens timestamptz[])
RETURNS TABLE (id text, endpoint_id text, tenant_id text, event_id text, payload text,
               attempt_count integer, manual_retry boolean, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '2s'
AS $$
#variable_conflict use_column
DECLARE
    held text[];
    plan_mode text;
BEGIN
    IF per_endpoint IS NULL OR per_endpoint < 1 OR max_leases IS NULL OR max_leases < 0
       OR lease_ms IS NULL OR lease_ms < 1 THEN
        RAISE EXCEPTION 'webhook_deliveries_claim(per_endpoint %, max_leases %, lease_ms %): want per_endpoint >= 1, max_leases >= 0, lease_ms >= 1',
            per_endpoint, max_leases, lease_ms USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF answered_ids IS NULL OR answered_tokens IS NULL
       OR cardinality(answered_ids) <> cardinality(answered_tokens) THEN
        RAISE EXCEPTION 'webhook_deliveries_claim: answered_ids and answered_tokens must be non-NULL and of one length (% and %)',
            cardinality(answered_ids), cardinality(answered_tokens) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_leases = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'webhook_deliveries_claim needs READ COMMITTED (each statement a snapshot taken after the endpoint locks); this transaction is %',
            upper(current_setting('transaction_isolation')) USING ERRCODE = 'invalid_transaction_state';
    END IF;
    -- 1. The locks of at most max_leases endpoints that have a due, unleased
    --    delivery, are not throttled and have a free slot (counted before the
    --    lock, so possibly stale; 2. counts again under it). The lock is tried
    --    only on the rows of the materialized, ordered CTE, up to the LIMIT.
    held := ARRAY(
        WITH RECURSIVE pending_endpoints(endpoint_id) AS (
            -- Every endpoint with a claimable delivery, by a skip scan of the
            -- partial index webhook_deliveries_claimable: one probe per endpoint.
            SELECT min(d.endpoint_id) FROM webhook_deliveries d WHERE d.status = 'pending' AND d.locked_until IS NULL
            UNION ALL
            SELECT (SELECT min(d.endpoint_id) FROM webhook_deliveries d
                    WHERE d.status = 'pending' AND d.locked_until IS NULL AND d.endpoint_id > p.endpoint_id)
            FROM pending_endpoints p WHERE p.endpoint_id IS NOT NULL
        ),
        -- The caller's leases whose requests are over, per endpoint, where
        -- each is still that very lease (primary-key probes, once).
        over AS MATERIALIZED (
            SELECT f.endpoint_id, count(DISTINCT f.id) AS n
            FROM unnest(answered_ids, answered_tokens) AS a(id, token)
            JOIN webhook_deliveries f ON f.id = a.id
            WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
            GROUP BY f.endpoint_id
        ),
        due_endpoints AS MATERIALIZED (
            SELECT p.endpoint_id
            FROM pending_endpoints p
            JOIN webhook_endpoints e ON e.id = p.endpoint_id
            LEFT JOIN over v ON v.endpoint_id = p.endpoint_id
            CROSS JOIN LATERAL (SELECT min(d.next_attempt_at) AS oldest FROM webhook_deliveries d
                                WHERE d.endpoint_id = p.endpoint_id AND d.status = 'pending' AND d.locked_until IS NULL) o
            WHERE (e.throttled_until IS NULL OR e.throttled_until <= now()) AND o.oldest <= now()
              AND LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) > (
                    SELECT count(*) FROM webhook_deliveries f
                    WHERE f.endpoint_id = p.endpoint_id AND f.status = 'pending'
                      AND f.locked_until IS NOT NULL AND f.locked_until >= now())
                  - COALESCE(v.n, 0)
            ORDER BY o.oldest, p.endpoint_id
        )
        SELECT u.endpoint_id FROM due_endpoints u
        WHERE pg_try_advisory_xact_lock(1986554724, hashtext(u.endpoint_id))
        LIMIT max_leases);
    IF cardinality(held) = 0 THEN
        RETURN;
    END IF;
    plan_mode := current_setting('plan_cache_mode');
    PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    -- 2. The claim proper, among the held endpoints only, in a new snapshot
    --    (the leases that are over read again in it).
    RETURN QUERY
    WITH over AS MATERIALIZED (
        SELECT f.endpoint_id, count(DISTINCT f.id) AS n
        FROM unnest(answered_ids, answered_tokens) AS a(id, token)
        JOIN webhook_deliveries f ON f.id = a.id
        WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
          AND f.endpoint_id = ANY(held)
        GROUP BY f.endpoint_id
    ),
    open_endpoints AS (
        SELECT e.id AS endpoint_id,
               LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) - (
                   SELECT count(*) FROM webhook_deliveries f
                   WHERE f.endpoint_id = e.id AND f.status = 'pending'
                     AND f.locked_until IS NOT NULL AND f.locked_until >= now())
               + COALESCE(v.n, 0) AS free
        FROM webhook_endpoints e
        LEFT JOIN over v ON v.endpoint_id = e.id
        WHERE e.id = ANY(held)
          AND (e.throttled_until IS NULL OR e.throttled_until <= now())
    ),
    chosen AS (
        SELECT c.id, c.next_attempt_at
        FROM open_endpoints o
        CROSS JOIN LATERAL (
            SELECT d.id, d.next_attempt_at
            FROM webhook_deliveries d
            WHERE d.endpoint_id = o.endpoint_id AND d.status = 'pending' AND d.locked_until IS NULL
              AND d.next_attempt_at <= now()
            ORDER BY d.next_attempt_at, d.id
            LIMIT GREATEST(o.free, 0)
        ) c
        ORDER BY c.next_attempt_at, c.id
        LIMIT max_leases
    )
    -- The chosen rows by primary key, the recheck a CASE (see 000210).
    UPDATE webhook_deliveries d
    SET locked_until = now() + lease_ms * interval '1 millisecond', updated_at = now()
    WHERE d.id = ANY(ARRAY(SELECT c.id FROM chosen c))
      AND d.status = 'pending'
      AND CASE WHEN d.locked_until IS NULL THEN true ELSE false END
    RETURNING d.id, d.endpoint_id, d.tenant_id, d.event_id, d.payload, d.attempt_count, d.manual_retry, d.locked_until;
    -- RETURN QUERY has run the statement; the caller's setting is back.
    PERFORM set_config('plan_cache_mode', plan_mode, true);
END
$$;
