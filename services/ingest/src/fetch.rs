//! One download through the SSRF guard (`vid-netguard`), the rules of
//! issue 21 item 4:
//!
//! - every URL (the job's, and each redirect target) is parsed under the
//!   policy ([`WebhookUrl::parse`]: `http(s)` only, no userinfo, every IP
//!   literal notation checked) and resolved once with [`resolve_checked`],
//!   which refuses the URL if ANY answer is refused;
//! - the HTTP client connects only to those checked addresses: each hop gets
//!   a fresh reqwest client whose only name → address mapping is the checked
//!   answer (`resolve_to_addrs`), whose fallback resolver refuses every name
//!   (fail closed), without proxies, without its own redirect handling and
//!   without a connection pool, so nothing is reused across hops;
//! - redirects (3xx with `Location`) are followed here, at most
//!   `max_redirects` times, each target checked as above;
//! - the size limit is enforced on the bytes as they stream (a
//!   `Content-Length` above it is refused at once; one below it is not
//!   trusted); connect and idle timeouts bound every hop and every read, the
//!   caller bounds the whole download.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vid_netguard::{resolve_checked, Resolve, UrlError, UrlPolicy, WebhookHost, WebhookUrl};

use crate::problems::IngestError;

/// `User-Agent` of every ingest request.
pub const USER_AGENT: &str = concat!("vid-ingest/", env!("CARGO_PKG_VERSION"));

/// Called with each URL and the checked addresses the client is about to
/// connect to (never called for a refused URL). Tests use it to prove that a
/// refused target is never contacted.
pub type ConnectObserver = Arc<dyn Fn(&str, &[SocketAddr]) + Send + Sync>;

/// Timeouts and the redirect bound.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// TCP connect (all checked addresses of a hop together).
    pub connect_timeout: Duration,
    /// The longest wait for the answer's head or for the next body bytes.
    pub idle_timeout: Duration,
    /// Redirects followed at most (the next one fails `too_many_redirects`).
    pub max_redirects: u32,
}

/// Opens sources under one policy. Cheap to share behind an `Arc`.
pub struct Fetcher {
    policy: UrlPolicy,
    resolver: Arc<dyn Resolve>,
    limits: Limits,
    observer: Option<ConnectObserver>,
}

/// A `200 OK` answer whose body is still to be read.
pub struct Source {
    response: reqwest::Response,
    /// The URL that answered (after redirects).
    pub url: WebhookUrl,
    /// Redirects followed.
    pub redirects: u32,
    /// `Content-Length`, if sent.
    pub content_length: Option<u64>,
    /// `Content-Type`, lower case without parameters, if sent.
    pub content_type: Option<String>,
    idle_timeout: Duration,
}

/// Refuses every name: the client's fallback resolver, so only the checked
/// mapping of the hop can ever be used.
struct RefuseAll;

impl reqwest::dns::Resolve for RefuseAll {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            Err::<reqwest::dns::Addrs, _>(format!("`{host}` was not checked by the SSRF guard for this hop; refusing to resolve it").into())
        })
    }
}

impl Fetcher {
    /// A fetcher checking URLs against `policy`, resolving with `resolver`.
    pub fn new(policy: UrlPolicy, resolver: Arc<dyn Resolve>, limits: Limits) -> Self {
        Self { policy, resolver, limits, observer: None }
    }

