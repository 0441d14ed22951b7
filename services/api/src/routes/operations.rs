//! `/operations`: long-running jobs (design §2, "长任务：先返回 202").

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use vid_core::event::{EventData, EventType, VideoEventData};
use vid_core::messages::CancelTranscode;
use vid_core::operation::{Operation, OperationMetadata, OperationResult, OperationStatus, Phase};
use vid_core::video::VideoStatus;
use vid_core::{OperationId, Problem, TenantId, VideoId};
use vid_db::schema::{operations, videos};
use vid_db::RunQueryDsl;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::{parse_id, Page, PageQuery};
use crate::state::AppState;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/operations", web::get().to(list_operations))
        .route("/operations/{id:[^/:]+}", web::get().to(get_operation))
        .route("/operations/{id:[^/:]+}:cancel", web::post().to(cancel_operation));
}

/// `Location` of an operation.
pub fn operation_location(id: &OperationId) -> String {
    format!("/operations/{id}")
}

/// A row of `operations`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = operations)]
pub struct OperationRow {
    pub id: OperationId,
    pub tenant_id: TenantId,
    pub video_id: VideoId,
    pub status: String,
    pub progress: i16,
    pub phase: Option<String>,
    pub result: Option<serde_json::Value>,
    pub error: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub heartbeat_at: Option<DateTime<Utc>>,
}

impl OperationRow {
    /// The public resource.
    pub fn into_operation(self) -> Operation {
        Operation {
            id: self.id,
            status: OperationStatus::parse(&self.status).unwrap_or(OperationStatus::Failed),
            progress: self.progress.clamp(0, 100) as u8,
            created_at: self.created_at,
            updated_at: self.updated_at,
            result: self.result.and_then(|v| serde_json::from_value::<OperationResult>(v).ok()),
            error: self.error.and_then(|v| serde_json::from_value::<Problem>(v).ok()),
            metadata: OperationMetadata {
                phase: self.phase.and_then(|p| serde_json::from_value::<Phase>(serde_json::Value::String(p)).ok()),
                video_id: Some(self.video_id),
            },
        }
    }
}

/// Loads a tenant's operation; `404` for anyone else's.
pub async fn load_operation(state: &AppState, tenant: &Tenant, id: &OperationId) -> ApiResult<Operation> {
    let mut conn = state.db.get().await?;
    let row = operations::table
        .filter(operations::id.eq(id))
        .filter(operations::tenant_id.eq(&tenant.id))
        .select(OperationRow::as_select())
        .first(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("operation"))?;
    Ok(row.into_operation())
}

/// `GET /operations/{id}`.
async fn get_operation(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: OperationId = parse_id(&path)?;
    Ok(HttpResponse::Ok().json(load_operation(&state, &tenant, &id).await?))
}

/// `GET /operations?status=&limit=&cursor=`: newest first, cursor-paged.
async fn list_operations(state: web::Data<AppState>, tenant: Tenant, query: web::Query<PageQuery>) -> ApiResult<HttpResponse> {
    let limit = query.limit();
    let mut q = operations::table.filter(operations::tenant_id.eq(&tenant.id)).into_boxed();
    if let Some(status) = &query.status {
        let status = OperationStatus::parse(status)
            .ok_or_else(|| ApiError::bad_request("invalid_status", format!("unknown status `{status}`")))?;
        q = q.filter(operations::status.eq(status.as_str()));
    }
    if let Some(cursor) = &query.cursor {
        let cursor: OperationId = cursor.parse().map_err(|_| ApiError::bad_request("invalid_cursor", "cursor is not an operation id"))?;
        q = q.filter(operations::id.lt(cursor));
    }
    let mut conn = state.db.get().await?;
    let rows: Vec<OperationRow> =
        q.order(operations::id.desc()).limit(limit + 1).select(OperationRow::as_select()).load(&mut conn).await?;
    Ok(HttpResponse::Ok().json(page(rows, limit, |r| r.id.to_string(), OperationRow::into_operation)))
}

/// Cuts `limit + 1` rows into a page and its cursor.
pub fn page<R, T>(mut rows: Vec<R>, limit: i64, id: impl Fn(&R) -> String, map: impl Fn(R) -> T) -> Page<T> {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if more { rows.last().map(&id) } else { None };
    Page { data: rows.into_iter().map(map).collect(), next_cursor }
}

/// `POST /operations/{id}:cancel`: `200` with the cancelled operation.
///
/// Works on `pending` and `running` operations. In one transaction: the
/// operation becomes `cancelled` (never overwritten afterwards), the video
/// `cancelled` with a new version, the event `video.cancelled` is recorded, and
/// a cancel message for every transcoder is queued. Errors: `operation_terminal` (409).
async fn cancel_operation(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: OperationId = parse_id(&path)?;
    let current = load_operation(&state, &tenant, &id).await?;
    if current.status.is_terminal() {
        return Err(ApiError::Conflict {
            code: "operation_terminal",
            detail: format!("operation {id} is already {}", current.status.as_str()),
            extensions: vec![("status", current.status.as_str().into())],
        });
    }
    let topology = state.topology.clone();
    let tenant_id = tenant.id.clone();
    let mut conn = state.db.get().await?;
    let cancelled = conn
        .transaction::<bool, ApiError, _>(|conn| {
            async move {
                let error = Problem::new(409, "cancelled", "Operation cancelled").with_detail("cancelled at the caller's request");
                let video_id: Option<VideoId> = diesel::update(
                    operations::table.filter(operations::id.eq(&id)).filter(operations::status.eq_any(["pending", "running"])),
                )
                .set((
                    operations::status.eq(OperationStatus::Cancelled.as_str()),
                    operations::error.eq(serde_json::to_value(&error).expect("problems serialise")),
                    operations::updated_at.eq(Utc::now()),
                ))
                .returning(operations::video_id)
                .get_result(conn)
                .await
                .optional()?;
                let Some(video_id) = video_id else { return Ok(false) };
                let version = bump_video(conn, &video_id, VideoStatus::Cancelled).await?;
                crate::outbox::record_event(
                    conn,
                    &topology,
                    &tenant_id,
                    EventType::VideoCancelled,
                    video_id.as_str(),
                    EventData::Video(VideoEventData { video_id: video_id.clone(), operation_id: id.clone(), version }),
                )
                .await?;
                crate::outbox::enqueue(
                    conn,
                    &topology.control_exchange(),
                    "",
                    serde_json::to_string(&CancelTranscode { operation_id: id.clone() }).expect("serialises"),
                    Some(id.as_str()),
                )
                .await?;
                Ok(true)
            }
            .scope_boxed()
        })
        .await?;
    state.outbox_notify.notify_one();
    let op = load_operation(&state, &tenant, &current.id).await?;
    if !cancelled {
        return Err(ApiError::Conflict {
            code: "operation_terminal",
            detail: format!("operation {} is already {}", op.id, op.status.as_str()),
            extensions: vec![("status", op.status.as_str().into())],
        });
    }
    Ok(HttpResponse::Ok().json(op))
}

/// Sets a video's status and increments its version; returns the new version.
pub async fn bump_video(
    conn: &mut diesel_async::AsyncPgConnection,
    video_id: &VideoId,
    status: VideoStatus,
) -> diesel::QueryResult<i64> {
    diesel::update(videos::table.filter(videos::id.eq(video_id)))
        .set((videos::status.eq(status.as_str()), videos::version.eq(videos::version + 1), videos::updated_at.eq(Utc::now())))
        .returning(videos::version)
        .get_result(conn)
        .await
}
