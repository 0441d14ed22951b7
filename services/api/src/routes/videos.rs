//! `/videos`: sources, renditions and posters, with time-limited download
//! URLs, and each video's playback IDs with their stable HLS and DASH URLs
//! (built from `api.playback_base_url`). The playback IDs themselves are added
//! and removed in [`crate::routes::playback_ids`].

use std::time::Duration;

use actix_web::{web, HttpResponse};
use vid_core::video::Video;
use vid_core::{TenantId, VideoId};

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::{page, page_size, parse_id};
use crate::state::AppState;
use crate::storage;
use crate::store::{self, operations::VideoRow};

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/videos").route(web::get().to(list_videos)))
        .service(web::resource("/videos/{id}").route(web::get().to(get_video)));
}

/// `GET /videos/{id}`: the video with presigned GET URLs for renditions and
/// poster (valid `uploads.download_url_ttl_seconds`), its `mp4_support`, and
/// its `playback_ids`, oldest first, each with its stable `hls_url` and
/// `dash_url` (they serve once the video is ready).
///
/// Errors: `404 not_found` (unknown, malformed or another tenant's id), `503`.
#[utoipa::path(
    get,
    path = "/videos/{id}",
    tag = "videos",
    security(("api_key" = [])),
    params(("id" = VideoId, Path, description = "The video.")),
    responses(
        (status = 200, description = "The video, with presigned GET URLs and its playback IDs (oldest first).", body = Video),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn get_video(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: VideoId = parse_id(&path)?;
    let mut conn = state.db.get().await?;
    let row = store::operations::get_video(&mut conn, &tenant.id, &id).await?.ok_or(ApiError::NotFound("video"))?;
    let ids = store::playback_ids::list_for_video(&mut conn, &tenant.id, &id).await?;
    drop(conn);
    let mut video = row.into_video();
    let base = &state.settings.api.playback_base_url;
    video.playback_ids = ids.into_iter().map(|r| r.into_view(base)).collect();
    let ttl = Duration::from_secs(state.settings.uploads.download_url_ttl_seconds);
    for r in &mut video.renditions {
        let (url, expires) = storage::presign_get(&state, &r.storage_key, ttl).await?;
        r.url = Some(url);
        r.url_expires_at = Some(expires);
    }
    if let Some(p) = &mut video.poster {
        p.url = Some(storage::presign_get(&state, &p.storage_key, ttl).await?.0);
    }
    Ok(HttpResponse::Ok().json(video))
}

/// The query of `GET /videos`: `limit` and `cursor`, nothing else. Any other
/// parameter (`status`, `type`, …) is refused with `400 invalid_query`
/// naming it, rather than silently ignored.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct VideosQuery {
    /// Page size; clamped to 1–100 (default 20).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page: items older than this video.
    #[param(value_type = Option<VideoId>)]
    pub cursor: Option<String>,
}

/// `GET /videos?limit=&cursor=`: newest first, without download URLs; each
/// video with its `playback_ids` (oldest first, with their stable URLs).
///
/// Errors (`400`): `invalid_query` for a malformed `limit` or any other
/// parameter (the detail names it); `invalid_cursor` for a cursor that is not
/// a video id.
#[utoipa::path(
    get,
    path = "/videos",
    tag = "videos",
    security(("api_key" = [])),
    params(VideosQuery),
    responses(
        (status = 200, description = "A page of videos, newest first, without download URLs, each with its playback IDs.", body = crate::routes::common::Page<Video>),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn list_videos(state: web::Data<AppState>, tenant: Tenant, query: web::Query<VideosQuery>) -> ApiResult<HttpResponse> {
    let limit = page_size(query.limit);
    let cursor = match &query.cursor {
        Some(c) => Some(c.parse::<VideoId>().map_err(|_| ApiError::new(codes::INVALID_CURSOR, "cursor is not a video id"))?),
        None => None,
    };
    let mut conn = state.db.get().await?;
    let rows = store::operations::list_videos(&mut conn, &tenant.id, cursor.as_ref(), limit + 1).await?;
    let mut listed = page(rows, limit, |r| r.id.to_string(), VideoRow::into_video);
    with_playback_ids(&mut conn, &state, &tenant.id, &mut listed.data).await?;
    Ok(HttpResponse::Ok().json(listed))
}

/// Fills each video's `playback_ids` (oldest first) with one query for the page.
async fn with_playback_ids(conn: &mut store::Conn, state: &AppState, tenant: &TenantId, videos: &mut [Video]) -> ApiResult<()> {
    let ids: Vec<VideoId> = videos.iter().map(|v| v.id.clone()).collect();
    let rows = store::playback_ids::list_for_videos(conn, tenant, &ids).await?;
    let base = &state.settings.api.playback_base_url;
    for row in rows {
        if let Some(v) = videos.iter_mut().find(|v| v.id == row.video_id) {
            v.playback_ids.push(row.into_view(base));
        }
    }
    Ok(())
}