    /// Builder-style: calls `observer` before every connection (tests).
    pub fn with_observer(mut self, observer: ConnectObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Follows `url` (and its redirects) to a `200 OK` answer; any other
    /// final status (`206 Partial Content` included: only the whole
    /// representation is a source, RFC 9110 §15.3.7) is `HttpStatus`. Errors: the
    /// guard's refusal ([`IngestError::Refused`], nothing contacted for that
    /// target), `Unreachable`, `Timeout`, `HttpStatus`, `TooManyRedirects`,
    /// `BadRedirect`, `BrokenHttp`.
    pub async fn open(&self, url: &str) -> Result<Source, IngestError> {
        let mut url = WebhookUrl::parse(url, &self.policy).map_err(IngestError::Refused)?;
        let mut redirects = 0u32;
        loop {
            let response = self.request(&url).await?;
            let status = response.status();
            if status.is_redirection() {
                let Some(location) = response.headers().get(reqwest::header::LOCATION) else {
                    return Err(IngestError::HttpStatus { status: status.as_u16() });
                };
                if redirects == self.limits.max_redirects {
                    return Err(IngestError::TooManyRedirects { max: self.limits.max_redirects });
                }
                redirects += 1;
                let location =
                    location.to_str().map_err(|_| IngestError::BadRedirect(format!("{}: the Location is not ASCII", url.host_str())))?;
                let mut next = url.url().join(location).map_err(|e| {
                    tracing::warn!(from = %url, location, error = %e, "a redirect's Location is not a URL");
                    IngestError::BadRedirect(format!("{}: the Location is not a URL", url.host_str()))
                })?;
                // A fragment is never sent to a server (RFC 9110 §10.2.2 lets it ride along): drop it.
                next.set_fragment(None);
                tracing::info!(from = %url, to = %next, status = status.as_u16(), "following a redirect");
                url = WebhookUrl::parse(next.as_str(), &self.policy).map_err(IngestError::Refused)?;
                continue;
            }
            if status != reqwest::StatusCode::OK {
                return Err(IngestError::HttpStatus { status: status.as_u16() });
            }
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
                .filter(|v| !v.is_empty());
            let content_length = response.content_length();
            return Ok(Source { response, url, redirects, content_length, content_type, idle_timeout: self.limits.idle_timeout });
        }
    }

    /// One GET to `url`, connecting only to its checked addresses.
    async fn request(&self, url: &WebhookUrl) -> Result<reqwest::Response, IngestError> {
        let addrs = resolve_checked(url, &self.policy, &*self.resolver).await.map_err(|e| match e {
            UrlError::DnsFailed { .. } | UrlError::NoAddresses { .. } => {
                tracing::warn!(url = %url, error = %error_chain(&e), "the source's host did not resolve");
                IngestError::Unreachable(format!("{} did not resolve", url.host_str()))
            }
            other => IngestError::Refused(other),
        })?;
        if let Some(observe) = &self.observer {
            observe(url.as_str(), &addrs);
        }
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .pool_max_idle_per_host(0)
            .connect_timeout(self.limits.connect_timeout)
            .read_timeout(self.limits.idle_timeout)
            .user_agent(USER_AGENT)
            .dns_resolver(Arc::new(RefuseAll));
        if let WebhookHost::Domain(name) = url.host() {
            builder = builder.resolve_to_addrs(name, &addrs);
        }
        let client = builder.build().map_err(|e| {
            tracing::error!(error = %error_chain(&e), "building the HTTP client failed");
            IngestError::Unreachable(format!("{}: the request could not be prepared", url.host_str()))
        })?;
        let send = client.get(url.url().clone()).send();
        match tokio::time::timeout(self.limits.connect_timeout + self.limits.idle_timeout, send).await {
            Err(_) => Err(IngestError::Timeout(format!("no answer from {} within {:?}", url.host_str(), self.limits.idle_timeout))),
            Ok(Err(e)) => Err(request_error(url, e)),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

/// Maps a reqwest error of a request to its class. The operation-visible
/// detail names the host only (no path, no query string: a presigned URL's
/// signature stays out of the operation); the whole error chain (OS error
/// text, the URL) is logged.
fn request_error(url: &WebhookUrl, e: reqwest::Error) -> IngestError {
    tracing::warn!(url = %url, error = %error_chain(&e), "the request to the source failed");
    let host = url.host_str();
    if e.is_timeout() {
        IngestError::Timeout(format!("no answer from {host}"))
    } else if e.is_connect() {
        IngestError::Unreachable(format!("could not connect to {host}"))
    } else {
        IngestError::BrokenHttp(format!("{host} answered unreadable HTTP"))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

impl Source {
    /// The next chunk of the body; `None` at its end. Errors: `Timeout` when
    /// no bytes came for the idle timeout, `Unreachable` when the connection
    /// broke.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, IngestError> {
        match tokio::time::timeout(self.idle_timeout, self.response.chunk()).await {
            Err(_) => Err(IngestError::Timeout(format!("no bytes from {} for {:?}", self.url.host_str(), self.idle_timeout))),
            Ok(Err(e)) if e.is_timeout() => {
                Err(IngestError::Timeout(format!("no bytes from {} for {:?}", self.url.host_str(), self.idle_timeout)))
            }
            Ok(Err(e)) => {
                tracing::warn!(url = %self.url, error = %error_chain(&e), "the connection to the source broke");
                Err(IngestError::Unreachable(format!("the connection to {} broke", self.url.host_str())))
            }
            Ok(Ok(chunk)) => Ok(chunk),
        }
    }
}

/// The media type of a body from its first bytes, if it is a container the
/// transcoder reads: ISO BMFF (`ftyp` box at offset 4, ISO/IEC 14496-12
/// §4.3; brand `qt  ` is QuickTime) or EBML (`1A 45 DF A3`, RFC 8794 §8;
/// doc type `webm` is WebM, else Matroska).
pub fn sniff(head: &[u8]) -> Option<&'static str> {
    if head.len() >= 12 && &head[4..8] == b"ftyp" {
        return Some(if &head[8..12] == b"qt  " { "video/quicktime" } else { "video/mp4" });
    }
    if head.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]) {
        let window = &head[..head.len().min(64)];
        return Some(if window.windows(4).any(|w| w == b"webm") { "video/webm" } else { "video/x-matroska" });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::sniff;

    #[test]
    fn containers_are_sniffed_from_their_first_bytes() {
        assert_eq!(sniff(b"\0\0\0\x20ftypisom\0\0\x02\0"), Some("video/mp4"));
        assert_eq!(sniff(b"\0\0\0\x14ftypqt  \0\0\x02\0"), Some("video/quicktime"));
        assert_eq!(sniff(&[0x1A, 0x45, 0xDF, 0xA3, 0x9F, 0x42, 0x82, 0x84, b'w', b'e', b'b', b'm']), Some("video/webm"));
        assert_eq!(sniff(&[0x1A, 0x45, 0xDF, 0xA3, 0x42, 0x82, 0x88, b'm', b'a', b't', b'r']), Some("video/x-matroska"));
        assert_eq!(sniff(b"<!doctype html>"), None);
        assert_eq!(sniff(b""), None);
    }
}
