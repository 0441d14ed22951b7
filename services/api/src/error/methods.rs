//! Method handling shared by every route: `HEAD` served as `GET`, and the
//! `405 Method Not Allowed` answer made an RFC 9457 problem with `Allow`.

use actix_web::dev::ServiceResponse;
use actix_web::http::header;
use actix_web::middleware::ErrorHandlerResponse;
use actix_web::HttpMessage;
use vid_core::problem::PROBLEM_JSON;

use super::{codes, ApiError};

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
    let allow = allow.filter(|v| header::HeaderValue::from_str(v).is_ok());
    let mut error = ApiError::new(
        codes::METHOD_NOT_ALLOWED,
        format!("`{method}` is not allowed on this path; allowed: {allowed} (see the `Allow` header)"),
    );
    if let Some(allow) = allow {
        error = error.with_allow(allow);
    }
    let (req, _) = res.into_parts();
    let answer = actix_web::ResponseError::error_response(&error);
    Ok(ErrorHandlerResponse::Response(ServiceResponse::new(req, answer).map_into_right_body()))
}
