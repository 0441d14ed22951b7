-- webhook-dispatcher (issue 22, 2026-12-06 eighth session): the fan-in
-- insert may lease beyond the per-endpoint bound ("lease ahead") when every
-- live lease of the endpoint is the caller's, so a burst's backlog is
-- inserted leased and waits in the dispatcher for its endpoint's slots
-- instead of being inserted unleased and leased later by a claim.
--
-- Why: in a burst that outruns the receivers the fan-in leased ~2 % of the
-- deliveries it inserted (the bound was full); the rest each cost the
-- claim's UPDATE (a new row version and four index entries), a quarter to a
-- third of PostgreSQL's write cost a delivery (scripts/bench-delivery-writes.sh,
-- `floor`; BENCHMARKS.md, seventh and eighth sessions).
--
-- webhook_deliveries_insert_leasing gains three arguments:
--   max_ahead bigint: 0 is 000270's insert exactly; above 0, leasing ahead,
--     with at most max_ahead leased in all (max_leases still bounds the
--     leases for endpoints leased within the bound, and the endpoints
--     locked, at least one);
--   own_endpoint_ids text[], own_counts bigint[]: the caller's live leases
--     per endpoint, as the caller knows them (an endpoint not listed: 0).
-- With max_ahead above 0, an endpoint of the new deliveries that is unthrottled,
-- at its full concurrency (concurrency_limit NULL or >= per_endpoint: not
-- slowed down by a 429/503), with nothing older due, and whose live leases
-- (pending, locked_until >= now()) number no more than the caller's count
-- of its own, has all its new pending deliveries leased (up to max_ahead
-- in all), whatever the bound; any other endpoint gets 000270's rule.
-- The count is read under the endpoint's advisory lock (as every leasing
-- statement's), so no other replica can lease that endpoint in between.
--
-- Why the bound on open requests stays exact across replicas: another
-- replica's claim or fan-in counts these leases and leases for the
-- endpoint only while all its leases number fewer than the bound, so once
-- a caller holds more than the bound nobody else leases there until the
-- caller's own are fewer than the bound again; and the caller leases ahead
-- only when nobody else holds a lease there. A caller that leased ahead
-- must itself open at most the bound's requests to the endpoint (the
-- dispatcher gates the leases its fan-in takes, per endpoint:
-- services/webhook-dispatcher, scheduler; it counts as its own only those,
-- so while a lease it claimed, which passes no gate, is live, it leases
-- within the bound only). Its count may be low (a lease it holds but does not list is
-- counted as another holder's: then it only leases within the bound), never
-- high: the dispatcher counts a lease only from the leasing statement's
-- return until just before the statement that ends it (record, settle,
-- release, postpone) is sent, holding a lock that keeps those statements
-- from running between its count and its commit, and only while more than
-- five seconds are left of the lease by a deadline of its own clock taken
-- before the leasing statement was sent (never later than locked_until,
-- whatever the two clocks say).
--
-- Rolling back: roll the dispatchers back first (the previous release calls
-- the thirteen-argument function, which down.sql keeps); a dispatcher of
-- this release against the rolled-back database fails every fan-in (the
-- sixteen-argument function is gone) and leaves the messages queued.
--
-- The thirteen-argument function becomes a SQL function calling this one
-- with max_ahead 0 (one body to maintain), as the eleven-argument one
-- already calls it. Rolling update: dispatchers of the previous release call
-- the thirteen-argument signature and get what they got before; they count
-- ahead leases as leases, so they lease nothing for such an endpoint.

CREATE FUNCTION webhook_deliveries_insert_leasing(
    ids text[], tenant_ids text[], endpoint_ids text[], event_ids text[], event_types text[], payloads text[],
    statuses text[], due timestamptz[], per_endpoint bigint, max_leases bigint, lease_ms bigint,
    answered_ids text[], answered_tokens timestamptz[],
    max_ahead bigint, own_endpoint_ids text[], own_counts bigint[])
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
       OR lease_ms IS NULL OR lease_ms < 0 OR ((max_leases > 0 OR max_ahead > 0) AND lease_ms < 1) THEN
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
    IF max_ahead IS NULL OR max_ahead < 0 OR own_endpoint_ids IS NULL OR own_counts IS NULL
       OR cardinality(own_endpoint_ids) <> cardinality(own_counts)
       OR EXISTS (SELECT 1 FROM unnest(own_counts) AS c(n) WHERE c.n IS NULL OR c.n < 0 OR c.n > 2147483647) THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing(max_ahead %): want max_ahead >= 0, own_endpoint_ids and own_counts non-NULL arrays of one length (% and %), each count 0 to 2147483647',
            max_ahead, cardinality(own_endpoint_ids), cardinality(own_counts) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF answered_ids IS NULL OR answered_tokens IS NULL
       OR cardinality(answered_ids) <> cardinality(answered_tokens) THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing: answered_ids and answered_tokens must be non-NULL and of one length (% and %)',
            cardinality(answered_ids), cardinality(answered_tokens) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (max_leases > 0 OR max_ahead > 0) AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing needs READ COMMITTED when it leases (each statement a snapshot taken after the endpoint locks); this transaction is %',
            upper(current_setting('transaction_isolation')) USING ERRCODE = 'invalid_transaction_state';
    END IF;
    IF max_leases > 0 OR max_ahead > 0 THEN
        -- 1. The locks of at most max_leases (at least one when leasing ahead) of the new pending deliveries'
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
            own AS MATERIALIZED (
                -- The caller's live leases per endpoint (unlisted: none).
                SELECT u.endpoint_id, max(u.n) AS n
                FROM unnest(own_endpoint_ids, own_counts) AS u(endpoint_id, n)
                GROUP BY u.endpoint_id
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
                LEFT JOIN own o ON o.endpoint_id = p.id
                WHERE (e.throttled_until IS NULL OR e.throttled_until <= now())
                  -- A scalar subquery, in the index's order: one probe per endpoint.
                  AND (SELECT 1 FROM webhook_deliveries b
                       WHERE b.endpoint_id = p.id AND b.status = 'pending' AND b.locked_until IS NULL
                         AND b.next_attempt_at <= now()
                       ORDER BY b.next_attempt_at LIMIT 1) IS NULL
                  AND ((max_ahead > 0 AND COALESCE(e.concurrency_limit, per_endpoint) >= per_endpoint
                        -- Ahead: every live lease of the endpoint is the caller's (at most
                        -- its own count; read in the same order and capped at one more).
                        AND (SELECT count(*) FROM (
                                SELECT 1 FROM webhook_deliveries f
                                WHERE f.endpoint_id = p.id AND f.status = 'pending'
                                  AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                                ORDER BY f.locked_until LIMIT COALESCE(o.n, 0) + 1) s) <= COALESCE(o.n, 0))
                  OR LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) > (
                        -- In the order of webhook_deliveries_leased (endpoint_id, locked_until),
                        -- which alone serves it without a sort, and capped: never a read of
                        -- all the endpoint's deliveries (a count at the cap leaves no slot).
                        SELECT count(*) FROM (
                            SELECT 1 FROM webhook_deliveries f
                            WHERE f.endpoint_id = p.id AND f.status = 'pending'
                              AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                            ORDER BY f.locked_until LIMIT LEAST(per_endpoint, 2147483647) + cardinality(answered_ids)) s)
                      - COALESCE(v.n, 0))
                ORDER BY p.ord
            )
            SELECT w.id FROM wanted w
            WHERE pg_try_advisory_xact_lock(1986554724, hashtext(w.id))
            LIMIT GREATEST(max_leases, LEAST(max_ahead, 1)));
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
    own AS MATERIALIZED (
        SELECT u.endpoint_id, max(u.n) AS n
        FROM unnest(own_endpoint_ids, own_counts) AS u(endpoint_id, n)
        WHERE u.endpoint_id = ANY(held)
        GROUP BY u.endpoint_id
    ),
    free AS (
        SELECT h.id AS endpoint_id, a.ahead,
               CASE WHEN a.ahead
                    -- No other holder: max_ahead bounds it.
                    THEN max_ahead
                    ELSE
               LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) - (
                   -- In the order of webhook_deliveries_leased (endpoint_id, locked_until),
                   -- which alone serves it without a sort, and capped: never a read of
                   -- all the endpoint's deliveries (a count at the cap leaves no slot).
                   SELECT count(*) FROM (
                       SELECT 1 FROM webhook_deliveries f
                       WHERE f.endpoint_id = h.id AND f.status = 'pending'
                         AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                       ORDER BY f.locked_until LIMIT LEAST(per_endpoint, 2147483647) + cardinality(answered_ids)) s)
               + COALESCE(v.n, 0) END AS free
        -- held's endpoints (each once: the lock statement's rows are distinct)
        -- by primary key, one probe each.
        FROM unnest(held) AS h(id)
        CROSS JOIN LATERAL (
            SELECT k.throttled_until, k.concurrency_limit FROM webhook_endpoints k
            WHERE k.id = h.id LIMIT 1) e
        LEFT JOIN over v ON v.endpoint_id = h.id
        LEFT JOIN own o ON o.endpoint_id = h.id
        -- Ahead: every live lease of the endpoint is the caller's (at most its
        -- own count; read in the order of webhook_deliveries_leased, capped
        -- at one more), and the endpoint is at its full concurrency.
        CROSS JOIN LATERAL (
            SELECT (max_ahead > 0 AND COALESCE(e.concurrency_limit, per_endpoint) >= per_endpoint
                    AND (SELECT count(*) FROM (
                            SELECT 1 FROM webhook_deliveries f
                            WHERE f.endpoint_id = h.id AND f.status = 'pending'
                              AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                            ORDER BY f.locked_until LIMIT COALESCE(o.n, 0) + 1) s) <= COALESCE(o.n, 0)) AS ahead) a
        WHERE (e.throttled_until IS NULL OR e.throttled_until <= now())
          AND (SELECT 1 FROM webhook_deliveries b
               WHERE b.endpoint_id = h.id AND b.status = 'pending' AND b.locked_until IS NULL
                 AND b.next_attempt_at <= now()
               ORDER BY b.next_attempt_at LIMIT 1) IS NULL
    ),
    ranked AS (
        SELECT i.*, (i.status = 'pending'
                     AND row_number() OVER (PARTITION BY i.endpoint_id ORDER BY i.ord) <= COALESCE(f.free, 0)) AS fits,
               COALESCE(f.ahead, false) AS ahead
        FROM input i LEFT JOIN free f ON f.endpoint_id = i.endpoint_id
    ),
    chosen AS (
        -- Leasing ahead: at most max_ahead in all, of them at most max_leases
        -- for endpoints leased within the bound; otherwise at most max_leases.
        SELECT r.*, (r.fits
                     AND count(*) FILTER (WHERE r.fits) OVER (ORDER BY r.ord)
                         <= CASE WHEN max_ahead > 0 THEN max_ahead ELSE max_leases END
                     AND (r.ahead OR count(*) FILTER (WHERE r.fits AND NOT r.ahead) OVER (ORDER BY r.ord) <= max_leases)) AS leased
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

CREATE OR REPLACE FUNCTION webhook_deliveries_insert_leasing(
    ids text[], tenant_ids text[], endpoint_ids text[], event_ids text[], event_types text[], payloads text[],
    statuses text[], due timestamptz[], per_endpoint bigint, max_leases bigint, lease_ms bigint,
    answered_ids text[], answered_tokens timestamptz[])
RETURNS TABLE (id text, endpoint_id text, tenant_id text, event_id text, payload text,
               attempt_count integer, manual_retry boolean, locked_until timestamptz)
LANGUAGE sql VOLATILE
AS $$
    SELECT c.id, c.endpoint_id, c.tenant_id, c.event_id, c.payload, c.attempt_count, c.manual_retry, c.locked_until
    FROM webhook_deliveries_insert_leasing(ids, tenant_ids, endpoint_ids, event_ids, event_types, payloads,
                                           statuses, due, per_endpoint, max_leases, lease_ms,
                                           answered_ids, answered_tokens, 0, '{}'::text[], '{}'::bigint[]) c
$$;
