ALTER TABLE operations DROP COLUMN download_total_bytes, DROP COLUMN download_bytes, DROP COLUMN awaiting_source;
DELETE FROM uploads WHERE size_bytes = 0;
ALTER TABLE uploads DROP CONSTRAINT uploads_size_bytes_check;
ALTER TABLE uploads ADD CONSTRAINT uploads_size_bytes_check CHECK (size_bytes > 0);
ALTER TABLE uploads DROP COLUMN source_url;
