ALTER TABLE videos DROP COLUMN poster_time;
ALTER TABLE uploads DROP COLUMN poster_time;
