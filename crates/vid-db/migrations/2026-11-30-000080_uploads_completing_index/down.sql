DROP INDEX IF EXISTS uploads_completing_expiry;
