//! The playback service's one error type and its RFC 9457 answers.
//!
//! Every error is an `application/problem+json` body with a stable `code`,
//! `Cache-Control: no-store` (a CDN must not keep an error: the video may be
//! ready a second later) and the CORS header, so a player's script can read
//! it. Details are generic on purpose: no answer names a tenant, a video,
//! the bucket, a storage key or a storage error; those go to the log.
//!
//! | code | status | when |
//! |---|---|---|
//! | `not_found` | 404 | path outside the grammar, unknown or deleted playback ID, video not ready or without a stream, no such track or segment |
//! | `playback_token_required` | 403 | a `signed` playback ID asked without `?token=` |
//! | `token_misplaced` | 403 | a `signed` playback ID asked with a token elsewhere: an `Authorization` header, or more than one `token` parameter |
//! | `token_malformed` | 403 | not three base64url parts of JSON, or a claim of the wrong type |
//! | `token_algorithm_not_allowed` | 403 | a header `alg` other than `RS256` (`none`, `HS256`, …) |
//! | `token_unknown_key` | 403 | no `kid`, or one that names no signing key of the playback ID's tenant (unknown, deleted, another tenant's) |
//! | `token_bad_signature` | 403 | the RS256 signature does not verify (a tampered header, payload or signature) |
//! | `token_missing_claim` | 403 | no `exp`, `sub` or `aud` |
//! | `token_expired` | 403 | `exp` more than the leeway (30 s) ago |
//! | `token_not_yet_valid` | 403 | `nbf` more than the leeway ahead |
//! | `token_wrong_subject` | 403 | `sub` is another playback ID |
//! | `token_wrong_audience` | 403 | `aud` is not the route's audience (`v` stream, `t` thumbnail, `s` storyboard, `g` poster) |
//! | `invalid_parameter` | 400 | `thumbnail.jpg`'s `time` or `width` is not a number in range (`time`: finite, ≥ 0 s; `width`: an integer ≥ 1) |
//! | `range_not_satisfiable` | 416 | a `Range` starting past the object's end (`Content-Range: bytes */<size>`) |
//! | `precondition_failed` | 412 | `If-Match` or `If-Unmodified-Since` false for a media object (RFC 9110 §13.1.1, §13.1.4) |
//! | `method_not_allowed` | 405 | not GET, HEAD or OPTIONS (`Allow` says which) |
//! | `unavailable` | 503 | PostgreSQL or storage did not answer (`Retry-After: 1`) |
//! | `internal` | 500 | a bug or a corrupt row |

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use vid_core::problem::{Problem, PROBLEM_JSON};

/// Stable problem codes of this service (never change once published).
pub mod codes {
    /// 404.
    pub const NOT_FOUND: &str = "not_found";
    /// 403.
    pub const PLAYBACK_TOKEN_REQUIRED: &str = "playback_token_required";
    /// 403 (issue 20: each refused token, see [`super::TokenRefusal`]).
    pub const TOKEN_MISPLACED: &str = "token_misplaced";
    /// 403.
    pub const TOKEN_MALFORMED: &str = "token_malformed";
    /// 403.
    pub const TOKEN_ALGORITHM_NOT_ALLOWED: &str = "token_algorithm_not_allowed";
    /// 403.
    pub const TOKEN_UNKNOWN_KEY: &str = "token_unknown_key";
    /// 403.
    pub const TOKEN_BAD_SIGNATURE: &str = "token_bad_signature";
    /// 403.
    pub const TOKEN_MISSING_CLAIM: &str = "token_missing_claim";
    /// 403.
    pub const TOKEN_EXPIRED: &str = "token_expired";
    /// 403.
    pub const TOKEN_NOT_YET_VALID: &str = "token_not_yet_valid";
    /// 403.
    pub const TOKEN_WRONG_SUBJECT: &str = "token_wrong_subject";
    /// 403.
    pub const TOKEN_WRONG_AUDIENCE: &str = "token_wrong_audience";
    /// 400 (issue 20: a thumbnail's `time` or `width`).
    pub const INVALID_PARAMETER: &str = "invalid_parameter";
    /// 416.
    pub const RANGE_NOT_SATISFIABLE: &str = "range_not_satisfiable";
    /// 412.
    pub const PRECONDITION_FAILED: &str = "precondition_failed";
    /// 405.
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    /// 503.
    pub const UNAVAILABLE: &str = "unavailable";
    /// 500.
    pub const INTERNAL: &str = "internal";
}

/// Why a playback token was refused (each a `403` with its own code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// `token_misplaced`.
    Misplaced,
    /// `token_malformed`.
    Malformed,
    /// `token_algorithm_not_allowed`.
    AlgorithmNotAllowed,
    /// `token_unknown_key`.
    UnknownKey,
    /// `token_bad_signature`.
    BadSignature,
    /// `token_missing_claim`.
    MissingClaim,
    /// `token_expired`.
    Expired,
    /// `token_not_yet_valid`.
    NotYetValid,
    /// `token_wrong_subject`.
    WrongSubject,
    /// `token_wrong_audience`.
    WrongAudience,
}

