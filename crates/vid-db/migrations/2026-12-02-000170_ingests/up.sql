-- Ingest from a URL (issue 21, item 4; POST /ingests).
--
-- uploads.source_url: set for an ingest (the URL the ingest worker downloads
-- from); NULL for a direct upload. An ingest's size is unknown until the
-- download ends: size_bytes is 0 until then.
ALTER TABLE uploads ADD COLUMN source_url TEXT;
ALTER TABLE uploads DROP CONSTRAINT uploads_size_bytes_check;
ALTER TABLE uploads ADD CONSTRAINT uploads_size_bytes_check CHECK (size_bytes > 0 OR source_url IS NOT NULL);

-- operations.awaiting_source: true from POST /ingests until the download
-- report (or the end of the operation). While true there is no transcode job
-- to re-drive, so the janitor's re-drive queries leave the operation alone.
-- download_bytes / download_total_bytes: metadata.download.
ALTER TABLE operations
    ADD COLUMN awaiting_source BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN download_bytes BIGINT CHECK (download_bytes >= 0),
    ADD COLUMN download_total_bytes BIGINT CHECK (download_total_bytes >= 0);
