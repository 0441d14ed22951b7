-- webhook-dispatcher (issue 22, "fewer round trips per delivery"): the two
-- leasing transactions as functions, so each is ONE round trip in autocommit
-- instead of BEGIN, a lock statement, the leasing statement and COMMIT.
--
-- Both need two statements: the first takes per-endpoint advisory locks
-- (class 1986554724 = vid_deliveries::lease::ENDPOINT_LOCK_CLASS, key
-- hashtext(endpoint_id), transaction-scoped, never waiting), the second
-- counts the endpoint's leases and leases, and must run in a snapshot taken
-- AFTER the locks are held, so it sees every lease the previous holder
-- committed. In a VOLATILE PL/pgSQL function under READ COMMITTED each
-- statement takes a fresh snapshot, which is exactly that. The locks last to
-- the end of the calling transaction (the call itself, in autocommit).
--
-- Each statement is planned as it was when the client sent it: the claim's
-- lock statement may use PL/pgSQL's cached plan (as the prepared statement
-- did); the claim proper is planned for each call's values
-- (plan_cache_mode = force_custom_plan, set for the rest of the transaction
-- just before it, as before: its generic plan is several times slower, its
-- LIMITs and counts unknown to it); the fan-in's two statements run through
-- EXECUTE, so they are planned for each call as the unprepared statements
-- were (a cached generic plan chosen while the table was tiny is not
-- trusted; and force_custom_plan there would also re-plan the insert's
-- foreign-key checks on every row). lock_timeout = 2s ends a claim whose
-- UPDATE waits on a row lock (the scheduler claims again); the insert has
-- none, so it still waits for a concurrent insert of the same delivery
-- (ON CONFLICT). A call is one statement: no transaction is ever left idle
-- between them holding endpoint locks (the two-statement form needed
-- idle_in_transaction_session_timeout against a client stalled in between).
--
-- Inside a caller's transaction (rather than autocommit) the locks last
-- until that transaction ends, and an error in a call aborts it. That
-- transaction must be READ COMMITTED: under REPEATABLE READ or SERIALIZABLE
-- every statement shares the transaction's first snapshot, which may predate
-- the locks, so the count could miss another holder's committed leases and
-- exceed the bound. A leasing call there raises invalid_transaction_state
-- (25000) before it reads anything (a call with max_leases = 0 leases
-- nothing, takes no lock and runs under any isolation). vid_db's pool sets
-- READ COMMITTED on every connection, whatever the database's default. The
-- transaction should also be short: now() is its start, so a lease taken in
-- a transaction open longer than lease_ms is already expired when written,
-- and the next claim does not count it.
--
-- Bad arguments (NULL, a bound below 1, a negative max_leases or lease,
-- arrays of unequal length) raise invalid_parameter_value (22023) before
-- anything is read or written.
--
-- The inner statements show in pg_stat_statements only with
-- pg_stat_statements.track = all (the default, top, shows the calls).
--
-- The Rust side (vid_deliveries::lease::claim, vid_deliveries::fanin) calls
-- these and documents them; a test there checks the status literals.

