DROP INDEX IF EXISTS webhook_deliveries_endpoint_due;
DROP TRIGGER IF EXISTS webhook_deliveries_due_on_update ON webhook_deliveries;
DROP TRIGGER IF EXISTS webhook_deliveries_due_on_insert ON webhook_deliveries;
DROP FUNCTION IF EXISTS webhook_deliveries_due_notify();
