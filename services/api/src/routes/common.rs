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

/// A JSON request body that must be a JSON **object**: the api's one body
/// extractor (use it instead of `web::Json` on every route). serde reads a
/// struct from a JSON array too (its sequence visitor fills the fields by
/// position), so `["https://…"]` would pass as `{"source_url": "https://…"}`;
/// this refuses every non-object body (array, string, number, `true`,
/// `null`) with `400 invalid_json`.
///
/// The body is read with the app's `JsonConfig` (`lib.rs`): `415
/// unsupported_media_type` for another media type, `413 body_too_large`
/// past [`MAX_JSON_BODY_BYTES`], `400 invalid_json` for malformed JSON;
/// then the object is deserialized into `T` from the text (unknown or
/// duplicate fields, wrong types: `400 invalid_json` naming the error,
/// [`object_from_str`]).
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T> Json<T> {
    /// The deserialized body.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: serde::de::DeserializeOwned + 'static> actix_web::FromRequest for Json<T> {
    type Error = actix_web::Error;
    type Future = futures::future::LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &actix_web::HttpRequest, payload: &mut actix_web::dev::Payload) -> Self::Future {
        // The raw text, not a `Value`: a `Value` keeps the last of two equal
        // keys, where the derived structs refuse a duplicate field.
        let raw = web::Json::<Box<serde_json::value::RawValue>>::from_request(req, payload);
        Box::pin(async move {
            let web::Json(raw) = raw.await?;
            Ok(Json(object_from_str(raw.get())?))
        })
    }
}

/// Deserializes `T` from JSON text that must be one object, straight from
/// the text, so a duplicate key is refused as serde's derived structs do
/// (`duplicate field`), never resolved to the last one as a `Value` would.
/// Errors: `400 invalid_json` ("the body must be a JSON object, not an
/// array", or serde's error: a syntax error, an unknown or duplicate field,
/// a wrong type, a missing field).
pub fn object_from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ApiError> {
    if !text.trim_start().starts_with('{') {
        let kind = serde_json::from_str::<serde_json::Value>(text).map(|v| json_kind(&v)).unwrap_or("valid JSON");
        return Err(ApiError::new(codes::INVALID_JSON, format!("the body must be a JSON object, not {kind}")));
    }
    serde_json::from_str(text).map_err(|e| ApiError::new(codes::INVALID_JSON, e.to_string()))
}

/// `an array`, `a string`, … for the detail of a refused body.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
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
