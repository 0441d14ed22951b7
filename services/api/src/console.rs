//! The web console at `/console/`: a small, dependency-free single-page app
//! (hand-written HTML, CSS and ES modules in `services/api/console/`) that
//! talks to this same api with the API key the user pastes in.
//!
//! The assets are embedded in the binary with `include_str!`, so nothing is
//! built or downloaded at run time. That includes the one third-party file,
//! hls.js (`console/vendor/hls.min.mjs`: `dist/hls.min.mjs` of the npm
//! package pinned in `console/vendor/package-lock.json`, committed byte for
//! byte; `scripts/console-test.sh` checks it against the package).
//!
//! Every console response carries a strict Content-Security-Policy: scripts
//! and styles only from this origin (no inline script or style), API calls
//! only to this origin and the playback service (`api.playback_base_url`,
//! whose playlists and segments hls.js fetches), images only from this
//! origin and the storage endpoint the presigned poster URLs name
//! (`s3.public_endpoint`, else `s3.endpoint`), media from those two, the
//! playback service (native HLS playback) and `blob:` (the MediaSource
//! object URL hls.js gives the `<video>`). No worker: hls.js runs with
//! `enableWorker: false`, so `worker-src` stays `'none'`.
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
    asset!("player.js", JS),
    asset!("upload.js", JS),
    // The upload library, served from its own source (clients/js, issue 21).
    Asset { name: "vid-upload.js", content_type: JS, body: include_str!("../../../clients/js/src/index.js") },
    asset!("vendor/hls.min.mjs", JS),
    asset!("vendor/LICENSE.hls.js", "text/plain; charset=utf-8"),
];

/// Files of `console/` that are not served: the npm manifest and lock that
/// pin hls.js (read by `scripts/console-test.sh`, not by browsers).
#[cfg(test)]
const NOT_SERVED: &[&str] = &["vendor/package.json", "vendor/package-lock.json"];

/// Routes of the console: `/console` redirects to `/console/`, which serves
/// the page; `/console/{file}` serves its scripts, style and icon, and
/// `/console/vendor/{file}` hls.js and its licence.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/console")
            .route(web::get().to(|| async { HttpResponse::PermanentRedirect().insert_header((header::LOCATION, "/console/")).finish() })),
    )
    .service(web::resource("/console/").route(web::get().to(index)))
    .service(web::resource("/console/vendor/{file}").route(web::get().to(vendor_file)))
    .service(web::resource("/console/{file}").route(web::get().to(file)));
}

async fn index(state: web::Data<AppState>) -> HttpResponse {
    serve(&state, "index.html")
}

async fn file(state: web::Data<AppState>, path: web::Path<String>) -> HttpResponse {
    serve(&state, &path)
}

async fn vendor_file(state: web::Data<AppState>, path: web::Path<String>) -> HttpResponse {
    serve(&state, &format!("vendor/{path}"))
}

fn serve(state: &AppState, name: &str) -> HttpResponse {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return ApiError::new(codes::NOT_FOUND, format!("no console file `{name}`")).error_response();
    };
    let storage = storage_origin(state.settings.s3.public_endpoint.as_deref().unwrap_or(&state.settings.s3.endpoint));
    let playback = storage_origin(&state.settings.api.playback_base_url);
    HttpResponse::Ok()
        .content_type(asset.content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, content_security_policy(storage.as_deref(), playback.as_deref())))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        // Small files, embedded in the binary: revalidate so an upgrade shows at once.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(asset.body)
}

/// The console's Content-Security-Policy. `storage` is the origin of presigned
/// media URLs (poster, MP4 downloads), `playback` the playback service's.
pub fn content_security_policy(storage: Option<&str>, playback: Option<&str>) -> String {
    let sources = |fixed: &str, origins: &[Option<&str>]| {
        let mut list = fixed.to_owned();
        for origin in origins.iter().flatten() {
            if !list.split(' ').any(|s| s == *origin) {
                list.push(' ');
                list.push_str(origin);
            }
        }
        list
    };
    // hls.js fetches playlists and segments with XHR (connect-src) and plays
    // them through a MediaSource whose object URL is a `blob:` (media-src);
    // native HLS playback loads the playlist URL straight into <video>
    // (media-src). Nothing else of the playback origin is allowed.
    // The upload page PUTs parts to presigned storage URLs (connect-src).
    let connect = sources("'self'", &[playback, storage]);
    // Images: the poster from storage, the storyboard sheet (issue 20) from the playback origin.
    let img = sources("'self'", &[storage, playback]);
    let media = sources("'self'", &[storage, playback]);
    // Trusted Types with no policy: no string can reach an HTML or script sink
    // (innerHTML, document.write, eval…), so even a future careless line
    // cannot turn api data into markup. The console only builds nodes. It
    // also keeps workers out (hls.js would build its worker from a blob:
    // URL; `default-src 'none'` refuses it anyway): hls.js runs on the page.
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src {connect}; \
         img-src {img}; media-src {media} blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; \
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
        let csp = content_security_policy(Some("http://127.0.0.1:3900"), Some("http://127.0.0.1:8090"));
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
        assert!(csp.contains("require-trusted-types-for 'script'; trusted-types 'none'"), "{csp}");
        assert!(!csp.contains("worker-src"), "workers stay under default-src 'none': {csp}");
    }

    #[test]
    fn the_policy_opens_only_what_playback_needs() {
        let csp = content_security_policy(Some("http://127.0.0.1:3900"), Some("https://stream.example.com"));
        // hls.js: XHR to the playback service, MediaSource through a blob: URL.
        assert!(csp.contains("connect-src 'self' https://stream.example.com http://127.0.0.1:3900;"), "{csp}");
        assert!(csp.contains("media-src 'self' http://127.0.0.1:3900 https://stream.example.com blob:;"), "{csp}");
        // Images: the poster from storage, the storyboard from playback; blob: nowhere but media-src.
        assert!(csp.contains("img-src 'self' http://127.0.0.1:3900 https://stream.example.com;"), "{csp}");
        assert_eq!(csp.matches("blob:").count(), 1, "{csp}");
        // No playback origin: nothing but this origin to connect to.
        let csp = content_security_policy(None, None);
        assert!(csp.contains("connect-src 'self';") && csp.contains("media-src 'self' blob:;"), "{csp}");
        // The same origin twice is listed once.
        let csp = content_security_policy(Some("http://127.0.0.1:3900"), Some("http://127.0.0.1:3900"));
        assert!(csp.contains("media-src 'self' http://127.0.0.1:3900 blob:;"), "{csp}");
    }

    #[test]
    fn every_file_of_the_console_directory_is_embedded_once() {
        fn walk(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
                if entry.file_type().unwrap().is_dir() {
                    walk(&entry.path(), &format!("{name}/"), out);
                } else if !NOT_SERVED.contains(&name.as_str()) {
                    out.push(name);
                }
            }
        }
        let mut on_disk = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("console"), "", &mut on_disk);
        on_disk.sort_unstable();
        // The upload library is embedded from its own source, outside console/.
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.name.to_owned()).filter(|n| n != "vid-upload.js").collect();
        embedded.sort_unstable();
        assert_eq!(embedded, on_disk, "add new console files to ASSETS (and nothing twice)");
    }

    #[test]
    fn vendored_files_are_served_under_vendor_only() {
        // `/console/vendor/{file}` looks up `vendor/{file}`; `/console/{file}`
        // never matches a name with a `/`, so the two cannot shadow each other.
        assert!(ASSETS.iter().filter(|a| a.name.contains('/')).all(|a| a.name.starts_with("vendor/") && a.name.matches('/').count() == 1));
    }
}
