//! The registry of stable error codes: every `code` the api answers with, its
//! HTTP status, its title and one line of meaning. Handlers name codes from
//! here ([`ApiError::new`](crate::error::ApiError::new)); the OpenAPI document
//! lists them per status from here ([`crate::openapi`]).
//!
//! A code is stable: once published it keeps its meaning and status. Branch
//! on `code`, never on `title` or `detail` (RFC 9457 §3.1: `title` is for
//! people; `code` is this api's extension member).

/// One registered code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// The machine-readable code, e.g. `upload_aborted`; also the last segment of the problem `type`.
    pub code: &'static str,
    /// The HTTP status of answers with this code (for operation errors: the problem's `status`).
    pub status: u16,
    /// The problem's `title`.
    pub title: &'static str,
    /// One line of meaning, for the OpenAPI document and people.
    pub meaning: &'static str,
}

macro_rules! registry {
    ($list:ident: $( $name:ident = $code:literal, $status:literal, $title:literal, $meaning:literal; )+) => {
        $(
            #[doc = concat!("`", $code, "` (", stringify!($status), "): ", $meaning)]
            pub const $name: Code = Code { code: $code, status: $status, title: $title, meaning: $meaning };
        )+
        #[doc = concat!("Every code of [`", stringify!($list), "`], in registry order.")]
        pub const $list: &[Code] = &[$($name),+];
    };
}