impl TokenRefusal {
    /// Every refusal.
    pub const ALL: [TokenRefusal; 10] = [
        Self::Misplaced,
        Self::Malformed,
        Self::AlgorithmNotAllowed,
        Self::UnknownKey,
        Self::BadSignature,
        Self::MissingClaim,
        Self::Expired,
        Self::NotYetValid,
        Self::WrongSubject,
        Self::WrongAudience,
    ];

    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Self::Misplaced => codes::TOKEN_MISPLACED,
            Self::Malformed => codes::TOKEN_MALFORMED,
            Self::AlgorithmNotAllowed => codes::TOKEN_ALGORITHM_NOT_ALLOWED,
            Self::UnknownKey => codes::TOKEN_UNKNOWN_KEY,
            Self::BadSignature => codes::TOKEN_BAD_SIGNATURE,
            Self::MissingClaim => codes::TOKEN_MISSING_CLAIM,
            Self::Expired => codes::TOKEN_EXPIRED,
            Self::NotYetValid => codes::TOKEN_NOT_YET_VALID,
            Self::WrongSubject => codes::TOKEN_WRONG_SUBJECT,
            Self::WrongAudience => codes::TOKEN_WRONG_AUDIENCE,
        }
    }

    /// The problem's `detail`: the rule broken, never a key, tenant or claim value.
    fn detail(self) -> &'static str {
        match self {
            Self::Misplaced => "send the playback token as the one `token` query parameter, not in a header or twice",
            Self::Malformed => "the playback token is not a well-formed JWT",
            Self::AlgorithmNotAllowed => "playback tokens must be signed with RS256",
            Self::UnknownKey => "the token's `kid` names no signing key that may sign for this playback ID",
            Self::BadSignature => "the token's signature does not verify",
            Self::MissingClaim => "the token needs `exp`, `sub` and `aud` claims",
            Self::Expired => "the token has expired",
            Self::NotYetValid => "the token is not valid yet (`nbf`)",
            Self::WrongSubject => "the token's `sub` is another playback ID",
            Self::WrongAudience => "the token's `aud` does not open this kind of resource",
        }
    }
}

/// Every way a playback request can fail.
#[derive(Debug, thiserror::Error)]
pub enum PlaybackError {
    /// 404 `not_found`.
    #[error("not found")]
    NotFound,
    /// 403 `playback_token_required`.
    #[error("this playback ID is signed")]
    TokenRequired,
    /// 403 with the refusal's code.
    #[error("playback token refused: {}", .0.code())]
    TokenRefused(TokenRefusal),
    /// 400 `invalid_parameter`: which rule the value broke (sent as the detail).
    #[error("invalid parameter: {0}")]
    InvalidParameter(&'static str),
    /// 416 `range_not_satisfiable`; the object's size when known.
    #[error("range not satisfiable")]
    RangeNotSatisfiable(Option<u64>),
    /// 412 `precondition_failed`.
    #[error("precondition failed")]
    PreconditionFailed,
    /// 405 `method_not_allowed`.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// 503 `unavailable`: the message is logged, never sent.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// 500 `internal`: the message is logged, never sent.
    #[error("internal: {0}")]
    Internal(String),
}

impl PlaybackError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound => codes::NOT_FOUND,
            Self::TokenRequired => codes::PLAYBACK_TOKEN_REQUIRED,
            Self::TokenRefused(r) => r.code(),
            Self::InvalidParameter(_) => codes::INVALID_PARAMETER,
            Self::RangeNotSatisfiable(_) => codes::RANGE_NOT_SATISFIABLE,
            Self::PreconditionFailed => codes::PRECONDITION_FAILED,
            Self::MethodNotAllowed => codes::METHOD_NOT_ALLOWED,
            Self::Unavailable(_) => codes::UNAVAILABLE,
            Self::Internal(_) => codes::INTERNAL,
        }
    }

    fn title_and_detail(&self) -> (&'static str, &'static str) {
        match self {
            Self::NotFound => ("Not Found", "no playable stream at this address"),
            Self::TokenRequired => ("Playback Token Required", "this playback ID needs a signed playback token"),
            Self::TokenRefused(r) => ("Playback Token Refused", r.detail()),
            Self::InvalidParameter(rule) => ("Invalid Parameter", rule),
            Self::RangeNotSatisfiable(_) => ("Range Not Satisfiable", "the requested range starts past the end of the object"),
            Self::PreconditionFailed => ("Precondition Failed", "If-Match or If-Unmodified-Since does not hold for this object"),
            Self::MethodNotAllowed => ("Method Not Allowed", "only GET, HEAD and OPTIONS are served"),
            Self::Unavailable(_) => ("Service Unavailable", "a dependency did not answer; retry shortly"),
            Self::Internal(_) => ("Internal Server Error", "an unexpected error occurred"),
        }
    }
}

impl ResponseError for PlaybackError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::TokenRequired | Self::TokenRefused(_) => StatusCode::FORBIDDEN,
            Self::InvalidParameter(_) => StatusCode::BAD_REQUEST,
            Self::RangeNotSatisfiable(_) => StatusCode::RANGE_NOT_SATISFIABLE,
            Self::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            Self::Unavailable(m) => tracing::warn!(error = %m, "answering 503"),
            Self::Internal(m) => tracing::error!(error = %m, "answering 500"),
            _ => {}
        }
        let status = self.status_code();
        let (title, detail) = self.title_and_detail();
        let body = Problem::new(status.as_u16(), self.code(), title).with_detail(detail);
        let mut res = HttpResponse::build(status);
        res.insert_header((header::CONTENT_TYPE, PROBLEM_JSON)).insert_header((header::CACHE_CONTROL, "no-store"));
        match self {
            Self::RangeNotSatisfiable(Some(size)) => {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    res.insert_header((header::CONTENT_RANGE, v));
                }
            }
            Self::MethodNotAllowed => {
                res.insert_header((header::ALLOW, "GET, HEAD, OPTIONS"));
            }
            Self::Unavailable(_) => {
                res.insert_header((header::RETRY_AFTER, "1"));
            }
            _ => {}
        }
        res.body(serde_json::to_vec(&body).unwrap_or_default())
    }
}
