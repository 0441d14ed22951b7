-- Issue 20: signing keys for signed playback tokens.
--
-- Only the PUBLIC half of each key pair is kept (PEM, SubjectPublicKeyInfo,
-- RFC 5280 §4.1.2.7): the api generates the pair, answers the private half
-- once and forgets it. Written by the api only (POST/DELETE /signing-keys);
-- read by the playback service on every request of a signed playback ID,
-- joined to `playback_ids` by tenant, so a key of another tenant never
-- validates. Deleting a key deletes its row: the next request signed with it
-- fails (the playback service caches no key's existence).
CREATE TABLE signing_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    public_key  TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- GET /signing-keys: a tenant's keys, newest first (ids sort by creation time).
CREATE INDEX signing_keys_tenant ON signing_keys (tenant_id, id);
