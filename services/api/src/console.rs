//! The web console at `/console/`: a small, dependency-free single-page app
//! (hand-written HTML, CSS and ES modules in `services/api/console/`) that
//! talks to this same api with the API key the user pastes in.
//!
//! The assets are embedded in the binary with `include_str!`, so nothing is
//! built or downloaded at run time. Every console response carries a strict
//! Content-Security-Policy: scripts and styles only from this origin (no
//! inline script or style), API calls only to this origin, and media (the
//! presigned rendition and poster URLs) only from this origin and the
//! storage endpoint the presigned URLs name (`s3.public_endpoint`, else
//! `s3.endpoint`).
//!
//! These are not API routes: `tests/openapi.rs` lists them as served on
//! purpose without being in `/openapi.json`, like `/docs`.

use actix_web::http::header;
use actix_web::ResponseError;
use actix_web::{web, HttpResponse};

use crate::error::{codes, ApiError};
use crate::state::AppState;

/// One embedded file: its name under `/console/`, media type and contents.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset { name: $name, content_type: $type, body: include_str!(concat!("../console/", $name)) }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the console. `index.html` is served at `/console/`.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("icon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("endpoints.js", JS),
    asset!("endpoint.js", JS),
    asset!("events.js", JS),
    asset!("operations.js", JS),
    asset!("video.js", JS),
];

/// Routes of the console: `/console` redirects to `/console/`, which serves
/// the page; `/console/{file}` serves its scripts, style and icon.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/console")
            .route(web::get().to(|| async { HttpResponse::PermanentRedirect().insert_header((header::LOCATION, "/console/")).finish() })),
    )
    .service(web::resource("/console/").route(web::get().to(index)))
    .service(web::resource("/console/{file}").route(web::get().to(file)));
}

async fn index(state: web::Data<AppState>) -> HttpResponse {
    serve(&state, "index.html")
}

async fn file(state: web::Data<AppState>, path: web::Path<String>) -> HttpResponse {
    serve(&state, &path)
}

fn serve(state: &AppState, name: &str) -> HttpResponse {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return ApiError::new(codes::NOT_FOUND, format!("no console file `{name}`")).error_response();
    };
    let storage = storage_origin(state.settings.s3.public_endpoint.as_deref().unwrap_or(&state.settings.s3.endpoint));
    HttpResponse::Ok()
        .content_type(asset.content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, content_security_policy(storage.as_deref())))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Small files, embedded in the binary: revalidate so an upgrade shows at once.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(asset.body)
}

/// The console's Content-Security-Policy; `storage` is the origin of presigned media URLs.
pub fn content_security_policy(storage: Option<&str>) -> String {
    let media = match storage {
        Some(origin) => format!("'self' {origin}"),
        None => "'self'".to_owned(),
    };
    // Trusted Types with no policy: no string can reach an HTML or script sink
    // (innerHTML, document.write, eval…), so even a future careless line
    // cannot turn api data into markup. The console only builds nodes.
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src {media}; media-src {media}; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; \
         require-trusted-types-for 'script'; trusted-types 'none'"
    )
}

/// `scheme://host[:port]` of a URL, if it is an http(s) URL with a plain host
/// (nothing that could smuggle another directive into the header).
pub fn storage_origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let host = rest.split(['/', '?', '#']).next()?;
    let valid = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    valid.then(|| format!("{scheme}://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_origin_keeps_scheme_host_and_port_only() {
        assert_eq!(storage_origin("http://127.0.0.1:3900").as_deref(), Some("http://127.0.0.1:3900"));
        assert_eq!(storage_origin("https://s3.example.com/bucket?x=1").as_deref(), Some("https://s3.example.com"));
        assert_eq!(storage_origin("http://[::1]:3900/").as_deref(), Some("http://[::1]:3900"));
        assert_eq!(storage_origin("http://evil; script-src *"), None);
        assert_eq!(storage_origin("ftp://host"), None);
        assert_eq!(storage_origin("not a url"), None);
    }

    #[test]
    fn the_policy_allows_no_inline_script() {
        let csp = content_security_policy(Some("http://127.0.0.1:3900"));
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert!(csp.contains("media-src 'self' http://127.0.0.1:3900"), "{csp}");
        assert!(csp.contains("require-trusted-types-for 'script'; trusted-types 'none'"), "{csp}");
    }

    #[test]
    fn every_file_of_the_console_directory_is_embedded_once() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
        let mut on_disk: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        on_disk.sort_unstable();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.name.to_owned()).collect();
        embedded.sort_unstable();
        assert_eq!(embedded, on_disk, "add new console files to ASSETS (and nothing twice)");
    }
}