registry! { ANSWERS:
    INVALID_JSON = "invalid_json", 400, "Bad request", "The body is not JSON, has an unknown field or a wrong type, or could not be read.";
    INVALID_QUERY = "invalid_query", 400, "Bad request", "A query parameter is malformed or not taken by this list (the detail names it).";
    INVALID_STATUS = "invalid_status", 400, "Bad request", "The `status` filter names no status of this list.";
    INVALID_EVENT_TYPE = "invalid_event_type", 400, "Bad request", "The `type`/`event_type` filter names no event type.";
    INVALID_CURSOR = "invalid_cursor", 400, "Bad request", "The `cursor` is not an id of this list.";
    INVALID_PART_NUMBERS = "invalid_part_numbers", 400, "Bad request", "`parts:sign` needs a non-empty list of part numbers from 1 to the part count.";
    INVALID_PARTS = "invalid_parts", 400, "Bad request", "A `complete` body's `parts` does not list every part 1..N exactly once.";
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key", 400, "Bad request", "`Idempotency-Key` is not 1–255 visible ASCII characters.";
    UNAUTHORIZED = "unauthorized", 401, "Unauthorized", "No API key, or an unknown or revoked one.";
    NOT_FOUND = "not_found", 404, "Not found", "The resource or route does not exist, belongs to another tenant, or the id is malformed.";
    METHOD_NOT_ALLOWED = "method_not_allowed", 405, "Method not allowed", "The path does not serve this method; `Allow` lists those it does.";
    UPLOAD_ABORTED = "upload_aborted", 409, "Conflict", "The upload was aborted; start a new one.";
    UPLOAD_EXPIRED = "upload_expired", 409, "Conflict", "The upload passed its `expires_at` (or storage dropped its parts); start a new one.";
    UPLOAD_COMPLETED = "upload_completed", 409, "Conflict", "The upload is completed (it is a video) and can no longer be changed or aborted.";
    UPLOAD_COMPLETING = "upload_completing", 409, "Conflict", "A `complete` of this upload is running; retry once it answered.";
    UPLOAD_INCOMPLETE = "upload_incomplete", 409, "Conflict", "Parts are missing (`missing_parts`).";
    PART_SIZE_MISMATCH = "part_size_mismatch", 409, "Conflict", "Stored parts have the wrong size (`parts`); re-send them.";
    ETAG_MISMATCH = "etag_mismatch", 409, "Conflict", "A listed ETag differs from storage's, or a part changed during `complete` (`part_number`).";
    SIZE_MISMATCH = "size_mismatch", 409, "Conflict", "The assembled object's size differs from the declared size (`declared_size`, `stored_size`).";
    OPERATION_TERMINAL = "operation_terminal", 409, "Conflict", "The operation is already terminal (`operation_status`).";
    IDEMPOTENCY_KEY_IN_USE = "idempotency_key_in_use", 409, "Conflict", "A request with this `Idempotency-Key` is still running; retry later.";
    VIDEO_NOT_PLAYABLE = "video_not_playable", 409, "Conflict", "The video failed or was cancelled (`video_status`); it has nothing to play, so it takes no playback ID.";
    ENDPOINT_DISABLED = "endpoint_disabled", 409, "Conflict", "The webhook endpoint is disabled; enable it first.";
    BODY_TOO_LARGE = "body_too_large", 413, "Body too large", "JSON bodies are limited to 64 KiB.";
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", 415, "Unsupported media type", "Send the body as `application/json`.";
    INVALID_SIZE = "invalid_size", 422, "Request refused", "`size_bytes` is 0.";
    INVALID_POSTER_TIME = "invalid_poster_time", 422, "Request refused", "`poster_time` is negative (seconds from the start, ≥ 0).";
    INVALID_CORS_ORIGIN = "invalid_cors_origin", 422, "Request refused", "`cors_origin` is not an origin (`scheme://host[:port]`, http or https, nothing after it).";
    FILE_TOO_LARGE = "file_too_large", 422, "Request refused", "`size_bytes` is above `uploads.max_size_bytes`.";
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type", 422, "Request refused", "`content_type` is not on the allow-list.";
    INVALID_FILENAME = "invalid_filename", 422, "Request refused", "`filename` is over 255 bytes or has a control, format or line-separator character.";
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused", 422, "Request refused", "This `Idempotency-Key` was used with a different request body.";
    INVALID_DESCRIPTION = "invalid_description", 422, "Request refused", "An endpoint `description` is over 1024 bytes or has a character unsafe to display.";
    INVALID_EVENT_TYPES = "invalid_event_types", 422, "Request refused", "An endpoint's `event_types` is an empty list.";
    INVALID_URL = "invalid_url", 422, "Request refused", "The webhook URL does not parse (or has whitespace or control characters).";
    SCHEME_NOT_ALLOWED = "scheme_not_allowed", 422, "Request refused", "The webhook URL's scheme is not http(s).";
    HTTPS_REQUIRED = "https_required", 422, "Request refused", "The webhook URL must use https.";
    PORT_NOT_ALLOWED = "port_not_allowed", 422, "Request refused", "The webhook URL's port is not an allowed port.";
    USERINFO_NOT_ALLOWED = "userinfo_not_allowed", 422, "Request refused", "The webhook URL carries a user name or password.";
    FRAGMENT_NOT_ALLOWED = "fragment_not_allowed", 422, "Request refused", "The webhook URL carries a `#fragment`.";
    MISSING_HOST = "missing_host", 422, "Request refused", "The webhook URL has no host.";
    HOST_NOT_ALLOWED = "host_not_allowed", 422, "Request refused", "The webhook URL's host name is refused (e.g. `localhost`).";
    BLOCKED_ADDRESS = "blocked_address", 422, "Request refused", "The webhook or ingest source URL's host is or resolves to an address that is not globally routable.";
    DNS_FAILED = "dns_failed", 422, "Request refused", "The webhook URL's host name did not resolve.";
    NO_ADDRESSES = "no_addresses", 422, "Request refused", "The webhook URL's host name resolved to no address.";
    TOO_MANY_UPLOADS = "too_many_uploads", 429, "Too many uploads", "The tenant's cap on uploads in flight is reached (`limit`, `in_flight`); `Retry-After: 30`.";
    TOO_MANY_WATCHERS = "too_many_watchers", 429, "Too many watchers", "The tenant's (or the client token's) open waits and event streams are at their bound; `Retry-After: 5`.";
    INTERNAL = "internal", 500, "Internal error", "An unexpected error (a bug, or a corrupt stored value); logged, never detailed.";
    UNAVAILABLE = "unavailable", 503, "Service unavailable", "A dependency (database, storage, broker) is down; retry later.";
}

