-- Issue 21: browser uploads without the API key.
--
-- uploads.cors_origin: the page origin (`scheme://host[:port]`) given to
-- POST /uploads; the api's CORS answers on the client-token routes allow only
-- it. NULL: no cross-origin caller. Written by the api only (POST /uploads).
ALTER TABLE uploads ADD COLUMN cors_origin TEXT;

-- One row per client token (`vidu_…`) handed out for an upload: only the
-- token's SHA-256 (hex) is stored, as for API keys. POST /uploads writes one;
-- an idempotent replay of that POST writes another (the plaintext token is
-- never stored, so a replay cannot repeat it). Written by the api only;
-- rows go with their upload.
CREATE TABLE upload_client_tokens (
    token_hash  TEXT PRIMARY KEY,
    upload_id   TEXT NOT NULL REFERENCES uploads (id) ON DELETE CASCADE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX upload_client_tokens_upload_id ON upload_client_tokens (upload_id);
