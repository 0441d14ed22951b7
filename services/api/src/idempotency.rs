//! `Idempotency-Key` for unsafe requests (the IETF httpapi
//! "The Idempotency-Key HTTP Header Field" draft, as popularised by Stripe).
//! Used by `POST /uploads` and `POST /uploads/{id}/complete`.
//!
//! A key is 1–255 visible ASCII characters (else `400 invalid_idempotency_key`)
//! and belongs to its tenant and route. "The same request" means the same
//! canonical JSON body ([`request_hash`]).
//!
//! - **First request with a key**: a row (tenant, route, key, body hash) is
//!   written *before* the handler runs, then the handler runs.
//! - **Retry, same key and body, answer stored**: that answer (status, body,
//!   `Location`) is replayed with `Idempotent-Replayed: true`.
//! - **Same key, another body**: `422 idempotency_key_reused`.
//! - **Retry while the first is still running**: `409 idempotency_key_in_use`;
//!   retry later with the same key.
//!
//! **Which answers are stored** ([`stores`]): only `2xx`, i.e. the operation
//! happened (`201` upload created, `202` completion accepted). Every other
//! answer deletes the row, so the key is free and a retry with it runs again:
//! `4xx` answers either refuse the request before anything was done
//! (validation `400`/`422`, `404`) or describe a state that can change
//! (`409` conflicts such as `upload_incomplete`, `429` at the in-flight cap), and
//! `5xx` answers mean "not done, retry". This is the draft's and Stripe's rule
//! that only a request whose operation actually ran has a result to keep; the
//! handlers behind a key are safe to run again after a refusal.
//!
//! **A client that goes away does not strand its key.** Once the row is
//! written, the handler runs in its own task on the worker's `LocalSet`
//! ([`actix_web::rt::spawn`]); the request only awaits it. If the client
//! disconnects (the server drops the request future, see
//! `h1_allow_half_closed(false)` in `lib.rs`), the handler still finishes and
//! its answer is stored, so the retry gets it (the same upload id), instead of
//! the work being cut half-way and its result lost. Requests *without* a key
//! run in their own task too: a `complete` whose client vanished still
//! assembles and finalises (the video is announced by webhook), and a create
//! never leaves a storage multipart upload without its row (the janitor
//! expires and aborts the row; nothing would abort an orphan).
//!
//! **Lease.** A running request holds its key for [`LEASE_SECONDS`]
//! (`locked_until`), renewed every [`RENEW_EVERY`] while it runs. Only a run
//! whose process died (crash, kill, deploy cut-off) stops renewing: once its
//! lease has ended, a retry with the same key and body takes the key over and
//! runs again. Whatever the dead run had already done (e.g. an upload row
//! nobody learnt the id of) is left to the janitor's expiry of abandoned
//! uploads. `lock_token` fences the runs: only the current holder may renew,
//! store or release the row.
//!
//! **Retention.** Keys are kept [`KEY_TTL_HOURS`] from their first use; the
//! janitor deletes older rows ([`purge_expired`]), and a key reused after that
//! runs as new.
//!
//! **What a replay carries.** Exactly the stored answer, which may be stale:
//! a replayed `201` of `POST /uploads` carries the presigned part URLs of the
//! first answer, which may have expired (`expires_at`); ask for fresh ones
//! with `POST /uploads/{id}/parts:sign`. A replayed `202` of `complete`
//! carries the operation as it was then; poll its `Location`
//! (`/operations/{id}`) for its current state.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use chrono::Utc;
use futures::FutureExt;
use tracing::Instrument;

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::state::AppState;
use crate::store::idempotency as ik;

/// How long a key is remembered, in hours, from its first use.
pub const KEY_TTL_HOURS: i64 = 24;

/// How long, in seconds, a running request holds its key without renewing
/// it. After that a retry may take the key over.
pub const LEASE_SECONDS: i64 = 60;

/// How often a running request renews its lease (a third of [`LEASE_SECONDS`]).
pub const RENEW_EVERY: Duration = Duration::from_secs(20);

/// Rows deleted per statement by [`purge_expired`].
pub const PURGE_BATCH: i64 = 1000;

/// At most this many batches per [`purge_expired`] call (the rest waits for
/// the next janitor pass).
pub const PURGE_MAX_BATCHES: usize = 50;

/// Whether an answer with this status is stored and replayed: only `2xx`.
/// Every other answer releases the key (see the module docs).
pub fn stores(status: StatusCode) -> bool {
    status.is_success()
}