registry! { OPERATION_ERRORS:
    CANCELLED = "cancelled", 409, "Operation cancelled", "The operation was cancelled at the caller's request (`POST /operations/{id}:cancel`).";
    WORKER_LOST = "worker_lost", 500, "Worker lost", "The transcoder stopped reporting for longer than `operations.heartbeat_timeout_seconds`.";
    TRANSCODE_RETRIES_EXHAUSTED = "transcode_retries_exhausted", 500, "Transcode failed repeatedly", "The job was handed to a worker the delivery limit's number of times without an outcome.";
    JOB_LOST = "job_lost", 500, "Job lost", "No transcoder took the job after `operations.max_redrives` re-drives and `operations.job_lost_after_seconds`; for an ingest, its source was not downloaded within `operations.ingest_lost_after_seconds`.";
    SOURCE_UNREACHABLE = "source_unreachable", 502, "Source unreachable", "An ingest's `source_url` did not resolve or accept a connection (or its TLS handshake failed).";
    SOURCE_HTTP_ERROR = "source_http_error", 502, "Source answered an error", "An ingest's source answered a non-2xx status (`source_status`), or broken HTTP.";
    SOURCE_TIMEOUT = "source_timeout", 504, "Source timed out", "An ingest's source stalled past `ingest_worker.idle_timeout_ms`, or the download exceeded its total timeout.";
    SOURCE_TOO_LARGE = "source_too_large", 422, "Source too large", "An ingest's body grew past `max_size_bytes` while streaming (whatever `Content-Length` said).";
    SOURCE_EMPTY = "source_empty", 422, "Source empty", "An ingest's source answered an empty body.";
    TOO_MANY_REDIRECTS = "too_many_redirects", 502, "Too many redirects", "An ingest's source redirected more than 5 times (or to a URL that is not http(s)).";
    INGEST_STORAGE_FAILED = "ingest_storage_failed", 503, "Storage failed", "The ingest worker could not write the source to storage.";
}

/// The registered code of an answer, by its spelling.
pub fn lookup(code: &str) -> Option<Code> {
    ANSWERS.iter().copied().find(|c| c.code == code)
}

/// The codes of answers with `status`, in registry order.
pub fn with_status(status: u16) -> impl Iterator<Item = Code> {
    ANSWERS.iter().copied().filter(move |c| c.status == status)
}

impl Code {
    /// A problem of this code (`type`, `title`, `status`, `code`) without `detail`.
    pub fn problem(self) -> vid_core::Problem {
        vid_core::Problem::new(self.status, self.code, self.title)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_and_statuses_are_errors() {
        let mut seen = std::collections::HashSet::new();
        for c in ANSWERS.iter().chain(OPERATION_ERRORS) {
            assert!(seen.insert(c.code), "{} registered twice", c.code);
            assert!(c.code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{}", c.code);
            assert!((400..600).contains(&c.status), "{}", c.code);
            assert!(!c.meaning.is_empty() && !c.title.is_empty());
        }
    }

    /// The SSRF guard's codes reach clients as `422` answers: each is registered.
    #[test]
    fn every_url_guard_code_is_registered() {
        for code in [
            "invalid_url",
            "scheme_not_allowed",
            "https_required",
            "port_not_allowed",
            "userinfo_not_allowed",
            "fragment_not_allowed",
            "missing_host",
            "host_not_allowed",
            "blocked_address",
            "dns_failed",
            "no_addresses",
        ] {
            assert_eq!(lookup(code).map(|c| c.status), Some(422), "{code}");
        }
    }

    /// Every code still written as a literal in the api's source (the
    /// string shorthands `bad_request("…")`, `unprocessable("…")`,
    /// `conflict("…")`) is registered, so a new inline code fails here.
    #[test]
    fn every_code_in_the_source_is_registered() {
        let mut files = Vec::new();
        collect(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            for code in literal_codes(&code.join("\n")) {
                assert!(lookup(&code).is_some(), "{}: `{code}` is not in error/codes.rs", file.display());
            }
        }
    }

    /// The string literal right after each `bad_request(`, `unprocessable(` or `conflict(`.
    fn literal_codes(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for name in ["bad_request(", "unprocessable(", "conflict("] {
            for (i, _) in text.match_indices(name) {
                if let Some(lit) = text[i + name.len()..].trim_start().strip_prefix('"') {
                    out.push(lit.chars().take_while(|c| *c != '"').collect());
                }
            }
        }
        out
    }

    fn collect(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                collect(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
}
