-- api janitor: uploads stuck in `completing` past their expiry (a crashed or
-- failed complete) are expired every pass. Like uploads_expiry for `created`,
-- this partial index holds only the few rows in that state, so the pass is an
-- index range scan however many uploads the table keeps.
CREATE INDEX uploads_completing_expiry ON uploads (expires_at) WHERE status = 'completing';
