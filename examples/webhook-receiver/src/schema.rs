//! Diesel table definitions, in step with `migrations/`.

diesel::table! {
    /// Event ids the consumer has processed, with what it did.
    seen_events (event_id) {
        /// `evt_…`, the event's `id`.
        event_id -> Text,
        /// The event's `type`, e.g. `video.ready`.
        event_type -> Text,
        /// `applied`, `stale`, `ignored` or `invalid` (see [`Outcome`](crate::Outcome)).
        outcome -> Text,
        /// When the consumer committed it.
        processed_at -> Timestamptz,
    }
}

diesel::table! {
    /// The receiver's local state of each video.
    videos (video_id) {
        /// `vid_…`.
        video_id -> Text,
        /// `processing`, `ready`, `failed` or `cancelled`.
        status -> Text,
        /// The video's version in the event that set this state.
        version -> Int8,
        /// The operation named by that event.
        operation_id -> Text,
        /// When this row last changed.
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    /// One row per effect applied to `videos`.
    applied_effects (id) {
        /// Sequence number.
        id -> Int8,
        /// The event that caused the effect.
        event_id -> Text,
        /// Its type.
        event_type -> Text,
        /// The video changed.
        video_id -> Text,
        /// The status set.
        status -> Text,
        /// The version set.
        version -> Int8,
        /// When it was committed.
        applied_at -> Timestamptz,
    }
}

diesel::joinable!(applied_effects -> seen_events (event_id));
diesel::allow_tables_to_appear_in_same_query!(seen_events, videos, applied_effects);
