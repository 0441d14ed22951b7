DROP FUNCTION IF EXISTS webhook_deliveries_insert_leasing(text[], text[], text[], text[], text[], text[], text[], timestamptz[], bigint, bigint, bigint);
DROP FUNCTION IF EXISTS webhook_deliveries_claim(bigint, bigint, bigint);
