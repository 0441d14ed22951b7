//! `/signing-keys`: the tenant's keys for signed playback (issue 20).
//!
//! `POST` makes an RSA key pair ([`vid_core::signing::KEY_BITS`] bits) with
//! aws-lc-rs, the one RSA implementation of the workspace (rustls already
//! links it; jsonwebtoken verifies with it in the playback service): its key
//! generation is constant-time C, and fast in debug builds too. The private
//! half is answered once as PKCS#8 PEM and dropped (never logged, never
//! stored); `signing_keys` keeps the public half as SubjectPublicKeyInfo PEM.
//! Deleting a key deletes its row: the playback service looks the key up on
//! every request of a signed playback ID, so tokens signed with it fail from
//! the next request on.

use actix_web::{web, HttpResponse};
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::signature::KeyPair as _;
use vid_core::signing::{CreatedSigningKey, SigningKey};
use vid_core::SigningKeyId;

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::{page, page_size, parse_id};
use crate::state::AppState;
use crate::store::signing_keys::{self as store, SigningKeyRow};

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/signing-keys").route(web::post().to(create_signing_key)).route(web::get().to(list_signing_keys)))
        .service(web::resource("/signing-keys/{id}").route(web::get().to(get_signing_key)).route(web::delete().to(delete_signing_key)));
}

/// A new key pair: (private key as PKCS#8 PEM, public key as SPKI PEM).
/// Errors: key generation failing (an aws-lc error: a bug or no entropy).
pub fn generate_key_pair() -> Result<(String, String), ApiError> {
    let internal = |what: &str| ApiError::Internal(anyhow::anyhow!("signing key generation: {what}"));
    let pair = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).map_err(|_| internal("generate"))?;
    let private = pair.as_der().map_err(|_| internal("PKCS#8 encoding"))?;
    let public = pair.public_key().as_der().map_err(|_| internal("SPKI encoding"))?;
    // RFC 7468 text with `\n` line ends (what openssl and PyJWT write).
    let lf = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    let private_pem = pem::encode_config(&pem::Pem::new("PRIVATE KEY", private.as_ref()), lf);
    let public_pem = pem::encode_config(&pem::Pem::new("PUBLIC KEY", public.as_ref()), lf);
    Ok((private_pem, public_pem))
}

/// `POST /signing-keys` (no body) → `201` with `{id, private_key, created_at}`:
/// an RSA 2048 key pair whose private half (PKCS#8 PEM) is shown this once
/// and never stored. Sign playback tokens with it, `kid` = `id`.
///
/// Errors: `503`.
#[utoipa::path(
    post,
    path = "/signing-keys",
    tag = "signing-keys",
    security(("api_key" = [])),
    responses(
        (status = 201, description = "Created; the `private_key` (PKCS#8 PEM) is shown this once and never stored.", body = CreatedSigningKey,
            headers(("Location" = String, description = "`/signing-keys/{id}`")),
            links(("GetSigningKey" = (operation_id = "get_signing_key", parameters(("id" = "$response.body#/id")))), ("DeleteSigningKey" = (operation_id = "delete_signing_key", parameters(("id" = "$response.body#/id")))))),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn create_signing_key(state: web::Data<AppState>, tenant: Tenant) -> ApiResult<HttpResponse> {
    // RSA key generation takes tens of milliseconds: off the async workers.
    let (private_key, public_key) =
        web::block(generate_key_pair).await.map_err(|e| ApiError::Internal(anyhow::anyhow!("key generation task: {e}")))??;
    let id = SigningKeyId::generate();
    let mut conn = state.db.get().await?;
    let row = store::insert(&mut conn, &tenant.id, &id, &public_key).await?;
    let created = CreatedSigningKey { id: row.id, private_key, created_at: row.created_at };
    // A one-time secret: no cache may keep it (RFC 9111 §5.2.2.5).
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/signing-keys/{id}")))
        .insert_header(("Cache-Control", "no-store"))
        .json(created))
}

/// The query of `GET /signing-keys`: `limit` and `cursor`, nothing else.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SigningKeysQuery {
    /// Page size; clamped to 1–100 (default 20).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page: keys older than this one.
    #[param(value_type = Option<SigningKeyId>)]
    pub cursor: Option<String>,
}

/// `GET /signing-keys?limit=&cursor=`: the tenant's keys, newest first,
/// without key material.
///
/// Errors (`400`): `invalid_query` (a malformed `limit`, another
/// parameter), `invalid_cursor` (not a signing key id).
#[utoipa::path(
    get,
    path = "/signing-keys",
    tag = "signing-keys",
    security(("api_key" = [])),
    params(SigningKeysQuery),
    responses(
        (status = 200, description = "A page of signing keys, newest first, without key material.", body = crate::routes::common::Page<SigningKey>),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn list_signing_keys(state: web::Data<AppState>, tenant: Tenant, query: web::Query<SigningKeysQuery>) -> ApiResult<HttpResponse> {
    let limit = page_size(query.limit);
    let cursor = match &query.cursor {
        Some(c) => Some(c.parse::<SigningKeyId>().map_err(|_| ApiError::new(codes::INVALID_CURSOR, "cursor is not a signing key id"))?),
        None => None,
    };
    let mut conn = state.db.get().await?;
    let rows = store::list(&mut conn, &tenant.id, cursor.as_ref(), limit + 1).await?;
    Ok(HttpResponse::Ok().json(page(rows, limit, |r| r.id.to_string(), SigningKeyRow::into_view)))
}

/// `GET /signing-keys/{id}`: one key, without key material.
///
/// Errors: `404 not_found` (unknown, deleted, malformed or another tenant's), `503`.
#[utoipa::path(
    get,
    path = "/signing-keys/{id}",
    tag = "signing-keys",
    security(("api_key" = [])),
    params(("id" = SigningKeyId, Path, description = "The signing key.")),
    responses(
        (status = 200, description = "The signing key, without key material.", body = SigningKey),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn get_signing_key(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: SigningKeyId = parse_id(&path)?;
    let mut conn = state.db.get().await?;
    let row = store::find(&mut conn, &tenant.id, &id).await?.ok_or(ApiError::NotFound("signing key"))?;
    Ok(HttpResponse::Ok().json(row.into_view()))
}

/// `DELETE /signing-keys/{id}` → `204`. Tokens signed with it stop working
/// from the playback service's next request on (`403 token_unknown_key`).
///
/// Errors: `404 not_found` (unknown, already deleted, malformed or another tenant's), `503`.
#[utoipa::path(
    delete,
    path = "/signing-keys/{id}",
    tag = "signing-keys",
    security(("api_key" = [])),
    params(("id" = SigningKeyId, Path, description = "The signing key.")),
    responses(
        (status = 204, description = "Deleted: tokens signed with it are refused from the next request on."),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn delete_signing_key(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: SigningKeyId = parse_id(&path)?;
    let mut conn = state.db.get().await?;
    if !store::delete(&mut conn, &tenant.id, &id).await? {
        return Err(ApiError::NotFound("signing key"));
    }
    Ok(HttpResponse::NoContent().finish())
}
