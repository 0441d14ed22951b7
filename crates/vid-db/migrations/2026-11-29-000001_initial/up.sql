-- Initial schema. One database, each table written by one service
-- (see ARCHITECTURE.md, "Who owns what"). Ids are prefixed ULIDs stored as text.

-- api: tenants and their API keys (only the SHA-256 of a key is stored).
CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    max_uploads_in_flight INTEGER,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants(id),
    key_hash    TEXT NOT NULL UNIQUE,
    key_prefix  TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);

-- api: direct-to-storage multipart uploads.
CREATE TABLE uploads (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants(id),
    status        TEXT NOT NULL CHECK (status IN ('created','completing','completed','aborted','expired')),
    size_bytes    BIGINT NOT NULL CHECK (size_bytes > 0),
    content_type  TEXT NOT NULL,
    filename      TEXT,
    part_size     BIGINT NOT NULL,
    part_count    INTEGER NOT NULL,
    storage_key   TEXT NOT NULL,
    s3_upload_id  TEXT NOT NULL,
    video_id      TEXT,
    operation_id  TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX uploads_tenant_status ON uploads (tenant_id, status);
CREATE INDEX uploads_expiry ON uploads (expires_at) WHERE status = 'created';

-- api: videos and the operations that produce them.
CREATE TABLE videos (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants(id),
    upload_id     TEXT NOT NULL REFERENCES uploads(id),
    operation_id  TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('processing','ready','failed','cancelled')),
    version       BIGINT NOT NULL DEFAULT 1,
    filename      TEXT,
    content_type  TEXT NOT NULL,
    source_key    TEXT NOT NULL,
    source        JSONB,
    renditions    JSONB NOT NULL DEFAULT '[]',
    poster        JSONB,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX videos_tenant ON videos (tenant_id, id DESC);

CREATE TABLE operations (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants(id),
    video_id      TEXT NOT NULL REFERENCES videos(id),
    status        TEXT NOT NULL CHECK (status IN ('pending','running','succeeded','failed','cancelled')),
    progress      SMALLINT NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 100),
    phase         TEXT,
    result        JSONB,
    error         JSONB,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at  TIMESTAMPTZ
);
CREATE INDEX operations_tenant ON operations (tenant_id, id DESC);
CREATE INDEX operations_running ON operations (heartbeat_at) WHERE status IN ('pending','running');

-- api: events, recorded in the same transaction as the change that causes them.
-- payload is the exact JSON body sent to endpoints (text, not jsonb, so bytes never change).
CREATE TABLE events (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants(id),
    event_type  TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX events_tenant ON events (tenant_id, id DESC);

-- api: transactional outbox. A row is written in the same transaction as the
-- change it announces, and deleted by the relay once RabbitMQ confirmed it.
CREATE TABLE outbox (
    id           BIGSERIAL PRIMARY KEY,
    exchange     TEXT NOT NULL,
    routing_key  TEXT NOT NULL,
    payload      TEXT NOT NULL,
    correlation_id TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- api: customers' webhook endpoints. Secrets are sealed with AES-256-GCM
-- under the configured master key; the dispatcher opens them to sign.
CREATE TABLE webhook_endpoints (
    id                  TEXT PRIMARY KEY,
    tenant_id           TEXT NOT NULL REFERENCES tenants(id),
    url                 TEXT NOT NULL,
    description         TEXT,
    event_types         TEXT[],
    signature_format    TEXT NOT NULL CHECK (signature_format IN ('webhook-signature','standard-webhooks')),
    status              TEXT NOT NULL CHECK (status IN ('enabled','disabled')),
    disabled_reason     TEXT,
    disabled_at         TIMESTAMPTZ,
    secret_sealed       BYTEA NOT NULL,
    previous_secret_sealed BYTEA,
    previous_secret_expires_at TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at          TIMESTAMPTZ
);
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant_id) WHERE deleted_at IS NULL;

-- webhook-dispatcher: one row per (event, endpoint), the unit that is retried.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    endpoint_id     TEXT NOT NULL REFERENCES webhook_endpoints(id),
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    payload         TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending','succeeded','failed','paused')),
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ,
    locked_until    TIMESTAMPTZ,
    last_attempt_at TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (event_id, endpoint_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id DESC);

-- webhook-dispatcher: one row per HTTP try.
CREATE TABLE webhook_attempts (
    id              TEXT PRIMARY KEY,
    delivery_id     TEXT NOT NULL REFERENCES webhook_deliveries(id),
    endpoint_id     TEXT NOT NULL,
    attempt_number  INTEGER NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL,
    duration_ms     INTEGER NOT NULL,
    response_status INTEGER,
    error_class     TEXT,
    error_detail    TEXT,
    response_body   TEXT,
    next_attempt_at TIMESTAMPTZ,
    UNIQUE (delivery_id, attempt_number)
);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, attempt_number);

-- api: Idempotency-Key replay store, 24 h per tenant.
CREATE TABLE idempotency_keys (
    tenant_id       TEXT NOT NULL,
    route           TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    request_hash    TEXT NOT NULL,
    response_status INTEGER,
    response_body   TEXT,
    response_location TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, route, idempotency_key)
);
