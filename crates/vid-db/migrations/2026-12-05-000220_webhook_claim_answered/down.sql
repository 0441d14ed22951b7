DROP FUNCTION IF EXISTS webhook_deliveries_claim(bigint, bigint, bigint, text[], timestamptz[]);
