-- webhook-dispatcher (issue 22, 2026-12-06 sixth session): the five-argument
-- claim (2026-12-05-000220) planned once a session, with plans that stay
-- right whatever statistics the session first saw, as the fan-in's since
-- 2026-12-06-000270.
--
-- Why: the claim's second statement (the UPDATE that leases) forced a
-- custom plan, so it was planned on every call: about a third of a claim's
-- time (issue 22). It was forced because a generic plan once made claims
-- 15 times slower: made on a young table, it read the whole backlog (or
-- every live lease) through a join whose shape depended on the statistics.
-- 000210 already finds the leased rows by primary key; what was left
-- depending on the statistics were the joins of the answered leases
-- (unnest(answered_ids, answered_tokens)) and of the endpoints. Measured on
-- a scratch database (1,004 endpoints, 20,000 live leases on other
-- endpoints, 256 answered leases): 000220's claim read 20,000 rows of
-- webhook_deliveries and 1,004 of webhook_endpoints a call, by sequential
-- scans with statistics, or the whole webhook_deliveries_leased index
-- without (BENCHMARKS.md, 2026-12-06 sixth session).
--
-- Here, as in 2026-12-06-000270 (whose header gives the reasons):
--   * each answered lease is read by primary key alone and each endpoint by
--     primary key, in LATERAL subqueries with LIMIT 1; an endpoint's open
--     leases are counted in the order of webhook_deliveries_leased, capped
--     at the bound plus the answered leases;
--   * the function runs with plan_cache_mode = force_generic_plan (each
--     statement planned once a session) and enable_seqscan = off, except
--     that while the statistics of webhook_deliveries describe fewer than
--     1,000 rows each call is planned anew;
--   * the endpoints with a claimable delivery (the skip scan of
--     webhook_deliveries_claimable) are read by a statement of their own
--     first: with none, the claim ends there, before the answered leases
--     are read. In the bench's paced phase nearly every claim finds nothing.
-- Measured on a scratch database in the four states of 000270's header:
-- a claim of 64 with 256 answered took 3.8-4.6 ms against 10.7-14.2 ms for
-- 000220, and 21.1 against 37.8 ms in the last state. In
-- scripts/bench-dispatch.sh (3 alternating pairs, the other migrations of
-- this session in place): 5,772/6,164/6,415 deliveries/s against
-- 4,914/5,959/5,953, PostgreSQL 0.128-0.133 against 0.135-0.177 ms a
-- delivery in the burst.
-- `a_claim_after_unseen_growth_reads_by_key` (the dispatcher's delivery
-- tests) plans in two of those states, grows the tables and counts the
-- index pages the same session's next claim reads.
--
-- Same signature, locks (same class, tried without waiting, at most
-- max_leases), bound, order (oldest first), lock timeout, result and errors
-- as 000220 (the three-argument claim of 000230 calls this one).
-- `#variable_conflict use_column` as before.
--
-- Rolling update: replaces a function body only.

CREATE OR REPLACE FUNCTION webhook_deliveries_claim(per_endpoint bigint, max_leases bigint, lease_ms bigint,
                                                    answered_ids text[], answered_tokens timestamptz[])
