DROP TABLE upload_client_tokens;
ALTER TABLE uploads DROP COLUMN cors_origin;
