-- Issue 21 item 4 / issue 24: every input of an ingest's job is durable with
-- it, so the api's janitor can publish the job again when the broker lost it
-- (PostgreSQL is the truth, RabbitMQ a transport). Written once by the api
-- (store::ingests::insert_upload, POST /ingests); NULL for direct uploads.
-- The other inputs were already stored: source_url, filename, content_type,
-- storage_key, mp4_support (uploads), video/operation/tenant ids.
-- - source_max_size_bytes: IngestJob.max_size_bytes (the request's, or the
--   default it got);
-- - source_declared_content_type: IngestJob.content_type (the media type the
--   request named; uploads.content_type holds a placeholder until the
--   download tells when none was named);
-- - source_allowed_content_types: IngestJob.allowed_content_types (the
--   uploads.allowed_content_types of the time).
-- An ingest from before this migration has NULLs; its re-drive uses the
-- current settings for them.
ALTER TABLE uploads
    ADD COLUMN source_max_size_bytes BIGINT CHECK (source_max_size_bytes > 0),
    ADD COLUMN source_declared_content_type TEXT,
    ADD COLUMN source_allowed_content_types TEXT[];
