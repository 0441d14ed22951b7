// Hand-kept in step with migrations/ (the test `schema_matches_migrations` checks it).

diesel::table! {
    tenants (id) {
        id -> Text,
        name -> Text,
        max_uploads_in_flight -> Nullable<Int4>,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    api_keys (id) {
        id -> Text,
        tenant_id -> Text,
        key_hash -> Text,
        key_prefix -> Text,
        created_at -> Timestamptz,
        revoked_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    uploads (id) {
        id -> Text,
        tenant_id -> Text,
        status -> Text,
        size_bytes -> Int8,
        content_type -> Text,
        filename -> Nullable<Text>,
        part_size -> Int8,
        part_count -> Int4,
        storage_key -> Text,
        s3_upload_id -> Text,
        video_id -> Nullable<Text>,
        operation_id -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        expires_at -> Timestamptz,
        playback_policy -> Array<Text>,
        mp4_support -> Text,
        poster_time -> Nullable<Float8>,
        cors_origin -> Nullable<Text>,
        source_url -> Nullable<Text>,
        source_max_size_bytes -> Nullable<Int8>,
        source_declared_content_type -> Nullable<Text>,
        source_allowed_content_types -> Nullable<Array<Text>>,
    }
}

diesel::table! {
    upload_client_tokens (token_hash) {
        token_hash -> Text,
        upload_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    videos (id) {
        id -> Text,
        tenant_id -> Text,
        upload_id -> Text,
        operation_id -> Text,
        status -> Text,
        version -> Int8,
        filename -> Nullable<Text>,
        content_type -> Text,
        source_key -> Text,
        source -> Nullable<Jsonb>,
        renditions -> Jsonb,
        poster -> Nullable<Jsonb>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        playback_policy -> Array<Text>,
        mp4_support -> Text,
        stream -> Nullable<Jsonb>,
        poster_time -> Nullable<Float8>,
    }
}

diesel::table! {
    operations (id) {
        id -> Text,
        tenant_id -> Text,
        video_id -> Text,
        status -> Text,
        progress -> Int2,
        phase -> Nullable<Text>,
        result -> Nullable<Jsonb>,
        error -> Nullable<Jsonb>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        heartbeat_at -> Nullable<Timestamptz>,
        revision -> Int8,
        scan -> Nullable<Text>,
        run_id -> Nullable<Text>,
        job_attempt -> Int4,
        job_published_at -> Timestamptz,
        owner_attempt -> Nullable<Int4>,
        awaiting_source -> Bool,
        download_bytes -> Nullable<Int8>,
        download_total_bytes -> Nullable<Int8>,
    }
}

diesel::table! {
    events (id) {
        id -> Text,
        tenant_id -> Text,
        event_type -> Text,
        resource_id -> Text,
        payload -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    outbox (id) {
        id -> Int8,
        exchange -> Text,
        routing_key -> Text,
        payload -> Text,
        correlation_id -> Nullable<Text>,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    webhook_endpoints (id) {
        id -> Text,
        tenant_id -> Text,
        url -> Text,
        description -> Nullable<Text>,
        event_types -> Nullable<Array<Text>>,
        signature_format -> Text,
        status -> Text,
        disabled_reason -> Nullable<Text>,
        disabled_at -> Nullable<Timestamptz>,
        secret_sealed -> Bytea,
        previous_secret_sealed -> Nullable<Bytea>,
        previous_secret_expires_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        deleted_at -> Nullable<Timestamptz>,
        consecutive_failures -> Int4,
        failing_since -> Nullable<Timestamptz>,
        last_success_at -> Nullable<Timestamptz>,
        throttled_until -> Nullable<Timestamptz>,
        concurrency_limit -> Nullable<Int4>,
    }
}

diesel::table! {
    webhook_deliveries (id) {
        id -> Text,
        tenant_id -> Text,
        endpoint_id -> Text,
        event_id -> Text,
        event_type -> Text,
        payload -> Text,
        status -> Text,
        attempt_count -> Int4,
        next_attempt_at -> Nullable<Timestamptz>,
        locked_until -> Nullable<Timestamptz>,
        last_attempt_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        manual_retry -> Bool,
    }
}

diesel::table! {
    webhook_attempts (id) {
        id -> Text,
        delivery_id -> Text,
        endpoint_id -> Text,
        attempt_number -> Int4,
        started_at -> Timestamptz,
        duration_ms -> Int4,
        response_status -> Nullable<Int4>,
        error_class -> Nullable<Text>,
        error_detail -> Nullable<Text>,
        response_body -> Nullable<Text>,
        next_attempt_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    idempotency_keys (tenant_id, route, idempotency_key) {
        tenant_id -> Text,
        route -> Text,
        idempotency_key -> Text,
        request_hash -> Text,
        response_status -> Nullable<Int4>,
        response_body -> Nullable<Text>,
        response_location -> Nullable<Text>,
        created_at -> Timestamptz,
        locked_until -> Nullable<Timestamptz>,
        lock_token -> Nullable<Text>,
    }
}

diesel::table! {
    playback_ids (id) {
        id -> Text,
        tenant_id -> Text,
        video_id -> Text,
        policy -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    signing_keys (id) {
        id -> Text,
        tenant_id -> Text,
        public_key -> Text,
        created_at -> Timestamptz,
    }
}

diesel::joinable!(api_keys -> tenants (tenant_id));
diesel::joinable!(playback_ids -> videos (video_id));
diesel::joinable!(upload_client_tokens -> uploads (upload_id));
diesel::joinable!(operations -> videos (video_id));
diesel::joinable!(webhook_attempts -> webhook_deliveries (delivery_id));
diesel::joinable!(webhook_deliveries -> webhook_endpoints (endpoint_id));

diesel::allow_tables_to_appear_in_same_query!(
    tenants,
    api_keys,
    uploads,
    upload_client_tokens,
    videos,
    playback_ids,
    signing_keys,
    operations,
    events,
    outbox,
    webhook_endpoints,
    webhook_deliveries,
    webhook_attempts,
    idempotency_keys,
);
