-- Issue 20: the poster's time, as POST /uploads asked (`poster_time`,
-- seconds, finite, >= 0), carried from the upload to its video at `complete`
-- and into the transcode job (written by the api only). NULL: the
-- transcoder's representative-frame rule. The storyboard and thumbnail
-- frames need no column: they are listed in `videos.stream`
-- (`StreamOutputs.images`, JSON).
ALTER TABLE uploads ADD COLUMN poster_time DOUBLE PRECISION;
ALTER TABLE videos ADD COLUMN poster_time DOUBLE PRECISION;
