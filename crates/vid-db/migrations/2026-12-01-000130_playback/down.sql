DROP TABLE playback_ids;
ALTER TABLE videos DROP COLUMN stream, DROP COLUMN mp4_support, DROP COLUMN playback_policy;
ALTER TABLE uploads DROP COLUMN mp4_support, DROP COLUMN playback_policy;
