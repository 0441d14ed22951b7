//! Every SQL statement of the playback service (two, and they only read):
//! a playback ID's row joined to its video, and a signing key's public half
//! joined to a playback ID by tenant (issue 20). The api owns these tables
//! (ARCHITECTURE.md, "Who writes what"); this service never writes.

use diesel::prelude::*;
use diesel::OptionalExtension;
use vid_core::messages::StreamOutputs;
use vid_core::playback::PlaybackPolicy;
use vid_core::video::VideoStatus;
use vid_core::{PlaybackId, SigningKeyId};
use vid_db::schema::{playback_ids, signing_keys, videos};
use vid_db::{Pool, RunQueryDsl};

use crate::error::PlaybackError;

/// What a playback ID leads to. Holds no tenant or video id: nothing that
/// could leak into an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The row's policy.
    pub policy: PlaybackPolicy,
    /// The video's stream when the video is `ready` and has one; `None`
    /// while it is processing, after a failure, or for a video made before
    /// streaming.
    pub stream: Option<StreamOutputs>,
}

/// Looks `id` up: `None` when no row has it (never created, or deleted).
///
/// Errors: `Unavailable` when PostgreSQL does not answer (pool timeout
/// included); `Internal` for a row this code cannot read (an unknown policy,
/// a malformed `stream`).
pub async fn lookup(pool: &Pool, id: &PlaybackId) -> Result<Option<Entry>, PlaybackError> {
    let mut conn = pool.get().await.map_err(|e| PlaybackError::Unavailable(format!("database pool: {e}")))?;
    let row: Option<(String, String, Option<serde_json::Value>)> = playback_ids::table
        .inner_join(videos::table)
        .filter(playback_ids::id.eq(id.as_str()))
        .select((playback_ids::policy, videos::status, videos::stream))
        .first(&mut conn)
        .await
        .optional()
        .map_err(|e| PlaybackError::Unavailable(format!("playback id lookup: {e}")))?;
    let Some((policy, status, stream)) = row else { return Ok(None) };
    let policy = PlaybackPolicy::parse(&policy).ok_or_else(|| PlaybackError::Internal(format!("{id}: unknown policy {policy:?}")))?;
    let ready = VideoStatus::parse(&status) == Some(VideoStatus::Ready);
    let stream = match (ready, stream) {
        (true, Some(value)) => {
            Some(serde_json::from_value(value).map_err(|e| PlaybackError::Internal(format!("{id}: malformed videos.stream: {e}")))?)
        }
        _ => None,
    };
    Ok(Some(Entry { policy, stream }))
}

/// The public key (SPKI PEM) of signing key `kid` when it belongs to the
/// tenant of playback ID `id`; `None` for an unknown or deleted key, a key
/// of another tenant, or an unknown playback ID. Asked on every request of
/// a signed ID, never cached, so a deleted key fails from the next request
/// on. One query on two primary keys.
///
/// Errors: `Unavailable` when PostgreSQL does not answer.
pub async fn signing_key(pool: &Pool, id: &PlaybackId, kid: &SigningKeyId) -> Result<Option<String>, PlaybackError> {
    let mut conn = pool.get().await.map_err(|e| PlaybackError::Unavailable(format!("database pool: {e}")))?;
    signing_keys::table
        .inner_join(playback_ids::table.on(playback_ids::tenant_id.eq(signing_keys::tenant_id)))
        .filter(playback_ids::id.eq(id.as_str()))
        .filter(signing_keys::id.eq(kid.as_str()))
        .select(signing_keys::public_key)
        .first::<String>(&mut conn)
        .await
        .optional()
        .map_err(|e| PlaybackError::Unavailable(format!("signing key lookup: {e}")))
}
