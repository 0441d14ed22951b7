-- webhook-dispatcher: wake-ups by notification instead of polling.
--
-- Any statement that leaves a delivery `pending`, unleased and due (now, or
-- within a second: writers may stamp `next_attempt_at` with their own clock)
-- sends ONE notification on `webhook_deliveries_due`, delivered at commit
-- (never for a rolled-back change). Every dispatcher LISTENs and claims at
-- once: another replica's fan-in, leases released at a shutdown, the api's
-- `:enable` and `:retry`. Claims (rows leased) and recorded outcomes (not
-- pending, or due later) do not notify. Statement-level with a transition
-- table, so a multi-row statement costs one check, not one per row.

CREATE FUNCTION webhook_deliveries_due_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM changed
        WHERE status = 'pending' AND locked_until IS NULL
          AND next_attempt_at <= clock_timestamp() + interval '1 second'
    ) THEN
        PERFORM pg_notify('webhook_deliveries_due', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER webhook_deliveries_due_on_insert
    AFTER INSERT ON webhook_deliveries
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_deliveries_due_notify();

CREATE TRIGGER webhook_deliveries_due_on_update
    AFTER UPDATE ON webhook_deliveries
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_deliveries_due_notify();

-- The claim's per-endpoint scan: an endpoint's due, pending deliveries in
-- due order, without sorting its whole backlog on every claim.
CREATE INDEX webhook_deliveries_endpoint_due ON webhook_deliveries (endpoint_id, next_attempt_at, id)
    WHERE status = 'pending';