/// What "the same request" means: the lower-case hex SHA-256 of the
/// request's canonical JSON (serde's serialisation of the parsed body).
pub fn request_hash(request: &impl serde::Serialize) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, &serde_json::to_vec(request).unwrap_or_default()))
}

/// Runs `handler` at most once per (tenant, `route`, `Idempotency-Key`) and
/// answers retries from the stored answer; see the module docs for every case.
///
/// `request` is the parsed body; its canonical JSON is what "the same body"
/// means. `handler` gets owned copies of the state and tenant and must return
/// a `'static` future that runs in its own task, so it finishes even if the
/// client disconnects; with a key, its answer is also stored.
///
/// Errors (besides the handler's own): `400 invalid_idempotency_key`,
/// `422 idempotency_key_reused`, `409 idempotency_key_in_use`, `503` when the
/// database is unreachable before the handler ran, `500` if the handler panicked.
pub async fn once<F, Fut>(
    state: &AppState,
    tenant: &Tenant,
    req: &HttpRequest,
    route: &str,
    request: &impl serde::Serialize,
    handler: F,
) -> ApiResult<HttpResponse>
where
    F: FnOnce(AppState, Tenant) -> Fut,
    Fut: Future<Output = ApiResult<HttpResponse>> + 'static,
{
    let Some(key) = req.headers().get("idempotency-key") else {
        // Dropping the JoinHandle (the client went away) does not cancel the task.
        let task = actix_web::rt::spawn(handler(state.clone(), tenant.clone()).in_current_span());
        return task.await.map_err(|e| ApiError::Internal(anyhow::anyhow!("the request's task failed: {e}")))?;
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| ApiError::new(codes::INVALID_IDEMPOTENCY_KEY, "Idempotency-Key must be 1–255 visible ASCII characters"))?;
    let slot = Slot { tenant_id: tenant.id.clone(), route: route.to_owned(), key: key.to_owned(), token: new_token() };
    if let Some(replay) = slot.claim(state, &request_hash(request)).await? {
        return Ok(replay);
    }
    let work = handler(state.clone(), tenant.clone());
    // Dropping the JoinHandle (the client went away) does not cancel the task.
    let task = actix_web::rt::spawn(run_and_store(state.clone(), slot, work).in_current_span());
    task.await.map_err(|e| ApiError::Internal(anyhow::anyhow!("the idempotent request's task failed: {e}")))
}

/// Runs the claimed request to its end, renewing the lease meanwhile, then
/// stores its answer ([`stores`]) or releases the key. Returns the answer.
async fn run_and_store(state: AppState, slot: Slot, work: impl Future<Output = ApiResult<HttpResponse>>) -> HttpResponse {
    let renewing = async {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            match slot.renew(&state).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(route = %slot.route, "lost the lease of an Idempotency-Key; another request took it over"),
                Err(e) => tracing::warn!(route = %slot.route, error = %format!("{e:#}"), "could not renew an Idempotency-Key lease"),
            }
        }
    };
    let outcome = tokio::select! {
        outcome = AssertUnwindSafe(work).catch_unwind() => outcome,
        _ = renewing => unreachable!("the lease is renewed until the request ends"),
    };
    let resp = match outcome {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => e.error_response(),
        Err(_) => ApiError::Internal(anyhow::anyhow!("the handler of {} panicked", slot.route)).error_response(),
    };
    let status = resp.status();
    if !stores(status) {
        slot.release(&state).await;
        return resp;
    }
    let location = resp.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (head, body) = resp.into_parts();
    let bytes = match body.try_into_bytes() {
        Ok(bytes) => bytes,
        Err(body) => {
            // A streamed body cannot be stored; answer it once, keep nothing.
            slot.release(&state).await;
            return head.set_body(body);
        }
    };
    match slot.store(&state, status, &bytes, location).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(route = %slot.route, "an Idempotency-Key was taken over before its answer was stored"),
        // The client still gets the answer; the row keeps its lease, which
        // ends without renewal, and a later retry runs again.
        Err(e) => tracing::warn!(route = %slot.route, error = %format!("{e:#}"), "could not store an Idempotency-Key answer"),
    }
    head.set_body(actix_web::body::BoxBody::new(bytes))
}

/// One key of one tenant and route, claimed (or to be claimed) under `token`.
struct Slot {
    tenant_id: vid_core::TenantId,
    route: String,
    key: String,
    /// Fences this run's writes: random, 128 bits, hex.
    token: String,
}

