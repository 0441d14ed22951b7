//! Why an ingest failed, each with a stable code (the api registers them in
//! `services/api/src/error/codes.rs`, `OPERATION_ERRORS`, and for the URL
//! guard's codes `ANSWERS`).

use vid_core::Problem;
use vid_netguard::UrlError;

/// Why a download failed for good.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The SSRF guard refused the URL, a redirect target, or an address its
    /// host resolves to (code of [`UrlError::code`]: `blocked_address`,
    /// `host_not_allowed`, `scheme_not_allowed`, …). No connection was made.
    #[error("{0}")]
    Refused(UrlError),
    /// The host did not resolve, or no checked address accepted a
    /// connection, or the TLS handshake or the connection failed.
    #[error("the source is unreachable: {0}")]
    Unreachable(String),
    /// The source answered a status other than `200 OK` (or 3xx with a
    /// `Location`); `206 Partial Content` is one of them.
    #[error("the source answered HTTP {status}")]
    HttpStatus {
        /// The status it answered.
        status: u16,
    },
    /// The source spoke broken HTTP.
    #[error("the source answered broken HTTP: {0}")]
    BrokenHttp(String),
    /// No bytes for the idle timeout, or the whole download took longer than
    /// the total timeout.
    #[error("the source timed out: {0}")]
    Timeout(String),
    /// The body grew past the limit while streaming.
    #[error("the source is larger than the limit of {limit} bytes")]
    TooLarge {
        /// `max_size_bytes` of the job.
        limit: u64,
    },
    /// More redirects than allowed.
    #[error("the source redirected more than {max} times")]
    TooManyRedirects {
        /// The allowed number.
        max: u32,
    },
    /// A redirect without a usable `Location`.
    #[error("the source redirected without a usable Location: {0}")]
    BadRedirect(String),
    /// The body was empty.
    #[error("the source answered an empty body")]
    Empty,
    /// Writing to storage failed (after the SDK's own retries).
    #[error("storage failed: {0}")]
    Storage(String),
    /// The api ended the operation meanwhile (`:cancel`, or `job_lost`) and
    /// said so on the control fan-out: the download stopped, its multipart
    /// upload was aborted, and no report is sent (the operation is terminal).
    #[error("the operation was cancelled")]
    Cancelled,
}

impl IngestError {
    /// The stable code: a [`UrlError::code`] for refusals, else
    /// `source_unreachable`, `source_http_error`, `source_timeout`,
    /// `source_too_large`, `too_many_redirects`, `source_empty`,
    /// `ingest_storage_failed` or `cancelled`.
    pub fn code(&self) -> &'static str {
        match self {
            IngestError::Refused(e) => e.code(),
            IngestError::Unreachable(_) => "source_unreachable",
            IngestError::HttpStatus { .. } | IngestError::BrokenHttp(_) => "source_http_error",
            IngestError::Timeout(_) => "source_timeout",
            IngestError::TooLarge { .. } => "source_too_large",
            IngestError::TooManyRedirects { .. } | IngestError::BadRedirect(_) => "too_many_redirects",
            IngestError::Empty => "source_empty",
            IngestError::Storage(_) => "ingest_storage_failed",
            IngestError::Cancelled => "cancelled",
        }
    }

    /// The operation-visible `detail`: names the host at most, never an
    /// address a name resolved to, a path, a query string (a presigned
    /// URL's signature) or OS/SDK error text; those go to the log only (the
    /// worker logs [`Display`](std::fmt::Display) and each failing site logs its cause).
    /// `Unreachable`, `Timeout`, `BrokenHttp` and `BadRedirect` carry such
    /// host-only text by construction (`fetch.rs`).
    pub fn public_detail(&self) -> String {
        match self {
            IngestError::Refused(UrlError::BlockedAddress { host: Some(host), .. }) => {
                format!("`{host}` resolves to an address ingests may not fetch from (only globally routable addresses)")
            }
            IngestError::Refused(UrlError::DnsFailed { host, .. }) => format!("{host} did not resolve"),
            IngestError::Refused(e) => {
                e.to_string().replace("webhooks may only target", "ingests may only fetch from").replace("webhook URLs", "ingest URLs")
            }
            IngestError::Storage(_) => "storing the source failed".to_owned(),
            other => other.to_string(),
        }
    }

    /// The problem the operation fails with (RFC 9457): status and title
    /// as registered in the api, `detail` from [`public_detail`](Self::public_detail);
    /// `source_http_error` from a status carries it as the extension member
    /// `source_status`.
    pub fn problem(&self) -> Problem {
        let (status, title) = match self {
            IngestError::Refused(_) => (422, "Request refused"),
            IngestError::Unreachable(_) => (502, "Source unreachable"),
            IngestError::HttpStatus { .. } | IngestError::BrokenHttp(_) => (502, "Source answered an error"),
            IngestError::Timeout(_) => (504, "Source timed out"),
            IngestError::TooLarge { .. } => (422, "Source too large"),
            IngestError::TooManyRedirects { .. } | IngestError::BadRedirect(_) => (502, "Too many redirects"),
            IngestError::Empty => (422, "Source empty"),
            IngestError::Storage(_) => (503, "Storage failed"),
            IngestError::Cancelled => (409, "Operation cancelled"),
        };
        let problem = Problem::new(status, self.code(), title).with_detail(self.public_detail());
        match self {
            IngestError::HttpStatus { status } => problem.with_extension("source_status", status),
            _ => problem,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_status_is_carried_and_refusals_keep_the_guards_code() {
        let p = IngestError::HttpStatus { status: 404 }.problem();
        assert_eq!((p.code.as_str(), p.status), ("source_http_error", 502));
        assert_eq!(p.extensions.get("source_status"), Some(&serde_json::json!(404)));
        let refused = vid_netguard::WebhookUrl::parse("http://10.0.0.1/", &vid_netguard::UrlPolicy::default()).unwrap_err();
        let p = IngestError::Refused(refused).problem();
        assert_eq!((p.code.as_str(), p.status), ("blocked_address", 422));
        assert!(p.detail.unwrap().contains("ingests may only fetch from"));
    }

    #[tokio::test]
    async fn details_name_the_host_but_not_its_resolved_address_nor_storage_internals() {
        let policy = vid_netguard::UrlPolicy::default();
        let url = vid_netguard::WebhookUrl::parse("https://media.example.com/clip.mp4?X-Amz-Signature=secret", &policy).unwrap();
        let resolver = vid_netguard::StaticResolver::new().with("media.example.com", ["10.9.8.7".parse().unwrap()]);
        let refused = vid_netguard::resolve_checked(&url, &policy, &resolver).await.unwrap_err();
        assert!(refused.to_string().contains("10.9.8.7"), "the guard's own text names the address: {refused}");
        let p = IngestError::Refused(refused).problem();
        let detail = p.detail.unwrap();
        assert_eq!(p.code, "blocked_address");
        assert!(detail.contains("media.example.com") && !detail.contains("10.9.8.7") && !detail.contains("Signature"), "{detail}");
        let p = IngestError::Storage("UploadPart: dispatch failure: io error: connection refused (10.0.0.5:3900)".into()).problem();
        assert_eq!(p.detail.as_deref(), Some("storing the source failed"));
    }
}
