//! RFC 9457 problem details.
//!
//! Every error the API returns, and every `error` of a failed operation, is a
//! [`Problem`]: `{"type","title","status","detail","code", …extensions}` served
//! as `application/problem+json`. `code` is our stable, machine-readable
//! identifier (`upload_incomplete`, `unsupported_media`, …): once published a
//! code never changes meaning; clients branch on it, never on `title` or
//! `detail`, which are for people.

use serde::{Deserialize, Serialize};

/// The media type of a problem-details body (RFC 9457 §3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem-details object with our `code` extension.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// A URI reference naming the problem type (RFC 9457 §3.1.1). Ours are
    /// relative: `/problems/<code>`.
    #[serde(rename = "type")]
    pub type_: String,
    /// A short, human-readable summary of the problem type; the same for every occurrence.
    pub title: String,
    /// The HTTP status code (for an operation's `error`, the status the failure would map to).
    pub status: u16,
    /// A human-readable explanation of this occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Our stable machine-readable error code, e.g. `upload_incomplete`.
    pub code: String,
    /// A URI reference identifying this occurrence (RFC 9457 §3.1.5), when useful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Problem-specific extension members (RFC 9457 §3.2), e.g. `missing_parts`.
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    /// A problem with `type` derived from `code` (`/problems/<code>`).
    pub fn new(status: u16, code: impl Into<String>, title: impl Into<String>) -> Self {
        let code = code.into();
        Self {
            type_: format!("/problems/{code}"),
            title: title.into(),
            status,
            detail: None,
            code,
            instance: None,
            extensions: serde_json::Map::new(),
        }
    }

    /// Sets `detail`, the explanation of this occurrence.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds an extension member. Panics in debug builds if `key` shadows a standard member.
    pub fn with_extension(mut self, key: &str, value: impl Serialize) -> Self {
        debug_assert!(!["type", "title", "status", "detail", "code", "instance"].contains(&key));
        self.extensions.insert(key.to_owned(), serde_json::to_value(value).unwrap_or(serde_json::Value::Null));
        self
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.title, self.code, self.detail.as_deref().unwrap_or(""))
    }
}

impl std::error::Error for Problem {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_as_rfc9457_with_code_and_extensions() {
        let p = Problem::new(409, "upload_incomplete", "Upload incomplete")
            .with_detail("parts 2 and 5 are missing")
            .with_extension("missing_parts", [2, 5]);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["type"], "/problems/upload_incomplete");
        assert_eq!(v["status"], 409);
        assert_eq!(v["code"], "upload_incomplete");
        assert_eq!(v["missing_parts"], serde_json::json!([2, 5]));
        assert!(v.get("instance").is_none());
        let back: Problem = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }
}
