-- The receiver's own schema, in its own database: it never touches the platform's tables.

-- One row per event id the consumer has processed. Inserted in the same
-- transaction as the event's effect, never by the HTTP handler.
CREATE TABLE seen_events (
    event_id     TEXT        PRIMARY KEY,
    event_type   TEXT        NOT NULL,
    -- applied | stale | ignored | invalid
    outcome      TEXT        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The customer's local view of their videos. `version` only ever grows.
CREATE TABLE videos (
    video_id     TEXT        PRIMARY KEY,
    status       TEXT        NOT NULL,
    version      BIGINT      NOT NULL,
    operation_id TEXT        NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per effect actually applied to `videos`: counting rows per event id
-- shows whether an effect ever happened twice.
CREATE TABLE applied_effects (
    id           BIGSERIAL   PRIMARY KEY,
    event_id     TEXT        NOT NULL REFERENCES seen_events (event_id),
    event_type   TEXT        NOT NULL,
    video_id     TEXT        NOT NULL,
    status       TEXT        NOT NULL,
    version      BIGINT      NOT NULL,
    applied_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX applied_effects_event_id ON applied_effects (event_id);
