ALTER TABLE operations DROP COLUMN owner_attempt;
