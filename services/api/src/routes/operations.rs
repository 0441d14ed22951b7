//! `/operations`: long-running jobs (design §2, "长任务：先返回 202").

use actix_web::{web, HttpResponse};
use vid_core::operation::{Operation, OperationStatus};
use vid_core::OperationId;

use crate::auth::{OperationCaller, Tenant};
use crate::domain::operation::{self, Applied, Transition};
use crate::error::{codes, ApiError, ApiResult};
// Kept for the delivery routes, which still name it here.
use crate::routes::common::{page, page_size, parse_id, Page};
use crate::state::AppState;
use crate::store::{self, operations::OperationRow};

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/operations").route(web::get().to(list_operations)))
        .service(web::resource("/operations/{id:[^/:]+}").route(web::get().to(get_operation)))
        .service(web::resource("/operations/{id:[^/:]+}:cancel").route(web::post().to(cancel_operation)))
        .service(web::resource("/operations/{id:[^/:]+}:wait").route(web::post().to(wait_operation)))
        .service(web::resource("/operations/{id:[^/:]+}/events").route(web::get().to(operation_events)));
}

/// `Location` of an operation.
pub fn operation_location(id: &OperationId) -> String {
    format!("/operations/{id}")
}

/// Loads a tenant's operation; `404` for anyone else's.
pub async fn load_operation(state: &AppState, tenant: &Tenant, id: &OperationId) -> ApiResult<Operation> {
    let mut conn = state.db.get().await?;
    let row = store::operations::get(&mut conn, &tenant.id, id).await?.ok_or(ApiError::NotFound("operation"))?;
    Ok(row.into_operation())
}

/// `GET /operations/{id}`.
#[utoipa::path(
    get,
    path = "/operations/{id}",
    tag = "operations",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::OperationId, Path, description = "The operation.")),
    responses(
        (status = 200, description = "The operation.", body = Operation),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn get_operation(state: web::Data<AppState>, caller: OperationCaller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let tenant = caller.tenant;
    let id: OperationId = parse_id(&path)?;
    Ok(HttpResponse::Ok().json(load_operation(&state, &tenant, &id).await?))
}

/// The query of `GET /operations`: `status`, `limit` and `cursor`, nothing
/// else. Any other parameter (`type`, …) is refused with `400 invalid_query`
/// naming it, rather than silently ignored.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OperationsQuery {
    /// Only operations in this status.
    #[param(value_type = Option<OperationStatus>)]
    pub status: Option<String>,
    /// Page size; clamped to 1–100 (default 20).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page: items older than this operation.
    #[param(value_type = Option<OperationId>)]
    pub cursor: Option<String>,
}

