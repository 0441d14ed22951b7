ALTER TABLE operations DROP COLUMN revision;
