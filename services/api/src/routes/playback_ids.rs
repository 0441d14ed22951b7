//! `/videos/{id}/playback-ids`: add and remove a video's playback IDs
//! (issue 19). A video gets its first ones from `POST /uploads`'
//! `playback_policy` when it becomes ready ([`crate::domain::operation`]);
//! these routes add more or take some away. `GET /videos/{id}` lists them.
//!
//! A playback ID is the capability to play: the playback service serves
//! `/play/{pb}.m3u8` and `/play/{pb}.mpd` for every row of `playback_ids`
//! whose video is ready, with no API key, and answers 404 from the request
//! after its row is deleted.

use actix_web::{web, HttpResponse};
use vid_core::playback::{CreatePlaybackId, PlaybackIdView};
use vid_core::video::VideoStatus;
use vid_core::{PlaybackId, VideoId};

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::parse_id;
use crate::state::AppState;
use crate::store;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/videos/{id}/playback-ids").route(web::post().to(create_playback_id)))
        .service(web::resource("/videos/{id}/playback-ids/{playback_id}").route(web::delete().to(delete_playback_id)));
}

/// `POST /videos/{id}/playback-ids` `{"policy": "public"}` → `201` with the
/// new playback ID (`id`, `policy`, `hls_url`, `dash_url`, `created_at`).
///
/// Allowed on a `processing` video (the id serves once the video is ready)
/// and a `ready` one; a video that `failed` or was `cancelled` has nothing to
/// play and answers `409 video_not_playable`. Each call creates another id;
/// ids are never reused.
///
/// Errors: `400 invalid_json` (no body, an unknown field, an unknown
/// policy), `404 not_found` (unknown, malformed or another tenant's video),
/// `409 video_not_playable` (`video_status`: `failed` or `cancelled`), `413`, `415`, `503`. A `signed` ID needs no signing key yet: its URLs
/// answer `403` until a token signed with one of the tenant's keys comes.
#[utoipa::path(
    post,
    path = "/videos/{id}/playback-ids",
    tag = "videos",
    security(("api_key" = [])),
    params(("id" = VideoId, Path, description = "The video.")),
    request_body = CreatePlaybackId,
    responses(
        (status = 201, description = "Created: the playback ID with its stable HLS and DASH URLs.", body = PlaybackIdView,
            links(("DeletePlaybackId" = (operation_id = "delete_playback_id", parameters(("id" = "$request.path.id"), ("playback_id" = "$response.body#/id")))))),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn create_playback_id(
    state: web::Data<AppState>,
    tenant: Tenant,
    path: web::Path<String>,
    body: crate::routes::common::Json<CreatePlaybackId>,
) -> ApiResult<HttpResponse> {
    let video: VideoId = parse_id(&path)?;
    let req = body.into_inner();
    let mut conn = state.db.get().await?;
    match store::operations::video_status(&mut conn, &tenant.id, &video).await? {
        None => return Err(ApiError::NotFound("video")),
        Some(status @ (VideoStatus::Failed | VideoStatus::Cancelled)) => {
            return Err(ApiError::new(codes::VIDEO_NOT_PLAYABLE, format!("video {video} is {}; it has nothing to play", status.as_str()))
                .with_extension("video_status", status.as_str()))
        }
        Some(VideoStatus::Processing | VideoStatus::Ready) => {}
    }
    // The row's foreign key holds the video; a video cannot be deleted through
    // the API, so the check above cannot be overtaken. A video that fails after
    // the check keeps an id that never serves, as one made earlier does.
    let row = store::playback_ids::insert(&mut conn, &tenant.id, &video, req.policy).await?;
    Ok(HttpResponse::Created().json(row.into_view(&state.settings.api.playback_base_url)))
}

/// `DELETE /videos/{id}/playback-ids/{playback_id}` → `204`. Its URLs stop
/// working: the playback service answers `404` from its next lookup on. The
/// video and its other playback IDs are unchanged.
///
/// Errors: `404 not_found` for an unknown or malformed playback ID, one of
/// another video, or one of another tenant (all alike), and for an unknown
/// video; `503`.
#[utoipa::path(
    delete,
    path = "/videos/{id}/playback-ids/{playback_id}",
    tag = "videos",
    security(("api_key" = [])),
    params(
        ("id" = VideoId, Path, description = "The video."),
        ("playback_id" = PlaybackId, Path, description = "One of the video's playback IDs (`pb_…`)."),
    ),
    responses(
        (status = 204, description = "Deleted: its URLs answer 404 from now on."),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn delete_playback_id(state: web::Data<AppState>, tenant: Tenant, path: web::Path<(String, String)>) -> ApiResult<HttpResponse> {
    let (video, pb) = path.into_inner();
    let video: VideoId = parse_id(&video)?;
    let pb: PlaybackId = parse_id(&pb)?;
    let mut conn = state.db.get().await?;
    if !store::playback_ids::delete(&mut conn, &tenant.id, &video, &pb).await? {
        return Err(ApiError::NotFound("playback ID"));
    }
    Ok(HttpResponse::NoContent().finish())
}
