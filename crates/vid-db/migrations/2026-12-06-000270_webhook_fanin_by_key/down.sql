-- Back to 2026-12-06-000260: the thirteen-argument fan-in insert's two
-- statements under EXECUTE again (parsed and planned on every call).

CREATE OR REPLACE FUNCTION webhook_deliveries_insert_leasing(
    ids text[], tenant_ids text[], endpoint_ids text[], event_ids text[], event_types text[], payloads text[],
    statuses text[], due timestamptz[], per_endpoint bigint, max_leases bigint, lease_ms bigint,
    answered_ids text[], answered_tokens timestamptz[])
RETURNS TABLE (id text, endpoint_id text, tenant_id text, event_id text, payload text,
               attempt_count integer, manual_retry boolean, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    held text[] := '{}';
    n integer := cardinality(ids);
BEGIN
    IF per_endpoint IS NULL OR per_endpoint < 1 OR max_leases IS NULL OR max_leases < 0
       OR lease_ms IS NULL OR lease_ms < 0 OR (max_leases > 0 AND lease_ms < 1) THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing(per_endpoint %, max_leases %, lease_ms %): want per_endpoint >= 1, max_leases >= 0, lease_ms >= 1 when leasing',
            per_endpoint, max_leases, lease_ms USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n IS NULL OR cardinality(tenant_ids) IS DISTINCT FROM n OR cardinality(endpoint_ids) IS DISTINCT FROM n
       OR cardinality(event_ids) IS DISTINCT FROM n OR cardinality(event_types) IS DISTINCT FROM n
       OR cardinality(payloads) IS DISTINCT FROM n OR cardinality(statuses) IS DISTINCT FROM n
       OR cardinality(due) IS DISTINCT FROM n THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing: the eight arrays must be non-NULL and of one length (ids has %)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF answered_ids IS NULL OR answered_tokens IS NULL
       OR cardinality(answered_ids) <> cardinality(answered_tokens) THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing: answered_ids and answered_tokens must be non-NULL and of one length (% and %)',
            cardinality(answered_ids), cardinality(answered_tokens) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_leases > 0 AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing needs READ COMMITTED when it leases (each statement a snapshot taken after the endpoint locks); this transaction is %',
            upper(current_setting('transaction_isolation')) USING ERRCODE = 'invalid_transaction_state';
    END IF;
    IF max_leases > 0 THEN
        -- 1. The locks of at most max_leases of the new pending deliveries'
        --    endpoints that could be leased for (slot counted before the lock;
        --    2. counts again under it), in insert order.
        EXECUTE $lock$ SELECT ARRAY(
            WITH over AS MATERIALIZED (
                -- The caller's leases whose requests are over, per endpoint,
                -- where each is still that very lease (as the claim's).
                SELECT f.endpoint_id, count(DISTINCT f.id) AS n
                FROM unnest($5, $6) AS a(id, token)
                JOIN webhook_deliveries f ON f.id = a.id
                WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
                GROUP BY f.endpoint_id
            ),
            pending AS MATERIALIZED (
                -- Each endpoint once, at its first new pending delivery.
                SELECT u.id, min(u.ord) AS ord
                FROM unnest($1, $2) WITH ORDINALITY AS u(id, status, ord)
                WHERE u.status = 'pending'
                GROUP BY u.id
            ),
            wanted AS MATERIALIZED (
                SELECT p.id, p.ord
                FROM pending p
                JOIN webhook_endpoints e ON e.id = p.id
                LEFT JOIN over v ON v.endpoint_id = p.id
                WHERE (e.throttled_until IS NULL OR e.throttled_until <= now())
                  -- A scalar subquery, in the index's order: one probe per endpoint.
                  AND (SELECT 1 FROM webhook_deliveries b
                       WHERE b.endpoint_id = p.id AND b.status = 'pending' AND b.locked_until IS NULL
                         AND b.next_attempt_at <= now()
                       ORDER BY b.next_attempt_at LIMIT 1) IS NULL
                  AND LEAST($3, COALESCE(e.concurrency_limit, $3)) > (
                        SELECT count(*) FROM webhook_deliveries f
                        WHERE f.endpoint_id = p.id AND f.status = 'pending'
                          AND f.locked_until IS NOT NULL AND f.locked_until >= now())
                      - COALESCE(v.n, 0)
                ORDER BY p.ord
            )
            SELECT w.id FROM wanted w
            WHERE pg_try_advisory_xact_lock(1986554724, hashtext(w.id))
            LIMIT $4) $lock$
            INTO held USING endpoint_ids, statuses, per_endpoint, max_leases, answered_ids, answered_tokens;
    END IF;
    -- 2. The insert, leasing under the held locks only, in a new snapshot.
    RETURN QUERY EXECUTE $insert$
    WITH input AS (
        SELECT * FROM unnest($1, $2, $3, $4, $5, $6, $7, $8)
            WITH ORDINALITY AS t(id, tenant_id, endpoint_id, event_id, event_type, payload, status, next_attempt_at, ord)
    ),
    over AS MATERIALIZED (
        SELECT f.endpoint_id, count(DISTINCT f.id) AS n
        FROM unnest($13, $14) AS a(id, token)
        JOIN webhook_deliveries f ON f.id = a.id
        WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
          AND f.endpoint_id = ANY($12)
        GROUP BY f.endpoint_id
    ),
    free AS (
        SELECT e.id AS endpoint_id,
               LEAST($9, COALESCE(e.concurrency_limit, $9)) - (
                   SELECT count(*) FROM webhook_deliveries f
                   WHERE f.endpoint_id = e.id AND f.status = 'pending'
                     AND f.locked_until IS NOT NULL AND f.locked_until >= now())
               + COALESCE(v.n, 0) AS free
        FROM webhook_endpoints e
        LEFT JOIN over v ON v.endpoint_id = e.id
        WHERE e.id = ANY($12)
          AND (e.throttled_until IS NULL OR e.throttled_until <= now())
          AND (SELECT 1 FROM webhook_deliveries b
               WHERE b.endpoint_id = e.id AND b.status = 'pending' AND b.locked_until IS NULL
                 AND b.next_attempt_at <= now()
               ORDER BY b.next_attempt_at LIMIT 1) IS NULL
    ),
    ranked AS (
        SELECT i.*, (i.status = 'pending'
                     AND row_number() OVER (PARTITION BY i.endpoint_id ORDER BY i.ord) <= COALESCE(f.free, 0)) AS fits
        FROM input i LEFT JOIN free f ON f.endpoint_id = i.endpoint_id
    ),
    chosen AS (
        SELECT r.*, (r.fits AND count(*) FILTER (WHERE r.fits) OVER (ORDER BY r.ord) <= $10) AS leased
        FROM ranked r
    )
    INSERT INTO webhook_deliveries AS d (id, tenant_id, endpoint_id, event_id, event_type, payload, status, next_attempt_at, locked_until)
    SELECT c.id, c.tenant_id, c.endpoint_id, c.event_id, c.event_type, c.payload, c.status, c.next_attempt_at,
           CASE WHEN c.leased THEN now() + $11 * interval '1 millisecond' END
    FROM chosen c ORDER BY c.ord
    ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING d.id, d.endpoint_id, d.tenant_id, d.event_id, d.payload, d.attempt_count, d.manual_retry, d.locked_until
    $insert$
    USING ids, tenant_ids, endpoint_ids, event_ids, event_types, payloads, statuses, due,
          per_endpoint, max_leases, lease_ms, held, answered_ids, answered_tokens;
END
$$;
