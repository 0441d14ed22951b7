//! The api's OpenAPI 3.1 description, generated from the code with utoipa.
//!
//! - `GET /openapi.json`: the document ([`ApiDoc`]).
//! - `GET /docs/`: Swagger UI. Its assets come from the `utoipa-swagger-ui`
//!   crate's `vendored` feature (a Swagger UI zip shipped inside a crates.io
//!   package) and are embedded in the binary: nothing is downloaded at build
//!   or run time.
//!
//! Every handler carries a `#[utoipa::path]`; `tests/openapi.rs` fails when a
//! route registered with `web::resource("…").route(web::METHOD()…)` is
//! missing from the document. Problem responses are reusable components (`BadRequest`,
//! `Unauthorized`, …) with `application/problem+json` bodies of schema `Problem`.

use std::sync::OnceLock;

use actix_web::{web, HttpResponse};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::responses::{
    BadRequest, Conflict, NotFound, PayloadTooLarge, TooManyRequests, Unauthorized, Unavailable, Unprocessable, UnsupportedMediaType,
};
use crate::routes;

/// The name of the bearer security scheme every tenant route requires.
pub const SECURITY_SCHEME: &str = "api_key";

/// The bearer security scheme of client tokens (issue 21), accepted besides
/// [`SECURITY_SCHEME`] on the client-token routes.
pub const CLIENT_TOKEN_SCHEME: &str = "client_token";

/// The OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Video platform API",
        description = "Direct-to-storage multipart uploads, transcode operations (`202 Accepted` + `Location`), \
videos with time-limited download URLs and stable playback IDs (HLS and DASH URLs), webhook endpoints and their delivery log, and the event log.\n\n\
Authenticate with `Authorization: Bearer <API key>` (`vidk_…`). Every error is an RFC 9457 problem \
(`application/problem+json`) with a stable machine-readable `code`; branch on `code`, never on `title` or `detail`. \
A method a path does not serve is `405 method_not_allowed`, with an `Allow` header listing the methods it does \
(RFC 9110 §15.5.6); a path that is not served is `404 not_found`.\n\n\
Unsafe `POST`s that create something accept an `Idempotency-Key` header.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        routes::health::healthz,
        routes::health::readyz,
        routes::health::metrics,
        openapi_json,
        routes::uploads::create::create_upload,
        routes::uploads::parts::get_upload,
        routes::uploads::parts::abort_upload,
        routes::uploads::parts::sign_parts,
        routes::uploads::complete::complete_upload,
        routes::ingests::create_ingest,
        routes::operations::list_operations,
        routes::operations::get_operation,
        routes::operations::cancel_operation,
        routes::operations::wait_operation,
        routes::operations::operation_events,
        routes::videos::list_videos,
        routes::videos::get_video,
        routes::playback_ids::create_playback_id,
        routes::playback_ids::delete_playback_id,
        routes::signing_keys::create_signing_key,
        routes::signing_keys::list_signing_keys,
        routes::signing_keys::get_signing_key,
        routes::signing_keys::delete_signing_key,
        routes::endpoints::create_endpoint,
        routes::endpoints::list_endpoints,
        routes::endpoints::get_endpoint,
        routes::endpoints::update_endpoint,
        routes::endpoints::delete_endpoint,
        routes::deliveries::rotate_secret,
        routes::deliveries::enable_endpoint,
        routes::deliveries::list_deliveries,
        routes::deliveries::retry_delivery,
        routes::events::list_events,
        routes::events::get_event,
    ),
    components(
        schemas(
            vid_core::Problem,
            vid_core::UploadId,
            vid_core::VideoId,
            vid_core::OperationId,
            vid_core::EventId,
            vid_core::EndpointId,
            vid_core::DeliveryId,
            vid_core::PlaybackId,
            vid_core::SigningKeyId,
            vid_core::signing::SigningKey,
            vid_core::signing::CreatedSigningKey,
            vid_core::playback::PlaybackPolicy,
            vid_core::playback::PlaybackIdView,
            vid_core::playback::CreatePlaybackId,
            vid_core::messages::Mp4Support,
            vid_core::ingest::CreateIngest,
            vid_core::ingest::DownloadProgress,
            vid_core::event::EventData,
            vid_core::event::VideoEventData,
            vid_core::event::EndpointEventData,
        ),
        responses(BadRequest, Unauthorized, NotFound, Conflict, PayloadTooLarge, UnsupportedMediaType, Unprocessable, TooManyRequests, Unavailable),
    ),
    modifiers(&SecurityAddon),
    tags(
        (name = "uploads", description = "Direct-to-storage S3 multipart uploads: the api never sees the bytes."),
        (name = "ingests", description = "Videos from a URL: the ingest worker downloads the source (SSRF-guarded) and it is transcoded like an upload."),
        (name = "operations", description = "Long-running transcodes: poll, wait, stream or cancel."),
        (name = "videos", description = "Sources, renditions and posters, with presigned download URLs; playback IDs with stable HLS and DASH URLs."),
        (name = "signing-keys", description = "RSA key pairs for signed playback: we keep the public half; your server signs playback tokens (RS256 JWTs) with the private half."),
        (name = "webhook-endpoints", description = "Where a tenant's events are delivered, and the delivery log."),
        (name = "events", description = "Every event recorded for the tenant, so receivers can catch up."),
        (name = "meta", description = "Health probes and this document."),
    ),
)]
pub struct ApiDoc;

