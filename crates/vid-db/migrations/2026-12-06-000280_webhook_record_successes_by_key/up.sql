-- webhook-dispatcher (issue 22, 2026-12-06 sixth session): successes
-- recorded by a function whose reads of webhook_deliveries are probes by
-- primary key, whatever the statistics.
--
-- Why: the dispatcher recorded a batch of successes with one cached
-- statement (vid_deliveries::outcome::record_successes), prepared once a
-- connection. Its UPDATE joined the batch (unnest of the arrays) to
-- webhook_deliveries; on a table that grew after the plan was made (a young
-- table: statistics from when it was nearly empty, and a generic plan kept
-- until the next ANALYZE), that join was a hash join over a sequential
-- scan of the whole table, for every batch. In scripts/bench-dispatch.sh
-- (auto_explain, one run at the defaults) 150 batches read 586,476 rows,
-- 73 a delivery, and in the paced phase, with batches of a few
-- deliveries, each batch read the whole table. Measured upper bound, with
-- enable_seqscan off for the bench's whole database (3 alternating pairs):
-- PostgreSQL CPU a delivery in the paced phase 0.215-0.242 ms against
-- 0.270-0.287 ms (BENCHMARKS.md, 2026-12-06 sixth session).
--
-- Here the same statement is static PL/pgSQL, planned once a session
-- (plan_cache_mode = force_generic_plan: the per-call planning is gone
-- too), with enable_seqscan = off for the call and the UPDATE's rows named
-- by `d.id = ANY(delivery_ids)`, an index condition on the primary key.
-- While the statistics of webhook_deliveries describe fewer than 1,000 rows
-- each call is planned anew, as in 2026-12-06-000270 (whose header gives
-- why). Same effects, locks, order and result as the statement (whose doc
-- in outcome.rs holds the rules): the attempts inserted (ON CONFLICT DO
-- NOTHING), the deliveries still leased with their token marked succeeded,
-- their endpoints' health reset in id order; returns how many deliveries
-- were updated. The arrays must be of one length (invalid_parameter_value,
-- 22023, before anything is written); per_endpoint NULL or below 1
-- likewise. `recording_after_unseen_growth_reads_by_key` (the dispatcher's
-- delivery tests) checks what it reads. Measured alone in
-- scripts/bench-dispatch.sh (3 alternating pairs): PostgreSQL 0.193-0.230
-- against 0.217-0.237 ms a delivery in the paced phase; deliveries/s moved
-- both ways (6,822/6,707/5,728 against 6,681/6,346/6,298).
--
-- Rolling update: a new function; dispatchers of the previous release keep
-- their own statement. A dispatcher of this release looks the function up
-- (vid_deliveries::outcome::record_function_present, to_regprocedure) until
-- it has seen it once, and until then runs the statement from before this
-- migration, so a pod started before the migration Job has run records its
-- successes as before instead of failing until its leases expire (which
-- would send those deliveries again).

CREATE FUNCTION webhook_deliveries_record_successes(
    attempt_ids text[], delivery_ids text[], endpoint_ids text[], tokens timestamptz[], attempt_numbers integer[],
    started_ats timestamptz[], durations_ms integer[], response_statuses integer[], response_bodies text[],
    per_endpoint integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    n integer := cardinality(delivery_ids);
    recorded bigint;
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
    IF per_endpoint IS NULL OR per_endpoint < 1 THEN
        RAISE EXCEPTION 'webhook_deliveries_record_successes(per_endpoint %): want per_endpoint >= 1', per_endpoint
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n IS NULL OR cardinality(attempt_ids) IS DISTINCT FROM n OR cardinality(endpoint_ids) IS DISTINCT FROM n
       OR cardinality(tokens) IS DISTINCT FROM n OR cardinality(attempt_numbers) IS DISTINCT FROM n
       OR cardinality(started_ats) IS DISTINCT FROM n OR cardinality(durations_ms) IS DISTINCT FROM n
       OR cardinality(response_statuses) IS DISTINCT FROM n OR cardinality(response_bodies) IS DISTINCT FROM n THEN
        RAISE EXCEPTION 'webhook_deliveries_record_successes: the nine arrays must be non-NULL and of one length (delivery_ids has %)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH input AS (
        SELECT * FROM unnest(attempt_ids, delivery_ids, endpoint_ids, tokens, attempt_numbers, started_ats, durations_ms,
                             response_statuses, response_bodies)
            AS t(attempt_id, delivery_id, endpoint_id, token, attempt_number, started_at, duration_ms, response_status, response_body)
    ),
    attempts AS (
        INSERT INTO webhook_attempts (id, delivery_id, endpoint_id, attempt_number, started_at, duration_ms, response_status, response_body)
        SELECT i.attempt_id, i.delivery_id, i.endpoint_id, i.attempt_number, i.started_at, i.duration_ms, i.response_status, i.response_body
        FROM input i
        ON CONFLICT (delivery_id, attempt_number) DO NOTHING
    ),
    updated AS (
        UPDATE webhook_deliveries d
        SET status = 'succeeded', attempt_count = i.attempt_number, next_attempt_at = NULL, last_attempt_at = i.started_at,
            locked_until = NULL, manual_retry = false, updated_at = now()
        FROM input i
        -- The batch's rows by primary key (an index condition), then matched.
        WHERE d.id = ANY(delivery_ids) AND d.id = i.delivery_id AND d.locked_until = i.token
        RETURNING d.endpoint_id
    ),
    stale AS (
        -- Endpoints whose health this batch changes: failures to reset, a
        -- lowered concurrency_limit to raise, or a last_success_at more than
        -- HEALTH_REFRESH old. Locked in id order, so two batches of successes
        -- never lock the same endpoints in opposite orders (no deadlock between
        -- them); NO KEY UPDATE, as an UPDATE's own lock, so a fan-in's foreign
        -- key check (KEY SHARE) on the endpoint never waits for it.
        SELECT e.id FROM webhook_endpoints e
        WHERE e.id IN (SELECT u.endpoint_id FROM updated u)
          AND (e.consecutive_failures <> 0 OR e.failing_since IS NOT NULL OR e.concurrency_limit IS NOT NULL
               OR e.last_success_at IS NULL OR e.last_success_at < now() - interval '1 second')
        ORDER BY e.id
        FOR NO KEY UPDATE
    ),
    health AS (
        UPDATE webhook_endpoints e
        SET last_success_at = now(), consecutive_failures = 0, failing_since = NULL,
            concurrency_limit = CASE WHEN e.concurrency_limit IS NULL OR e.concurrency_limit + 1 >= per_endpoint THEN NULL
                                     ELSE e.concurrency_limit + 1 END
        FROM stale WHERE e.id = stale.id
    )
    SELECT count(*) INTO recorded FROM updated;
    RETURN recorded;
END
$$;
