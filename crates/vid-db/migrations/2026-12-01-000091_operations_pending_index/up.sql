-- api janitor (issue 24): each pass re-drives `pending` operations whose job
-- was last published before a cutoff, oldest first, and reads the oldest
-- pending operation's age for the gauge. Only pending operations are in this
-- partial index (the queue's backlog, not the table's history), so both are a
-- range scan of a small index however many operations the table keeps.
--
-- Built CONCURRENTLY, so the table keeps taking writes meanwhile; that cannot
-- run in a transaction (metadata.toml). A failed build leaves an INVALID
-- index behind: DROP INDEX it, then run the migrations again.
CREATE INDEX CONCURRENTLY operations_pending_published ON operations (job_published_at, created_at) WHERE status = 'pending';