impl Slot {
    fn key(&self) -> ik::Key<'_> {
        ik::Key { tenant: &self.tenant_id, route: &self.route, key: &self.key }
    }

    /// Claims the key for this run (`None`: run the handler) or returns the
    /// stored answer to replay. Errors: `422 idempotency_key_reused`,
    /// `409 idempotency_key_in_use`, database errors.
    async fn claim(&self, state: &AppState, hash: &str) -> ApiResult<Option<HttpResponse>> {
        let mut conn = state.db.get().await?;
        let now = Utc::now();
        let lease_end = now + chrono::Duration::seconds(LEASE_SECONDS);
        // A row past its replay window is forgotten even before the janitor purges it.
        ik::forget_if_older(&mut conn, self.key(), now - chrono::Duration::hours(KEY_TTL_HOURS)).await?;
        // Twice: the row may be released between our insert and our read.
        for _ in 0..2 {
            if ik::insert(&mut conn, self.key(), hash, now, lease_end, &self.token).await? {
                return Ok(None);
            }
            let Some((stored_hash, status, body, location)) = ik::stored(&mut conn, self.key()).await? else { continue };
            if stored_hash != hash {
                return Err(ApiError::new(codes::IDEMPOTENCY_KEY_REUSED, "this Idempotency-Key was used with a different request body"));
            }
            if let Some(status) = status {
                return Ok(Some(replay(status, body, location)));
            }
            // Still running, unless its lease ended (its process died): then take it over.
            if ik::take_over(&mut conn, self.key(), hash, now, lease_end, &self.token).await? {
                tracing::warn!(route = %self.route, "took over an Idempotency-Key whose lease had ended; running the request again");
                return Ok(None);
            }
            break;
        }
        Err(ApiError::new(codes::IDEMPOTENCY_KEY_IN_USE, "a request with this Idempotency-Key is still running"))
    }

    /// Extends the lease; `false` if this run no longer holds the key.
    async fn renew(&self, state: &AppState) -> anyhow::Result<bool> {
        let mut conn = state.db.get().await?;
        Ok(ik::renew(&mut conn, self.key(), &self.token, Utc::now() + chrono::Duration::seconds(LEASE_SECONDS)).await?)
    }

    /// Stores the answer; `false` if this run no longer holds the key.
    async fn store(&self, state: &AppState, status: StatusCode, body: &[u8], location: Option<String>) -> anyhow::Result<bool> {
        let mut conn = state.db.get().await?;
        let body = String::from_utf8_lossy(body).into_owned();
        Ok(ik::store_answer(&mut conn, self.key(), &self.token, i32::from(status.as_u16()), body, location).await?)
    }

    /// Deletes the row if this run still holds it, so a retry runs again.
    /// A failure is logged: the lease then ends on its own.
    async fn release(&self, state: &AppState) {
        let result = async {
            let mut conn = state.db.get().await?;
            ik::release(&mut conn, self.key(), &self.token).await?;
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(route = %self.route, error = %format!("{e:#}"), "could not release an Idempotency-Key; it frees itself when its lease ends");
        }
    }
}

/// The stored answer, replayed.
fn replay(status: i32, body: Option<String>, location: Option<String>) -> HttpResponse {
    let mut resp = HttpResponse::build(StatusCode::from_u16(status as u16).unwrap_or(StatusCode::OK));
    resp.insert_header(("Idempotent-Replayed", "true"));
    if let Some(loc) = location {
        resp.insert_header(("Location", loc));
    }
    let ct = if status >= 400 { vid_core::problem::PROBLEM_JSON } else { "application/json" };
    resp.content_type(ct).body(body.unwrap_or_default())
}

fn new_token() -> String {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("the system random source works");
    hex::encode(bytes)
}

/// Deletes `idempotency_keys` rows past their [`KEY_TTL_HOURS`] replay window
/// (by `created_at`, oldest first, via the `idempotency_keys_created_at`
/// index), [`PURGE_BATCH`] rows per statement and at most
/// [`PURGE_MAX_BATCHES`] statements per call. Returns the number of rows
/// deleted. Called by every janitor pass; safe in several replicas at once.
///
/// Errors: the database is unreachable or a statement fails.
pub async fn purge_expired(db: &vid_db::Pool) -> anyhow::Result<usize> {
    let cutoff = Utc::now() - chrono::Duration::hours(KEY_TTL_HOURS);
    let mut conn = db.get().await?;
    let mut purged = 0;
    for _ in 0..PURGE_MAX_BATCHES {
        let n = ik::purge_batch(&mut conn, cutoff, PURGE_BATCH).await?;
        purged += n;
        if (n as i64) < PURGE_BATCH {
            break;
        }
    }
    if purged > 0 {
        tracing::info!(purged, "purged expired Idempotency-Key rows");
    }
    Ok(purged)
}
