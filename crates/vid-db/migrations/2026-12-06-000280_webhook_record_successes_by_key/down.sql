-- Back to 2026-12-06-000270: dispatchers of the previous release record
-- successes with their own statement and never call this function.
DROP FUNCTION IF EXISTS webhook_deliveries_record_successes(
    text[], text[], text[], timestamptz[], integer[], timestamptz[], integer[], integer[], text[], integer);
