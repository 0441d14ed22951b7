DROP INDEX IF EXISTS operations_pending_published;
