-- Watching operations (issue 12): a per-operation sequence number, bumped by
-- the api in the same transaction as every change of status, progress or phase
-- (and announced with pg_notify('operation_changed', id) in that transaction).
-- It is the `id:` of the operation's Server-Sent Events and the `revision` of
-- `POST /operations/{id}:wait` answers.
ALTER TABLE operations ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
