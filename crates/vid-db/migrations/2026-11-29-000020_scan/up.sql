-- Malware scan (issue 10): what the transcoder's scanning phase reported for
-- the source, shown as `metadata.scan` of `GET /operations/{id}`:
-- 'clean', or 'skipped' when scanning is turned off (development only).
-- NULL: not scanned yet. An infected source fails the operation with
-- error.code `malware_detected` instead.
ALTER TABLE operations ADD COLUMN scan TEXT;