-- Leases up to max_leases due deliveries, at most per_endpoint in flight per
-- endpoint (or its lowered concurrency_limit) counting every replica's
-- leases, oldest due first, for lease_ms milliseconds. Endpoints locked by
-- another claim or fan-in at this moment are skipped (they are being served);
-- so are full and throttled ones, which take no place of the max_leases.
-- A row that stopped being claimable while the UPDATE waited for its lock
-- (leased elsewhere, paused, settled) is not leased.
CREATE FUNCTION webhook_deliveries_claim(per_endpoint bigint, max_leases bigint, lease_ms bigint)
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
        due_endpoints AS MATERIALIZED (
            SELECT p.endpoint_id
            FROM pending_endpoints p
            JOIN webhook_endpoints e ON e.id = p.endpoint_id
            CROSS JOIN LATERAL (SELECT min(d.next_attempt_at) AS oldest FROM webhook_deliveries d
                                WHERE d.endpoint_id = p.endpoint_id AND d.status = 'pending' AND d.locked_until IS NULL) o
            WHERE (e.throttled_until IS NULL OR e.throttled_until <= now()) AND o.oldest <= now()
              AND LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) > (
                    SELECT count(*) FROM webhook_deliveries f
                    WHERE f.endpoint_id = p.endpoint_id AND f.status = 'pending'
                      AND f.locked_until IS NOT NULL AND f.locked_until >= now())
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
    -- 2. The claim proper, among the held endpoints only, in a new snapshot.
    RETURN QUERY
    WITH open_endpoints AS (
        SELECT e.id AS endpoint_id,
               LEAST(per_endpoint, COALESCE(e.concurrency_limit, per_endpoint)) - (
                   SELECT count(*) FROM webhook_deliveries f
                   WHERE f.endpoint_id = e.id AND f.status = 'pending'
                     AND f.locked_until IS NOT NULL AND f.locked_until >= now()) AS free
        FROM webhook_endpoints e
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
    UPDATE webhook_deliveries d
    SET locked_until = now() + lease_ms * interval '1 millisecond', updated_at = now()
    FROM chosen
    WHERE d.id = chosen.id AND d.status = 'pending' AND d.locked_until IS NULL
    RETURNING d.id, d.endpoint_id, d.tenant_id, d.event_id, d.payload, d.attempt_count, d.manual_retry, d.locked_until;
    -- RETURN QUERY has run the statement; the caller's setting is back.
    PERFORM set_config('plan_cache_mode', plan_mode, true);
END
$$;

-- Inserts new deliveries (the arrays, in insert order; ids made by the
-- caller) and leases those that fit at once: at most max_leases in all, in
-- insert order, each of an endpoint that is not throttled, has no unleased
-- delivery already due (the claim serves the oldest first) and has a free
-- slot under per_endpoint (counted as the claim counts). Only endpoints whose
-- lock it gets without waiting are leased for. A delivery it does not lease
-- is inserted as given (its status and due time unchanged); a 'pending' one
-- it leases is leased whatever due time it was given (the fan-in gives
-- pending deliveries "now"; a caller wanting a later first attempt passes
-- max_leases = 0). max_leases = 0: a plain insert, no lock, no endpoint
-- read. ON CONFLICT (event_id, endpoint_id) DO NOTHING:
-- fanning an event in twice inserts nothing the second time. Returns the
-- inserted rows; leased when locked_until is set.
CREATE FUNCTION webhook_deliveries_insert_leasing(
    ids text[], tenant_ids text[], endpoint_ids text[], event_ids text[], event_types text[], payloads text[],
    statuses text[], due timestamptz[], per_endpoint bigint, max_leases bigint, lease_ms bigint)
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
    IF max_leases > 0 AND current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'webhook_deliveries_insert_leasing needs READ COMMITTED when it leases (each statement a snapshot taken after the endpoint locks); this transaction is %',
            upper(current_setting('transaction_isolation')) USING ERRCODE = 'invalid_transaction_state';
    END IF;
    IF max_leases > 0 THEN
        -- 1. The locks of at most max_leases of the new pending deliveries'
        --    endpoints that could be leased for (slot counted before the lock;
        --    2. counts again under it), in insert order.
        EXECUTE $lock$ SELECT ARRAY(
            WITH wanted AS MATERIALIZED (
                SELECT u.id, min(u.ord) AS ord
                FROM unnest($1, $2) WITH ORDINALITY AS u(id, status, ord)
                JOIN webhook_endpoints e ON e.id = u.id
                WHERE u.status = 'pending'
                  AND (e.throttled_until IS NULL OR e.throttled_until <= now())
                  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries b
                                  WHERE b.endpoint_id = u.id AND b.status = 'pending' AND b.locked_until IS NULL
                                    AND b.next_attempt_at <= now())
                  AND LEAST($3, COALESCE(e.concurrency_limit, $3)) > (
                        SELECT count(*) FROM webhook_deliveries f
                        WHERE f.endpoint_id = u.id AND f.status = 'pending'
                          AND f.locked_until IS NOT NULL AND f.locked_until >= now())
                GROUP BY u.id
                ORDER BY min(u.ord)
            )
            SELECT w.id FROM wanted w
            WHERE pg_try_advisory_xact_lock(1986554724, hashtext(w.id))
            LIMIT $4) $lock$
            INTO held USING endpoint_ids, statuses, per_endpoint, max_leases;
    END IF;
    -- 2. The insert, leasing under the held locks only, in a new snapshot.
    RETURN QUERY EXECUTE $insert$
    WITH input AS (
        SELECT * FROM unnest($1, $2, $3, $4, $5, $6, $7, $8)
            WITH ORDINALITY AS t(id, tenant_id, endpoint_id, event_id, event_type, payload, status, next_attempt_at, ord)
    ),
    free AS (
        SELECT e.id AS endpoint_id,
               LEAST($9, COALESCE(e.concurrency_limit, $9)) - (
                   SELECT count(*) FROM webhook_deliveries f
                   WHERE f.endpoint_id = e.id AND f.status = 'pending'
                     AND f.locked_until IS NOT NULL AND f.locked_until >= now()) AS free
        FROM webhook_endpoints e
        WHERE e.id = ANY($12)
          AND (e.throttled_until IS NULL OR e.throttled_until <= now())
          AND NOT EXISTS (SELECT 1 FROM webhook_deliveries b
                          WHERE b.endpoint_id = e.id AND b.status = 'pending' AND b.locked_until IS NULL
                            AND b.next_attempt_at <= now())
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
          per_endpoint, max_leases, lease_ms, held;
END
$$;
