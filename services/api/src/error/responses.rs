//! The reusable problem responses of the OpenAPI document (`BadRequest`,
//! `Unauthorized`, …): `application/problem+json` bodies of schema `Problem`,
//! one per status, each listing the registered codes of its status with their
//! meaning, read from [`super::codes`].

use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, Response, ResponseBuilder};
use vid_core::problem::PROBLEM_JSON;

use super::codes;

/// A reusable `application/problem+json` response, named after its type.
macro_rules! problem_response {
    ($name:ident, $status:literal, $intro:literal $(, header $header:literal: $header_doc:literal)?) => {
        #[doc = concat!("`", stringify!($status), "`: ", $intro)]
        pub struct $name;

        impl<'r> utoipa::ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                let header: Option<(&str, &str)> = None $(.or(Some(($header, $header_doc))))?;
                (stringify!($name), problem($status, $intro, header).into())
            }
        }
    };
}

/// The response for `status`: `intro`, then each registered code of that
/// status with its meaning; the example carries the first of them.
fn problem(status: u16, intro: &str, header: Option<(&str, &str)>) -> Response {
    let mut description = format!("{intro} Codes:");
    for c in codes::with_status(status) {
        description.push_str(&format!("\n- `{}`: {}", c.code, c.meaning));
    }
    let first = codes::with_status(status).next().expect("every documented status has a registered code");
    let example = serde_json::json!({
        "type": format!("/problems/{}", first.code),
        "title": first.title,
        "status": status,
        "detail": "what went wrong, for people",
        "code": first.code,
    });
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).example(Some(example)).build();
    let mut response = ResponseBuilder::new().description(description).content(PROBLEM_JSON, content);
    if let Some((name, doc)) = header {
        let schema = utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::String).build();
        response = response.header(name, HeaderBuilder::new().schema(schema).description(Some(doc)).build());
    }
    response.build()
}

problem_response!(BadRequest, 400, "The request is malformed.");
problem_response!(
    Unauthorized, 401, "No API key, or an unknown or revoked one.",
    header "WWW-Authenticate": "`Bearer`"
);
problem_response!(NotFound, 404, "The resource does not exist, belongs to another tenant, or the id is malformed.");
problem_response!(
    Conflict,
    409,
    "The resource is in a state that forbids this (the `code` says which; some carry extension members, e.g. `missing_parts`)."
);
problem_response!(PayloadTooLarge, 413, "The body is too large.");
problem_response!(UnsupportedMediaType, 415, "The body's media type is not accepted.");
problem_response!(Unprocessable, 422, "Well-formed, but refused by a rule (the `code` says which).");
problem_response!(
    TooManyRequests, 429, "A per-tenant bound is reached; retry after `Retry-After`.",
    header "Retry-After": "Seconds to wait before retrying (RFC 9110 §10.2.3): 30 with `too_many_uploads`, 5 with `too_many_watchers`."
);
problem_response!(
    Unavailable,
    503,
    "A dependency is down; retry later. For storage failures the `detail` is generic; the cause is logged with the \
request's `X-Request-Id`."
);
