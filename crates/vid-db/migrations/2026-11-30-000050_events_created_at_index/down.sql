DROP INDEX IF EXISTS events_tenant_created;
