//! What storage's answers mean to the uploader: refused URLs, S3 error codes
//! summarised for people (never naming the bucket or key), and which errors
//! are worth a retry.

use crate::client::ClientError;

/// Whether storage refused the presigned URL itself (expired, or its
/// signature is no longer accepted), as opposed to failing the request.
/// AWS answers 403 (`AccessDenied` "Request has expired", or
/// `SignatureDoesNotMatch`); Garage answers 400 `InvalidRequest` "Date is too
/// old" (or closes the connection before reading the body).
pub fn url_refused(status: u16, body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    let says = b.contains("expired")
        || b.contains("too old")
        || b.contains("accessdenied")
        || b.contains("signaturedoesnotmatch")
        || b.contains("invalidaccesskeyid");
    match status {
        403 => true,
        400 => says || b.contains("authorizationqueryparameterserror"),
        _ => false,
    }
}

/// The `<Code>` of an S3 error body, or its start.
pub(super) fn s3_code(body: &str) -> String {
    let code = body.split_once("<Code>").and_then(|(_, r)| r.split_once("</Code>")).map(|(c, _)| c);
    let message = body.split_once("<Message>").and_then(|(_, r)| r.split_once("</Message>")).map(|(m, _)| m);
    match (code, message) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_owned(),
        _ => body.chars().take(120).collect(),
    }
}

/// What an S3 error body says, for people: its code and a hint for the
/// common ones (never the `<Resource>`, `<Key>` or `<BucketName>`, which name
/// the bucket and object), or the start of a body that is not an S3 error.
pub(super) fn s3_summary(body: &str) -> String {
    let tag = |t: &str| body.split_once(&format!("<{t}>")).and_then(|(_, r)| r.split_once(&format!("</{t}>"))).map(|(v, _)| v);
    let Some(code) = tag("Code") else { return body.chars().take(300).collect() };
    let hint = match code {
        "NoSuchUpload" => "the upload was completed or aborted elsewhere",
        "AccessDenied" | "SignatureDoesNotMatch" | "InvalidAccessKeyId" => "storage refused the part's URL",
        "EntityTooLarge" | "EntityTooSmall" | "InvalidPart" | "BadDigest" | "IncompleteBody" => "storage refused the part's bytes",
        "SlowDown" | "ServiceUnavailable" | "InternalError" => "storage is failing or overloaded; try again later",
        _ => "",
    };
    if hint.is_empty() {
        code.to_owned()
    } else {
        format!("{code} ({hint})")
    }
}

/// An error with its causes (storage errors carry no URL: see `without_url`).
pub(super) fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// Errors worth repeating the same call for.
pub(super) fn transient(e: &ClientError) -> bool {
    match e {
        ClientError::Http(_) => true,
        ClientError::Api(p) => p.status >= 500 || p.status == 429,
        ClientError::Unexpected { status, .. } => *status >= 500 || *status == 429,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_refused_urls_from_aws_and_garage() {
        let aws_expired = "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>";
        assert!(url_refused(403, aws_expired));
        assert!(url_refused(403, "<Error><Code>SignatureDoesNotMatch</Code></Error>"));
        assert!(url_refused(400, "<Error><Code>InvalidRequest</Code><Message>Bad request: Date is too old or expired</Message></Error>"));
        assert!(url_refused(400, "<Error><Code>AccessDenied</Code></Error>"));
        let garage = "<Error><Code>InvalidRequest</Code><Message>Bad request: Date is too old</Message></Error>";
        assert!(url_refused(400, garage));
        assert!(!url_refused(400, "<Error><Code>InvalidPart</Code><Message>bad digest</Message></Error>"));
        assert!(!url_refused(500, aws_expired));
        assert_eq!(s3_code(aws_expired), "AccessDenied: Request has expired");
    }

    #[test]
    fn s3_errors_are_summarised_without_bucket_or_key() {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchUpload</Code><Message>Upload not found</Message>\
                    <Resource>/vid-media/tenants/t_1/uploads/upl_1/source</Resource><Region>garage</Region></Error>";
        assert_eq!(s3_summary(body), "NoSuchUpload (the upload was completed or aborted elsewhere)");
        assert_eq!(s3_summary("<Error><Code>Weird</Code><Key>tenants/x</Key></Error>"), "Weird");
        assert_eq!(s3_summary("bad gateway"), "bad gateway");
    }
}
