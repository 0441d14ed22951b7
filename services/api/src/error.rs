//! The api's error type and its mapping to RFC 9457 problem details.
//!
//! Codes are stable: once published, a code keeps its meaning.

use actix_web::dev::ServiceResponse;
use actix_web::http::{header, StatusCode};
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::{HttpMessage, HttpResponse, ResponseError};
use vid_core::problem::{Problem, PROBLEM_JSON};

/// Every error a handler can return. Each maps to one status and one stable code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401 `unauthorized`: no or unknown API key.
    #[error("a valid API key is required")]
    Unauthorized,
    /// 404 `not_found`: the resource does not exist or belongs to another tenant.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// 400 with the given code: the request is malformed.
    #[error("{detail}")]
    BadRequest {
        /// Stable code, e.g. `invalid_json`.
        code: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// 422 with the given code: well-formed, but refused by a rule.
    #[error("{detail}")]
    Unprocessable {
        /// Stable code, e.g. `unsupported_content_type`.
        code: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// 409 with the given code: the resource is in a state that forbids this.
    #[error("{detail}")]
    Conflict {
        /// Stable code, e.g. `upload_aborted`.
        code: &'static str,
        /// What is wrong.
        detail: String,
        /// Extension members for the problem body.
        extensions: Vec<(&'static str, serde_json::Value)>,
    },
    /// 429 `too_many_requests`.
    #[error("{0}")]
    TooManyRequests(String),
    /// 503 `unavailable`: a dependency (storage, broker) is down; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal`: a bug or an unexpected failure; details go to the log only.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    /// Shorthand for [`ApiError::BadRequest`].
    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::BadRequest { code, detail: detail.into() }
    }

    /// Shorthand for [`ApiError::Unprocessable`].
    pub fn unprocessable(code: &'static str, detail: impl Into<String>) -> Self {
        Self::Unprocessable { code, detail: detail.into() }
    }

    /// Shorthand for [`ApiError::Conflict`] without extensions.
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Self::Conflict { code, detail: detail.into(), extensions: Vec::new() }
    }

    /// The problem-details body for this error.
    pub fn problem(&self) -> Problem {
        let status = self.status_code().as_u16();
        match self {
            Self::Unauthorized => {
                Problem::new(status, "unauthorized", "Unauthorized").with_detail("send `Authorization: Bearer <API key>`")
            }
            Self::NotFound(what) => Problem::new(status, "not_found", "Not found").with_detail(format!("{what} not found")),
            Self::BadRequest { code, detail } => Problem::new(status, *code, "Bad request").with_detail(detail.clone()),
            Self::Unprocessable { code, detail } => Problem::new(status, *code, "Request refused").with_detail(detail.clone()),
            Self::Conflict { code, detail, extensions } => {
                let mut p = Problem::new(status, *code, "Conflict").with_detail(detail.clone());
                for (k, v) in extensions {
                    p = p.with_extension(k, v);
                }
                p
            }
            Self::TooManyRequests(detail) => Problem::new(status, "too_many_requests", "Too many requests").with_detail(detail.clone()),
            Self::Unavailable(detail) => Problem::new(status, "unavailable", "Service unavailable").with_detail(detail.clone()),
            Self::Internal(_) => {
                Problem::new(status, "internal", "Internal error").with_detail("an unexpected error occurred; it has been logged")
            }
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(e) = self {
            tracing::error!(error = ?e, "internal error");
        }
        let mut resp = HttpResponse::build(self.status_code());
        resp.content_type(PROBLEM_JSON);
        if matches!(self, Self::Unauthorized) {
            resp.insert_header(("WWW-Authenticate", "Bearer"));
        }
        resp.json(self.problem())
    }
}

impl From<diesel::result::Error> for ApiError {
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

/// The answer for a problem that is not an [`ApiError`] (framework-level errors).
pub fn problem_response(problem: Problem) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .content_type(PROBLEM_JSON)
        .json(problem)
}

/// The method the client sent, when [`head_as_get`] routed it as another.
#[derive(Debug, Clone)]
struct ClientMethod(actix_web::http::Method);

/// Serves `HEAD` wherever `GET` is served (RFC 9110 §9.3.2: the same status
/// and header fields as `GET`, without content).
///
/// Routes are registered per method (`web::get()` matches only `GET`), so
/// this middleware routes a `HEAD` request as `GET`; actix-web's HTTP/1
/// encoder, which saw the request as `HEAD`, then sends the `GET` answer's
/// status and headers (including its `Content-Length`) and no body. A path
/// without `GET` answers `405` with an `Allow` header ([`method_not_allowed`],
/// which reports the client's `HEAD`). Errors: none of its own.
pub async fn head_as_get(
    mut req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> actix_web::Result<ServiceResponse<impl actix_web::body::MessageBody>> {
    if req.method() == actix_web::http::Method::HEAD {
        req.extensions_mut().insert(ClientMethod(actix_web::http::Method::HEAD));
        req.head_mut().method = actix_web::http::Method::GET;
    }
    next.call(req).await
}

/// Turns actix-web's bare `405 Method Not Allowed` into the api's problem.
///
/// Every path is registered once, as a `web::resource` holding one route per
/// method (see [`crate::routes`]). A request whose path matches a resource
/// but whose method matches none of its routes gets the resource's default
/// answer: `405` with an `Allow` header listing the methods of those routes
/// (RFC 9110 §15.5.6; the header is defined in §10.2.1). Installed once for
/// the whole app (`ErrorHandlers` in [`crate::Application::run`]), this
/// handler keeps that status and `Allow` header and gives the answer an
/// RFC 9457 body like every other error: `application/problem+json`, code
/// `method_not_allowed`, the refused method and the allowed ones in `detail`.
///
/// A path that matches no resource is not affected: it stays
/// `404 not_found` (the app's default service). A `405` that already carries
/// a problem body is passed through unchanged.
pub fn method_not_allowed<B>(res: ServiceResponse<B>) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let is_problem = res.headers().get(header::CONTENT_TYPE).is_some_and(|ct| ct.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if is_problem {
        return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
    }
    // A path that serves GET serves HEAD too ([`head_as_get`]).
    let allow = res.headers().get(header::ALLOW).and_then(|v| v.to_str().ok()).map(|v| {
        let methods: Vec<&str> = v.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
        if methods.contains(&"GET") && !methods.contains(&"HEAD") {
            format!("{}, HEAD", methods.join(", "))
        } else {
            methods.join(", ")
        }
    });
    let allowed = allow.as_deref().filter(|v| !v.is_empty()).unwrap_or("none").to_owned();
    let method = res.request().extensions().get::<ClientMethod>().map_or_else(|| res.request().method().clone(), |m| m.0.clone());
    let allow = allow.and_then(|v| header::HeaderValue::from_str(&v).ok());
    let problem = Problem::new(StatusCode::METHOD_NOT_ALLOWED.as_u16(), "method_not_allowed", "Method not allowed")
        .with_detail(format!("`{method}` is not allowed on this path; allowed: {allowed} (see the `Allow` header)"));
    let (req, _) = res.into_parts();
    let mut answer = problem_response(problem);
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    Ok(ErrorHandlerResponse::Response(ServiceResponse::new(req, answer).map_into_right_body()))
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;
