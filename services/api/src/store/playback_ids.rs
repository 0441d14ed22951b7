//! `playback_ids`: the row type and every query on it (issue 19).
//!
//! Writer: the api only — [`crate::domain::operation`] inserts a video's
//! playback IDs in the transaction that makes it ready, and the
//! `/videos/{id}/playback-ids` routes add and delete them. Reader besides the
//! api: the playback service, which looks rows up by id on every request and
//! never writes. Every query here is filtered by tenant (and by video where a
//! video is named), so another tenant's ids read as absent.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::playback::{PlaybackIdView, PlaybackPolicy};
use vid_core::{PlaybackId, TenantId, VideoId};
use vid_db::schema::playback_ids;
use vid_db::RunQueryDsl;

use super::Conn;

/// A row of `playback_ids`. An unknown stored `policy` is a deserialize error.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = playback_ids)]
pub struct PlaybackIdRow {
    /// `pb_…`
    pub id: PlaybackId,
    /// The video it plays.
    pub video_id: VideoId,
    /// Who may play through it.
    pub policy: PlaybackPolicy,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl PlaybackIdRow {
    /// The public view, its URLs under `base` (`api.playback_base_url`).
    pub fn into_view(self, base: &str) -> PlaybackIdView {
        PlaybackIdView::new(base, self.id, self.policy, self.created_at)
    }
}

/// Inserts a new playback ID of `policy` for `tenant`'s `video`; returns the row.
pub async fn insert(conn: &mut Conn, tenant: &TenantId, video: &VideoId, policy: PlaybackPolicy) -> QueryResult<PlaybackIdRow> {
    diesel::insert_into(playback_ids::table)
        .values((
            playback_ids::id.eq(PlaybackId::generate()),
            playback_ids::tenant_id.eq(tenant),
            playback_ids::video_id.eq(video),
            playback_ids::policy.eq(policy),
        ))
        .returning(PlaybackIdRow::as_returning())
        .get_result(conn)
        .await
}

/// The playback IDs of `tenant`'s `video`, oldest first (ties by id).
pub async fn list_for_video(conn: &mut Conn, tenant: &TenantId, video: &VideoId) -> QueryResult<Vec<PlaybackIdRow>> {
    playback_ids::table
        .filter(playback_ids::tenant_id.eq(tenant))
        .filter(playback_ids::video_id.eq(video))
        .order((playback_ids::created_at.asc(), playback_ids::id.asc()))
        .select(PlaybackIdRow::as_select())
        .load(conn)
        .await
}

/// The playback IDs of several of `tenant`'s videos (one page of
/// `GET /videos`) in one query, oldest first per video (ties by id).
pub async fn list_for_videos(conn: &mut Conn, tenant: &TenantId, videos: &[VideoId]) -> QueryResult<Vec<PlaybackIdRow>> {
    if videos.is_empty() {
        return Ok(Vec::new());
    }
    playback_ids::table
        .filter(playback_ids::tenant_id.eq(tenant))
        .filter(playback_ids::video_id.eq_any(videos))
        .order((playback_ids::created_at.asc(), playback_ids::id.asc()))
        .select(PlaybackIdRow::as_select())
        .load(conn)
        .await
}

/// Deletes playback ID `id` of `tenant`'s `video`; whether it existed
/// (`false` too for another video's or another tenant's id). Its URLs answer
/// 404 from the playback service's next lookup on.
pub async fn delete(conn: &mut Conn, tenant: &TenantId, video: &VideoId, id: &PlaybackId) -> QueryResult<bool> {
    let n = diesel::delete(
        playback_ids::table
            .filter(playback_ids::id.eq(id))
            .filter(playback_ids::video_id.eq(video))
            .filter(playback_ids::tenant_id.eq(tenant)),
    )
    .execute(conn)
    .await?;
    Ok(n == 1)
}
