-- api janitor: uploads stuck in `completing` past their expiry (a crashed or
-- failed complete) are expired every pass. Like uploads_expiry for `created`,
-- this partial index holds only the few rows in that state, so the pass is an
-- index range scan however many uploads the table keeps.
--
-- Built CONCURRENTLY, so the table keeps taking writes meanwhile; that cannot
-- run in a transaction (metadata.toml). A failed build leaves an INVALID
-- index behind: DROP INDEX it, then run the migrations again.
CREATE INDEX CONCURRENTLY uploads_completing_expiry ON uploads (expires_at) WHERE status = 'completing';