RETURNS TABLE (id text, endpoint_id text, tenant_id text, event_id text, payload text,
               attempt_count integer, manual_retry boolean, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '2s'
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    mode text;
    due text[];
    held text[];
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
    -- 1. The endpoints with a claimable delivery, by a skip scan of the
    --    partial index webhook_deliveries_claimable: one probe per endpoint.
    --    None: nothing to claim, nothing more is read. Planned on every call:
    --    webhook_deliveries_endpoint gives the same endpoint order, and
    --    statistics taken during a backlog (every row claimable) rate the two
    --    alike; a generic plan made then walked the whole of
    --    webhook_deliveries_endpoint and its rows as settled deliveries
    --    accumulated (found by review: 391,130 index entries and heap pages
    --    for a claim that found nothing at 386,000 rows). A plan made with
    --    the indexes' current sizes takes the claimable index.
    mode := current_setting('plan_cache_mode');
    PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    due := ARRAY(
        WITH RECURSIVE pending_endpoints(endpoint_id) AS (
            SELECT min(d.endpoint_id) FROM webhook_deliveries d WHERE d.status = 'pending' AND d.locked_until IS NULL
            UNION ALL
            SELECT (SELECT min(d.endpoint_id) FROM webhook_deliveries d
                    WHERE d.status = 'pending' AND d.locked_until IS NULL AND d.endpoint_id > p.endpoint_id)
            FROM pending_endpoints p WHERE p.endpoint_id IS NOT NULL
        )
        SELECT p.endpoint_id FROM pending_endpoints p WHERE p.endpoint_id IS NOT NULL);
    PERFORM set_config('plan_cache_mode', mode, true);
    IF cardinality(due) = 0 THEN
        RETURN;
    END IF;
    -- 2. The locks of at most max_leases of those endpoints that have a due
    --    delivery, are not throttled and have a free slot (counted before the
    --    lock, so possibly stale; 3. counts again under it). The lock is tried
    --    only on the rows of the materialized, ordered CTE, up to the LIMIT.
    held := ARRAY(
        -- The caller's leases whose requests are over, per endpoint, where
        -- each is still that very lease: one probe by key per answered lease.
        WITH over AS MATERIALIZED (
            SELECT f.endpoint_id, count(DISTINCT a.id) AS n
            FROM unnest(answered_ids, answered_tokens) AS a(id, token)
            CROSS JOIN LATERAL (
                SELECT l.endpoint_id, l.locked_until, l.status FROM webhook_deliveries l
                WHERE l.id = a.id LIMIT 1) f
            WHERE f.locked_until = a.token AND f.status = 'pending' AND f.locked_until >= now()
            GROUP BY f.endpoint_id
        ),
        due_endpoints AS MATERIALIZED (
            SELECT p.endpoint_id
            FROM unnest(due) AS p(endpoint_id)
            -- The endpoint by primary key, one probe each.
            CROSS JOIN LATERAL (
                SELECT k.throttled_until, k.concurrency_limit FROM webhook_endpoints k
                WHERE k.id = p.endpoint_id LIMIT 1) e
            LEFT JOIN over v ON v.endpoint_id = p.endpoint_id
            CROSS JOIN LATERAL (SELECT min(d.next_attempt_at) AS oldest FROM webhook_deliveries d
                                WHERE d.endpoint_id = p.endpoint_id AND d.status = 'pending' AND d.locked_until IS NULL) o
            WHERE (e.throttled_until IS NULL OR e.throttled_until <= now()) AND o.oldest <= now()
              AND LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) > (
                    -- In the order of webhook_deliveries_leased (endpoint_id, locked_until),
                    -- which alone serves it without a sort, and capped: never a read of
                    -- all the endpoint's deliveries (a count at the cap leaves no slot).
                    SELECT count(*) FROM (
                        SELECT 1 FROM webhook_deliveries f
                        WHERE f.endpoint_id = p.endpoint_id AND f.status = 'pending'
                          AND f.locked_until IS NOT NULL AND f.locked_until >= now()
                        ORDER BY f.locked_until LIMIT LEAST(per_endpoint, 2147483647) + cardinality(answered_ids)) s)
                  - COALESCE(v.n, 0)
            ORDER BY o.oldest, p.endpoint_id
        )
        SELECT u.endpoint_id FROM due_endpoints u
        WHERE pg_try_advisory_xact_lock(1986554724, hashtext(u.endpoint_id))
        LIMIT max_leases);
    IF cardinality(held) = 0 THEN
        RETURN;
    END IF;
    -- 3. The claim proper, among the held endpoints only, in a new snapshot
    --    (the leases that are over read again in it).
    RETURN QUERY
    WITH over AS MATERIALIZED (
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
    open_endpoints AS (
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
END
$$;