/// `GET /operations?status=&limit=&cursor=`: newest first, cursor-paged.
///
/// Errors (`400`): `invalid_query` for a malformed `limit` or any other
/// parameter (the detail names it); `invalid_status` for an unknown status;
/// `invalid_cursor` for a cursor that is not an operation id.
#[utoipa::path(
    get,
    path = "/operations",
    tag = "operations",
    security(("api_key" = [])),
    params(OperationsQuery),
    responses(
        (status = 200, description = "A page of operations, newest first.", body = Page<Operation>),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn list_operations(state: web::Data<AppState>, tenant: Tenant, query: web::Query<OperationsQuery>) -> ApiResult<HttpResponse> {
    let limit = page_size(query.limit);
    let status = match &query.status {
        Some(s) => Some(OperationStatus::parse(s).ok_or_else(|| ApiError::new(codes::INVALID_STATUS, format!("unknown status `{s}`")))?),
        None => None,
    };
    let cursor = match &query.cursor {
        Some(c) => Some(c.parse::<OperationId>().map_err(|_| ApiError::new(codes::INVALID_CURSOR, "cursor is not an operation id"))?),
        None => None,
    };
    let mut conn = state.db.get().await?;
    let rows = store::operations::list(&mut conn, &tenant.id, status, cursor.as_ref(), limit + 1).await?;
    Ok(HttpResponse::Ok().json(page(rows, limit, |r| r.id.to_string(), OperationRow::into_operation)))
}

/// `POST /operations/{id}:cancel`: `200` with the cancelled operation.
///
/// Works on `pending` and `running` operations. In one transaction: the
/// operation becomes `cancelled` (never overwritten afterwards), the video
/// `cancelled` with a new version, the event `video.cancelled` is recorded, and
/// a cancel message for every transcoder is queued. Errors: `operation_terminal` (409,
/// with the current status in `detail` and in the `operation_status` extension).
#[utoipa::path(
    post,
    path = "/operations/{id}:cancel",
    tag = "operations",
    security(("api_key" = [])),
    params(("id" = vid_core::OperationId, Path, description = "The operation.")),
    responses(
        (status = 200, description = "The cancelled operation.", body = Operation),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn cancel_operation(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: OperationId = parse_id(&path)?;
    let current = load_operation(&state, &tenant, &id).await?;
    if current.status.is_terminal() {
        return Err(operation_terminal(&current));
    }
    let mut conn = state.db.get().await?;
    let applied = operation::apply(&mut conn, &state.outbox, &id, Transition::Cancel).await?;
    drop(conn);
    let op = load_operation(&state, &tenant, &id).await?;
    if applied != Applied::Changed {
        return Err(operation_terminal(&op));
    }
    Ok(HttpResponse::Ok().json(op))
}

/// The `409 operation_terminal` for an operation that can no longer be cancelled.
fn operation_terminal(op: &Operation) -> ApiError {
    ApiError::new(codes::OPERATION_TERMINAL, format!("operation {} is already {}", op.id, op.status.as_str()))
        .with_extension("operation_status", op.status.as_str())
}

/// The `429 too_many_watchers` answer, with `Retry-After`.
fn too_many_watchers(busy: crate::watch::TooManyWatchers) -> ApiError {
    let whose = if busy.per_token { "this client token" } else { "this API key's tenant" };
    ApiError::new(
        codes::TOO_MANY_WATCHERS,
        format!("{whose} already has {} open waits and event streams; close one or retry later", busy.max),
    )
    .with_retry_after(WATCH_RETRY_AFTER_SECONDS)
}

/// `Retry-After` of `429 too_many_watchers`, in seconds.
const WATCH_RETRY_AFTER_SECONDS: u64 = 5;

/// Subscribes (taking a client token slot if a token calls, and a tenant
/// slot), then reads the operation, so no change can fall between the two.
/// Errors: `429 too_many_watchers`, `404`.
async fn watch_operation(
    state: &AppState,
    tenant: &Tenant,
    principal: &crate::auth::Principal,
    id: &OperationId,
) -> ApiResult<(crate::watch::Watch, crate::watch::Snapshot)> {
    let token = match principal {
        crate::auth::Principal::ClientToken(upload) => Some(upload),
        crate::auth::Principal::ApiKey => None,
    };
    let watch = state.watchers.subscribe(&tenant.id, token, id).map_err(too_many_watchers)?;
    let current = crate::watch::load(&state.db, id, Some(&tenant.id)).await?.ok_or(ApiError::NotFound("operation"))?;
    state.watchers.publish(id, current.clone());
    Ok((watch, current))
}

/// `POST /operations/{id}:wait` with an optional body `{"timeout_seconds": 30, "revision": 7}`
/// ([`vid_core::operation::WaitOperation`]): answers `200` with
/// `{"operation": {...}, "reason": "changed"|"timeout"|"terminal", "revision": n}`
/// ([`vid_core::operation::WaitResponse`]):
/// - `changed` as soon as the operation's status, progress or phase changes after
///   the call arrived (or its revision is already above the `revision` given);
/// - `terminal` at once if it was already terminal;
/// - `timeout` after `timeout_seconds` (default 30, at most
///   `operations.max_wait_seconds`, 60 by default) without a change,
///   or earlier when this api replica is stopping (`[api] stream_drain_seconds`
///   after SIGTERM): call again.
///
/// Holds one of the tenant's `operations.max_watchers_per_tenant` slots while
/// waiting; past the bound: `429 too_many_watchers` with `Retry-After`. A
/// body, when sent, follows every JSON route's rules: `application/json`
/// (else `415 unsupported_media_type`), at most 64 KiB (`413`), one object
/// without unknown or duplicate fields (`400 invalid_json`).
#[utoipa::path(
    post,
    path = "/operations/{id}:wait",
    tag = "operations",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::OperationId, Path, description = "The operation.")),
    request_body(content = Option<vid_core::operation::WaitOperation>, description = "Optional; `{}` or no body means the defaults."),
    responses(
        (status = 200, description = "The operation changed, was terminal, or the wait timed out.", body = vid_core::operation::WaitResponse),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 429, response = crate::error::responses::TooManyRequests),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn wait_operation(
    state: web::Data<AppState>,
    caller: OperationCaller,
    path: web::Path<String>,
    http: actix_web::HttpRequest,
    payload: web::Payload,
) -> ApiResult<HttpResponse> {
    use vid_core::operation::{WaitOperation, WaitReason, WaitResponse};
    let OperationCaller { tenant, principal } = caller;
    let id: OperationId = parse_id(&path)?;
    let body = crate::routes::common::read_body(payload, crate::routes::common::MAX_JSON_BODY_BYTES).await?;
    let request: WaitOperation = if body.iter().all(u8::is_ascii_whitespace) {
        WaitOperation::default()
    } else {
        // The app's JSON rules, as for every JSON body (`application/json`,
        // else 415), then an object only (serde would also read a JSON array
        // positionally), from the text (a duplicate key is refused).
        let mut replay = actix_web::dev::Payload::from(body);
        let parsed = web::JsonBody::<Box<serde_json::value::RawValue>>::new(&http, &mut replay, None, true)
            .limit(crate::routes::common::MAX_JSON_BODY_BYTES)
            .await;
        crate::routes::common::object_from_str(parsed.map_err(|e| crate::error::json_error(&e))?.get())?
    };
    let timeout =
        std::time::Duration::from_secs(u64::from(request.timeout_seconds.unwrap_or(30)).min(state.settings.operations.max_wait_seconds));
    let (mut watch, current) = watch_operation(&state, &tenant, &principal, &id).await?;
    let answer = |snapshot: crate::watch::Snapshot, reason| {
        HttpResponse::Ok().json(WaitResponse { operation: (*snapshot.operation).clone(), reason, revision: snapshot.revision })
    };
    let baseline = request.revision.unwrap_or(current.revision);
    if current.revision > baseline {
        return Ok(answer(current, WaitReason::Changed));
    }
    if current.operation.status.is_terminal() {
        return Ok(answer(current, WaitReason::Terminal));
    }
    // A stopping api answers early, as if the timeout had passed (see `Draining`).
    let changed = tokio::select! {
        r = tokio::time::timeout(timeout, watch.newer_than(baseline)) => r.ok(),
        _ = state.draining.over() => None,
    };
    Ok(match changed {
        Some(changed) => answer(changed, WaitReason::Changed),
        None => {
            let latest = watch.latest().filter(|s| s.revision >= current.revision).unwrap_or(current);
            answer(latest, WaitReason::Timeout)
        }
    })
}

