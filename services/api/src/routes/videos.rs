//! `/videos`: sources, renditions and posters, with time-limited download URLs.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::video::{Poster, Rendition, SourceMetadata, Video, VideoStatus};
use vid_core::{OperationId, VideoId};
use vid_db::schema::videos;
use vid_db::RunQueryDsl;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::operations::page;
use crate::routes::{page_size, parse_id};
use crate::state::AppState;
use crate::storage;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/videos").route(web::get().to(list_videos)))
        .service(web::resource("/videos/{id}").route(web::get().to(get_video)));
}

/// A row of `videos`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = videos)]
pub struct VideoRow {
    pub id: VideoId,
    pub operation_id: OperationId,
    pub status: String,
    pub version: i64,
    pub filename: Option<String>,
    pub content_type: String,
    pub source: Option<serde_json::Value>,
    pub renditions: serde_json::Value,
    pub poster: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl VideoRow {
    fn into_video(self) -> Video {
        Video {
            id: self.id,
            status: VideoStatus::parse(&self.status).unwrap_or(VideoStatus::Failed),
            version: self.version,
            operation_id: self.operation_id,
            filename: self.filename,
            content_type: self.content_type,
            source: self.source.and_then(|v| serde_json::from_value::<SourceMetadata>(v).ok()),
            renditions: serde_json::from_value::<Vec<Rendition>>(self.renditions).unwrap_or_default(),
            poster: self.poster.and_then(|v| serde_json::from_value::<Poster>(v).ok()),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// `GET /videos/{id}`: the video with presigned GET URLs for renditions and poster.
#[utoipa::path(
    get,
    path = "/videos/{id}",
    tag = "videos",
    security(("api_key" = [])),
    params(("id" = VideoId, Path, description = "The video.")),
    responses(
        (status = 200, description = "The video, with presigned GET URLs.", body = Video),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn get_video(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: VideoId = parse_id(&path)?;
    let mut conn = state.db.get().await?;
    let row = videos::table
        .filter(videos::id.eq(&id))
        .filter(videos::tenant_id.eq(&tenant.id))
        .select(VideoRow::as_select())
        .first(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("video"))?;
    drop(conn);
    let mut video = row.into_video();
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

/// `GET /videos?limit=&cursor=`: newest first, without download URLs.
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
        (status = 200, description = "A page of videos, newest first, without download URLs.", body = crate::routes::Page<Video>),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn list_videos(state: web::Data<AppState>, tenant: Tenant, query: web::Query<VideosQuery>) -> ApiResult<HttpResponse> {
    let limit = page_size(query.limit);
    let mut q = videos::table.filter(videos::tenant_id.eq(&tenant.id)).into_boxed();
    if let Some(cursor) = &query.cursor {
        let cursor: VideoId = cursor.parse().map_err(|_| ApiError::bad_request("invalid_cursor", "cursor is not a video id"))?;
        q = q.filter(videos::id.lt(cursor));
    }
    let mut conn = state.db.get().await?;
    let rows: Vec<VideoRow> = q.order(videos::id.desc()).limit(limit + 1).select(VideoRow::as_select()).load(&mut conn).await?;
    Ok(HttpResponse::Ok().json(page(rows, limit, |r| r.id.to_string(), VideoRow::into_video)))
}
