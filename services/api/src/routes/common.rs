//! Helpers every route module shares: path ids, pagination, raw bodies,
//! display-safe text.
//! A leaf: it imports no route module, so route modules never import their parent.

use std::str::FromStr;

use actix_web::web;
use vid_core::ids::IdError;

use crate::error::{codes, ApiError};

/// Parses a path id; a malformed id is `404 not_found` (it cannot name anything),
/// so ids of other kinds and of other tenants look alike.
pub fn parse_id<T: FromStr<Err = IdError>>(raw: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::NotFound("resource"))
}

/// The page size of a list for its `limit` parameter: 20 when absent,
/// otherwise clamped to 1–100.
///
/// Each list has its own query struct (`VideosQuery`, `OperationsQuery`,
/// `EventsQuery`, …) with `#[serde(deny_unknown_fields)]`, so a parameter the
/// list does not take is `400 invalid_query` naming it, never silently ignored.
pub fn page_size(limit: Option<i64>) -> i64 {
    limit.unwrap_or(20).clamp(1, 100)
}

/// The list envelope `{data: [...], next_cursor}`, defined in `vid-core`.
pub use vid_core::Page;

/// Cuts `limit + 1` rows (newest first) into a page of at most `limit` and
/// its cursor: the id of the last item kept, when a row was left over.
pub fn page<R, T>(mut rows: Vec<R>, limit: i64, id: impl Fn(&R) -> String, map: impl Fn(R) -> T) -> Page<T> {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if more { rows.last().map(&id) } else { None };
    Page { data: rows.into_iter().map(map).collect(), next_cursor }
}

/// The limit of every JSON body of the api, in bytes (`413 body_too_large` past it).
pub const MAX_JSON_BODY_BYTES: usize = 64 * 1024;

/// Reads a whole request body of at most `limit` bytes, for handlers that
/// look at the raw bytes before parsing them (an empty body means defaults).
///
/// Errors: `413 body_too_large` past `limit` (the api's JSON limit,
/// [`MAX_JSON_BODY_BYTES`]), and `400 invalid_json` if reading the body fails.
pub async fn read_body(mut payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    use futures::StreamExt;
    let mut bytes = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::new(codes::INVALID_JSON, format!("reading the body failed: {e}")))?;
        if bytes.len() + chunk.len() > limit {
            return Err(ApiError::new(codes::BODY_TOO_LARGE, format!("the body is larger than {limit} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.freeze())
}

/// Whether `c` may not appear in text a tenant gives for display (filenames,
/// endpoint descriptions): Unicode general category Cc (control), Cf (format:
/// the bidirectional overrides and isolates such as U+202E that make
/// `exe.mp4` display as `mp4.exe`, zero-width characters, U+FEFF), Zl or Zp
/// (line and paragraph separators).
pub fn unsafe_to_display(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    matches!(
        c.general_category(),
        GeneralCategory::Control | GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
    )
}
