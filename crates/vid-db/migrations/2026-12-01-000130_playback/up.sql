-- Issue 19: adaptive streaming and playback IDs.
--
-- uploads / videos: what the customer asked for on POST /uploads, carried
-- from the upload to its video at `complete` (written by the api only).
-- Constant defaults: PostgreSQL 11+ adds these without a table rewrite.
ALTER TABLE uploads
    ADD COLUMN playback_policy TEXT[] NOT NULL DEFAULT '{public}',
    ADD COLUMN mp4_support     TEXT   NOT NULL DEFAULT 'standard';
ALTER TABLE videos
    ADD COLUMN playback_policy TEXT[] NOT NULL DEFAULT '{public}',
    ADD COLUMN mp4_support     TEXT   NOT NULL DEFAULT 'standard',
    -- vid_core::messages::StreamOutputs of the Succeeded report (prefix,
    -- manifest keys); NULL until ready, and for videos made before streaming.
    ADD COLUMN stream          JSONB;

-- The ids a ready video is played through (`/play/pb_….m3u8`). Written by the
-- api only (the report consumer when the video becomes ready, and the
-- playback-ids routes); read by the playback service, which looks rows up by
-- id on every request and never writes. A removed id is deleted: its URLs
-- answer 404 from the next request on.
CREATE TABLE playback_ids (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    video_id    TEXT NOT NULL REFERENCES videos (id) ON DELETE CASCADE,
    policy      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX playback_ids_video ON playback_ids (video_id, created_at);
