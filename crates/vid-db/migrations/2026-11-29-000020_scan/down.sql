ALTER TABLE operations DROP COLUMN scan;