/// Interval of `: keep-alive` comments on event streams.
pub const EVENTS_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// One Server-Sent Event carrying an operation.
fn sse_event(snapshot: &crate::watch::Snapshot) -> web::Bytes {
    let json = serde_json::to_string(&*snapshot.operation).expect("operations serialise");
    web::Bytes::from(format!("id: {}\ndata: {json}\n\n", snapshot.revision))
}

/// One event of `GET /operations/{id}/events` as a client's parser yields it
/// (the event-stream format of WHATWG HTML §9.2.6): the schema of each event
/// in the `text/event-stream` body, not of the body as one string.
#[derive(utoipa::ToSchema)]
pub struct OperationStreamEvent {
    /// The operation as JSON text (schema `Operation`).
    pub data: String,
    /// Its revision, as decimal text (send it back as `Last-Event-ID`).
    pub id: Option<String>,
    /// `message`: no `event:` field is sent, so browsers deliver it to `onmessage`.
    pub event: Option<String>,
    /// Reconnection delay in milliseconds (`retry: 3000`, before the first event).
    pub retry: Option<u64>,
}

/// `GET /operations/{id}/events`: a `text/event-stream` of the operation.
///
/// - First an event with the operation as it is, then one event per change
///   (status, progress, phase), each `data:` being the operation JSON and `id:`
///   its revision (a per-operation number that grows with every change). Events
///   have no `event:` name, so browsers deliver them to `EventSource.onmessage`.
/// - Changes closer together than the stream can deliver may be coalesced:
///   the stream always ends up at the newest state and never goes back.
/// - `: keep-alive` comments every 15 s.
/// - After the event with a terminal status, the stream ends.
/// - With `Last-Event-ID: n` (a reconnect), the first event is skipped if the
///   operation is still at revision `n`; otherwise the current state is sent.
///   A reconnect after the terminal event is answered `204 No Content`, which
///   makes browsers stop reconnecting.
///
/// Holds one of the tenant's watcher slots until the client disconnects;
/// past the bound: `429 too_many_watchers` with `Retry-After`.
#[utoipa::path(
    get,
    path = "/operations/{id}/events",
    tag = "operations",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::OperationId, Path, description = "The operation."), ("Last-Event-ID" = Option<i64>, Header, description = "On reconnect: the `id:` (revision) of the last event received.")),
    responses(
        (status = 200, description = "A `text/event-stream`: `data:` is the operation JSON (schema `Operation`), `id:` its revision; ends after the terminal event, or when this api replica is stopping (a `: server stopping` comment, then the end: reconnect with `Last-Event-ID`).", content_type = "text/event-stream", body = OperationStreamEvent),
        (status = 204, description = "A reconnect after the terminal event: nothing more will come."),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 429, response = crate::error::responses::TooManyRequests),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn operation_events(
    state: web::Data<AppState>,
    caller: OperationCaller,
    path: web::Path<String>,
    req: actix_web::HttpRequest,
) -> ApiResult<HttpResponse> {
    let OperationCaller { tenant, principal } = caller;
    let id: OperationId = parse_id(&path)?;
    let last_seen: Option<i64> = req.headers().get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
    let (watch, current) = watch_operation(&state, &tenant, &principal, &id).await?;
    let up_to_date = last_seen == Some(current.revision);
    if up_to_date && current.operation.status.is_terminal() {
        return Ok(HttpResponse::NoContent().finish());
    }
    struct Stream {
        watch: crate::watch::Watch,
        first: Option<crate::watch::Snapshot>,
        sent: i64,
        done: bool,
        draining: crate::state::Draining,
    }
    let start = Stream {
        first: (!up_to_date).then(|| current.clone()),
        sent: current.revision,
        watch,
        done: false,
        draining: state.draining.clone(),
    };
    let head = futures::stream::once(async { Ok::<_, actix_web::Error>(web::Bytes::from_static(b"retry: 3000\n\n")) });
    let events = futures::stream::unfold(start, |mut st| async move {
        if st.done {
            return None;
        }
        let next = match st.first.take() {
            Some(first) => first,
            None => {
                let waited = tokio::select! {
                    r = tokio::time::timeout(EVENTS_KEEP_ALIVE, st.watch.newer_than(st.sent)) => Some(r),
                    // The api is stopping: end the stream cleanly; the client
                    // reconnects with `Last-Event-ID` (to another replica).
                    _ = st.draining.over() => None,
                };
                match waited {
                    Some(Ok(next)) => next,
                    Some(Err(_)) => return Some((Ok(web::Bytes::from_static(b": keep-alive\n\n")), st)),
                    None => {
                        st.done = true;
                        return Some((Ok(web::Bytes::from_static(b": server stopping; reconnect with Last-Event-ID\n\n")), st));
                    }
                }
            }
        };
        st.sent = next.revision;
        st.done = next.operation.status.is_terminal();
        Some((Ok::<_, actix_web::Error>(sse_event(&next)), st))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(futures::StreamExt::chain(head, events)))
}