/// Adds the bearer security scheme.
struct SecurityAddon;

impl Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SECURITY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("vidk_…")
                    .description(Some("An API key of the tenant: `Authorization: Bearer vidk_…`. Create one with `api create-tenant`."))
                    .build(),
            ),
        );
        components.add_security_scheme(
            CLIENT_TOKEN_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("vidu_…")
                    .description(Some(
                        "A client token (`POST /uploads`' `client_token`, `Authorization: Bearer vidu_…`) for a browser: only \
                         this upload's GET, DELETE, `parts:sign` and `complete`, and following its operation (GET, `:wait`, \
                         `/events`); until the upload's `expires_at`, or once completed until its operation is terminal plus \
                         `uploads.client_token_grace_seconds`. Another upload's or operation's id: `404`; any other route: `401`.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document as served, built once.
///
/// utoipa 5.5 writes the fields of a response's Link object in snake case
/// (`operation_id`); OpenAPI spells them `operationId`, `operationRef` and
/// `requestBody`, so they are renamed here.
pub fn document() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serialises");
        fix_links(&mut doc);
        doc
    })
}

fn fix_links(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(links)) = map.get_mut("links") {
                for link in links.values_mut().filter_map(serde_json::Value::as_object_mut) {
                    for (from, to) in [("operation_id", "operationId"), ("operation_ref", "operationRef"), ("request_body", "requestBody")]
                    {
                        if let Some(value) = link.remove(from) {
                            link.insert(to.to_owned(), value);
                        }
                    }
                }
            }
            map.values_mut().for_each(fix_links);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(fix_links),
        _ => {}
    }
}

/// The Content-Security-Policy of Swagger UI (`/docs/…`): its scripts, the
/// spec and every request it makes come from this origin only, so not even a
/// spec or a query parameter could load script from elsewhere (the console's
/// API key lives in this origin's sessionStorage). Swagger UI sets inline
/// styles and uses `data:` images and fonts; nothing may frame it.
pub const DOCS_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
     font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Middleware: [`DOCS_CSP`] on every answer under `/docs`. Errors: none of its own.
pub async fn docs_headers(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> actix_web::Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>> {
    let docs = req.path() == "/docs" || req.path().starts_with("/docs/");
    let mut res = next.call(req).await?;
    if docs {
        res.headers_mut()
            .insert(actix_web::http::header::CONTENT_SECURITY_POLICY, actix_web::http::header::HeaderValue::from_static(DOCS_CSP));
    }
    Ok(res)
}

/// Routes of this module: the document and its UI.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/openapi.json").route(web::get().to(openapi_json)))
        .service(
            web::resource("/docs")
                .route(web::get().to(|| async { HttpResponse::PermanentRedirect().insert_header(("Location", "/docs/")).finish() })),
        )
        .service(
            // No persist_authorization: Swagger UI would keep the API key in
            // this origin's localStorage across browser restarts (the console
            // keeps it per tab, in sessionStorage).
            utoipa_swagger_ui::SwaggerUi::new("/docs/{_:.*}").config(utoipa_swagger_ui::Config::new(["/openapi.json"])),
        );
}

/// This OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses((status = 200, description = "The OpenAPI 3.1 document.", content_type = "application/json", body = Object)),
)]
async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(document())
}
