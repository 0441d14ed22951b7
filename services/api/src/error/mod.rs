//! The api's one error path: [`ApiError`] and its mapping to RFC 9457
//! problem details (`application/problem+json`), headers included.
//!
//! Every answer that is not a success goes through here: handler errors,
//! the framework's extractor errors (JSON, path, query; see `lib.rs`), the
//! `405` middleware ([`methods::method_not_allowed`]) and the `429`s with
//! `Retry-After`. Codes and their statuses come from [`codes`], the registry
//! the OpenAPI document reads too.

pub mod codes;
pub mod methods;
pub mod responses;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use vid_core::problem::{Problem, PROBLEM_JSON};

pub use codes::Code;

/// Every error a handler can return. Each maps to one registered code and its status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401 `unauthorized`: no or unknown API key; answered with `WWW-Authenticate: Bearer`.
    #[error("a valid API key is required")]
    Unauthorized,
    /// 404 `not_found`: the resource (named here, e.g. `upload`) does not exist
    /// or belongs to another tenant.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// Any registered code with its detail, extension members and headers.
    #[error("{}", .0.detail)]
    Refused(Box<Refusal>),
    /// 503 `unavailable`: a dependency (storage, database) is down; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal`: a bug or an unexpected failure (a corrupt stored value
    /// included); details go to the log only.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// A refusal with a registered code: what [`ApiError::new`] builds.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The registered code; its status is the answer's.
    pub code: Code,
    /// What is wrong, for people (`detail`).
    pub detail: String,
    /// Extension members of the problem body, in order.
    pub extensions: Vec<(&'static str, serde_json::Value)>,
    /// `Retry-After`, in seconds (RFC 9110 §10.2.3).
    pub retry_after: Option<u64>,
    /// `Allow`: the methods the path serves (RFC 9110 §10.2.1).
    pub allow: Option<String>,
}

impl ApiError {
    /// An answer with a registered `code` (its status and title) and `detail`.
    pub fn new(code: Code, detail: impl Into<String>) -> Self {
        Self::Refused(Box::new(Refusal { code, detail: detail.into(), extensions: Vec::new(), retry_after: None, allow: None }))
    }

    /// Adds an extension member to the problem body (only to [`ApiError::Refused`]; others are unchanged).
    pub fn with_extension(mut self, name: &'static str, value: impl Into<serde_json::Value>) -> Self {
        if let Self::Refused(r) = &mut self {
            r.extensions.push((name, value.into()));
        }
        self
    }

    /// Sets `Retry-After` to `seconds` (only on [`ApiError::Refused`]).
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        if let Self::Refused(r) = &mut self {
            r.retry_after = Some(seconds);
        }
        self
    }

    /// Sets `Allow` to `methods`, e.g. `GET, HEAD` (only on [`ApiError::Refused`]).
    pub fn with_allow(mut self, methods: impl Into<String>) -> Self {
        if let Self::Refused(r) = &mut self {
            r.allow = Some(methods.into());
        }
        self
    }

    /// `400` with a registered code given by its spelling (see [`ApiError::by_name`]).
    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::by_name(code, 400, detail)
    }

    /// `422` with a registered code given by its spelling (see [`ApiError::by_name`]).
    pub fn unprocessable(code: &'static str, detail: impl Into<String>) -> Self {
        Self::by_name(code, 422, detail)
    }

    /// `409` with a registered code given by its spelling (see [`ApiError::by_name`]).
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Self::by_name(code, 409, detail)
    }

    /// An answer naming its code by spelling, e.g. a code another crate
    /// returns (the SSRF guard's `UrlError::code`). The registry's status
    /// and title apply; an unregistered code (a bug: `codes.rs` has a test
    /// that finds literal ones) is logged and answered with `status`.
    pub fn by_name(code: &'static str, status: u16, detail: impl Into<String>) -> Self {
        let registered = codes::lookup(code).unwrap_or_else(|| {
            tracing::error!(code, "an error code missing from error/codes.rs");
            let title = codes::with_status(status).next().map_or("Error", |c| c.title);
            Code { code, status, title, meaning: "" }
        });
        Self::new(registered, detail)
    }

    /// The registered code of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::Unauthorized => codes::UNAUTHORIZED,
            Self::NotFound(_) => codes::NOT_FOUND,
            Self::Refused(r) => r.code,
            Self::Unavailable(_) => codes::UNAVAILABLE,
            Self::Internal(_) => codes::INTERNAL,
        }
    }

    /// The problem-details body for this error.
    pub fn problem(&self) -> Problem {
        let problem = self.code().problem();
        match self {
            Self::Unauthorized => problem.with_detail("send `Authorization: Bearer <API key>`"),
            Self::NotFound(what) => problem.with_detail(format!("{what} not found")),
            Self::Refused(r) => {
                let mut p = problem.with_detail(r.detail.clone());
                for (k, v) in &r.extensions {
                    p = p.with_extension(k, v);
                }
                p
            }
            Self::Unavailable(detail) => problem.with_detail(detail.clone()),
            Self::Internal(_) => problem.with_detail("an unexpected error occurred; it has been logged"),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code().status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(e) = self {
            tracing::error!(error = ?e, "internal error");
        }
        let mut resp = HttpResponse::build(self.status_code());
        resp.content_type(PROBLEM_JSON);
        match self {
            Self::Unauthorized => {
                resp.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            Self::Refused(r) => {
                if let Some(seconds) = r.retry_after {
                    resp.insert_header((header::RETRY_AFTER, HeaderValue::from(seconds)));
                }
                if let Some(allow) = r.allow.as_deref().and_then(|a| HeaderValue::from_str(a).ok()) {
                    resp.insert_header((header::ALLOW, allow));
                }
            }
            _ => {}
        }
        resp.json(self.problem())
    }
}

impl From<diesel::result::Error> for ApiError {
    /// A database error, including a stored value the code does not know
    /// (a corrupt state: diesel's deserialization error), is a logged `500`.
    fn from(e: diesel::result::Error) -> Self {
        Self::Internal(e.into())
    }
}

impl From<vid_db::PoolError> for ApiError {
    fn from(e: vid_db::PoolError) -> Self {
        // The cause (host, pool state) is for the logs, not the client.
        tracing::warn!(error = %e, "database unavailable");
        Self::Unavailable("the database is unavailable; retry later".to_owned())
    }
}

/// How a malformed JSON body is answered, by `web::Json` (the app's
/// `JsonConfig`) and by handlers that read the body themselves: `415
/// unsupported_media_type` for another media type, `413 body_too_large` past
/// the limit, `400 invalid_json` otherwise, the detail naming the error.
pub fn json_error(err: &actix_web::error::JsonPayloadError) -> ApiError {
    use actix_web::error::JsonPayloadError;
    match err {
        JsonPayloadError::ContentType => ApiError::new(codes::UNSUPPORTED_MEDIA_TYPE, "send the body as application/json"),
        JsonPayloadError::Overflow { .. } | JsonPayloadError::OverflowKnownLength { .. } => {
            ApiError::new(codes::BODY_TOO_LARGE, err.to_string())
        }
        _ => ApiError::new(codes::INVALID_JSON, err.to_string()),
    }
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;
