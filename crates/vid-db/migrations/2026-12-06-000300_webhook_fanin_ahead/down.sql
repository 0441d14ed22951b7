-- Back to 2026-12-06-000270: the sixteen-argument fan-in insert dropped,
-- the thirteen-argument one's body (static PL/pgSQL, planned once a session)
-- restored as it was. Roll the dispatchers back first: one of the release
-- that added 000300 fails every fan-in without the sixteen-argument
-- function.

DROP FUNCTION webhook_deliveries_insert_leasing(text[], text[], text[], text[], text[], text[], text[], timestamptz[],
    bigint, bigint, bigint, text[], timestamptz[], bigint, text[], bigint[]);

CREATE OR REPLACE FUNCTION webhook_deliveries_insert_leasing(
    ids text[], tenant_ids text[], endpoint_ids text[], event_ids text[], event_types text[], payloads text[],
    statuses text[], due timestamptz[], per_endpoint bigint, max_leases bigint, lease_ms bigint,
    answered_ids text[], answered_tokens timestamptz[])
RETURNS TABLE (id text, endpoint_id text, tenant_id text, event_id text, payload text,
               attempt_count integer, manual_retry boolean, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    held text[] := '{}';
    n integer := cardinality(ids);
BEGIN
    -- Plans are made once a session (force_generic_plan, above), except while
    -- the statistics of webhook_deliveries describe a table of fewer than 1,000
    -- rows (analysed or vacuumed nearly empty): there every index scan is
    -- estimated at one page, a probe by key ties with a scan of a whole
    -- index, and a plan made then would be kept as the table grows until its
    -- next analysis. Until then each call is planned with the table's
    -- current size (force_custom_plan, for this call only: the function's
    -- own SET restores the setting). Never analysed (reltuples -1), the
    -- planner assumes at least ten pages and probes by key.
    IF (SELECT c.reltuples FROM pg_class c WHERE c.oid = 'webhook_deliveries'::regclass) BETWEEN 0 AND 999 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
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
        held := ARRAY(
            WITH over AS MATERIALIZED (
                -- The caller's leases whose requests are over, per endpoint,
                -- where each is still that very lease (as the claim's): one
                -- primary-key probe per answered lease.
                SELECT f.endpoint_id, count(DISTINCT a.id) AS n
                FROM unnest(answered_ids, answered_tokens) AS a(id, token)
                -- By primary key alone: one probe per answered lease.
                CROSS JOIN LATERAL (
                    SELECT l.endpoint_id, l.locked_until, l.status FROM webhook_deliveries l
                    WHERE l.id = a.id LIMIT 1) f
                WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
                GROUP BY f.endpoint_id
            ),
            pending AS MATERIALIZED (
                -- Each endpoint once, at its first new pending delivery.
                SELECT u.id, min(u.ord) AS ord
                FROM unnest(endpoint_ids, statuses) WITH ORDINALITY AS u(id, status, ord)
                WHERE u.status = 'pending'
                GROUP BY u.id
            ),
            wanted AS MATERIALIZED (
                SELECT p.id, p.ord
                FROM pending p
                -- The endpoint by primary key, one probe each (LIMIT 1: never
                -- a merge or hash join reading every endpoint).
                CROSS JOIN LATERAL (
                    SELECT k.throttled_until, k.concurrency_limit FROM webhook_endpoints k
                    WHERE k.id = p.id LIMIT 1) e
                LEFT JOIN over v ON v.endpoint_id = p.id
                WHERE (e.throttled_until IS NULL OR e.throttled_until <= now())
                  -- A scalar subquery, in the index's order: one probe per endpoint.
                  AND (SELECT 1 FROM webhook_deliveries b
                       WHERE b.endpoint_id = p.id AND b.status = 'pending' AND b.locked_until IS NULL
                         AND b.next_attempt_at <= now()
                       ORDER BY b.next_attempt_at LIMIT 1) IS NULL
                  AND LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) > (
                        -- In the order of webhook_deliveries_leased (endpoint_id, locked_until),
                        -- which alone serves it without a sort, and capped: never a read of
                        -- all the endpoint's deliveries (a count at the cap leaves no slot).
                        SELECT count(*) FROM (
                            SELECT 1 FROM webhook_deliveries f
                            WHERE f.endpoint_id = p.id AND f.status = 'pending'
                              AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                            ORDER BY f.locked_until LIMIT LEAST(per_endpoint, 2147483647) + cardinality(answered_ids)) s)
                      - COALESCE(v.n, 0)
                ORDER BY p.ord
            )
            SELECT w.id FROM wanted w
            WHERE pg_try_advisory_xact_lock(1986554724, hashtext(w.id))
            LIMIT max_leases);
    END IF;
    -- 2. The insert, leasing under the held locks only, in a new snapshot.
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(ids, tenant_ids, endpoint_ids, event_ids, event_types, payloads, statuses, due)
            WITH ORDINALITY AS t(id, tenant_id, endpoint_id, event_id, event_type, payload, status, next_attempt_at, ord)
    ),
    over AS MATERIALIZED (
        SELECT f.endpoint_id, count(DISTINCT a.id) AS n
        FROM unnest(answered_ids, answered_tokens) AS a(id, token)
        -- By primary key alone: one probe per answered lease.
        CROSS JOIN LATERAL (
            SELECT l.endpoint_id, l.locked_until, l.status FROM webhook_deliveries l
            WHERE l.id = a.id LIMIT 1) f
        WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
          AND f.endpoint_id = ANY(held)
        GROUP BY f.endpoint_id
    ),
    free AS (
        SELECT h.id AS endpoint_id,
               LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) - (
                   -- In the order of webhook_deliveries_leased (endpoint_id, locked_until),
                   -- which alone serves it without a sort, and capped: never a read of
                   -- all the endpoint's deliveries (a count at the cap leaves no slot).
                   SELECT count(*) FROM (
                       SELECT 1 FROM webhook_deliveries f
                       WHERE f.endpoint_id = h.id AND f.status = 'pending'
                         AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                       ORDER BY f.locked_until LIMIT LEAST(per_endpoint, 2147483647) + cardinality(answered_ids)) s)
               + COALESCE(v.n, 0) AS free
        -- held's endpoints (each once: the lock statement's rows are distinct)
        -- by primary key, one probe each.
        FROM unnest(held) AS h(id)
        CROSS JOIN LATERAL (
            SELECT k.throttled_until, k.concurrency_limit FROM webhook_endpoints k
            WHERE k.id = h.id LIMIT 1) e
        LEFT JOIN over v ON v.endpoint_id = h.id
        WHERE (e.throttled_until IS NULL OR e.throttled_until <= now())
          AND (SELECT 1 FROM webhook_deliveries b
               WHERE b.endpoint_id = h.id AND b.status = 'pending' AND b.locked_until IS NULL
                 AND b.next_attempt_at <= now()
               ORDER BY b.next_attempt_at LIMIT 1) IS NULL
    ),
    ranked AS (
        SELECT i.*, (i.status = 'pending'
                     AND row_number() OVER (PARTITION BY i.endpoint_id ORDER BY i.ord) <= COALESCE(f.free, 0)) AS fits
        FROM input i LEFT JOIN free f ON f.endpoint_id = i.endpoint_id
    ),
    chosen AS (
        SELECT r.*, (r.fits AND count(*) FILTER (WHERE r.fits) OVER (ORDER BY r.ord) <= max_leases) AS leased
        FROM ranked r
    )
    INSERT INTO webhook_deliveries AS d (id, tenant_id, endpoint_id, event_id, event_type, payload, status, next_attempt_at, locked_until)
    SELECT c.id, c.tenant_id, c.endpoint_id, c.event_id, c.event_type, c.payload, c.status, c.next_attempt_at,
           CASE WHEN c.leased THEN now() + lease_ms * interval '1 millisecond' END
    FROM chosen c ORDER BY c.ord
    ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING d.id, d.endpoint_id, d.tenant_id, d.event_id, d.payload, d.attempt_count, d.manual_retry, d.locked_until;
END
$$;
