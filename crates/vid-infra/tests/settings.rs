//! Settings: files then `VID__…` variables; secrets stay strings and are redacted.

use serde::Deserialize;
use vid_infra::settings::{load_from, S3Settings};
use vid_infra::ExposeSecret;

#[derive(Debug, Deserialize)]
struct Probe {
    s3: S3Settings,
    transcoder: Transcoder,
    uploads: Uploads,
}

#[derive(Debug, Deserialize)]
struct Transcoder {
    concurrency: u32,
}

#[derive(Debug, Deserialize)]
struct Uploads {
    allowed_content_types: Vec<String>,
}

#[test]
fn environment_overrides_files_and_secrets_are_never_printed() {
    let dir = format!("{}/../../config", env!("CARGO_MANIFEST_DIR"));
    // This is the only test in this binary, so changing the environment is safe.
    std::env::set_var("VID__TRANSCODER__CONCURRENCY", "3");
    std::env::set_var("VID__S3__SECRET_ACCESS_KEY", "0123456789");
    std::env::set_var("VID__UPLOADS__ALLOWED_CONTENT_TYPES", "video/mp4,video/webm");
    let s: Probe = load_from(&dir, "development").unwrap();
    assert_eq!(s.transcoder.concurrency, 3);
    // An all-digit secret stays the exact string (no number parsing of env values).
    assert_eq!(s.s3.secret_access_key.expose_secret(), "0123456789");
    assert_eq!(s.uploads.allowed_content_types, vec!["video/mp4", "video/webm"]);
    let printed = format!("{s:?}");
    assert!(!printed.contains("0123456789"), "secret leaked in {printed}");
    // Files alone: the defaults.
    std::env::remove_var("VID__TRANSCODER__CONCURRENCY");
    let s: Probe = load_from(&dir, "development").unwrap();
    assert_eq!(s.transcoder.concurrency, 1);
}
