//! One HTTP try of a delivery: SSRF check, connect to the checked addresses
//! only, optional TLS, a signed `POST`, and the first bytes of the answer.
//!
//! Rules (issue 5, "URL safety" and "Delivery"):
//! - the endpoint URL is parsed again under the current policy
//!   ([`vid_netguard::WebhookUrl::parse`]) and resolved once with
//!   [`vid_netguard::resolve_checked`]; only the addresses it returns are
//!   connected to, so there is no second lookup and DNS rebinding has no window;
//! - redirects are never followed: a 3xx is a failed attempt of class
//!   [`ErrorClass::Redirect`];
//! - connect timeout and whole-attempt timeout come from the settings
//!   (5 s / 15 s in production); at most `max_response_body_bytes` of the
//!   body are read;
//! - one connection per attempt (no pooling): attempts to one endpoint are
//!   minutes apart in the failure case that matters, and a fresh connection
//!   is always made to an address checked for this attempt.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::rustls;
use tokio_rustls::TlsConnector;
use vid_netguard::{resolve_checked, Resolve, UrlError, UrlPolicy, WebhookHost, WebhookUrl};

/// `User-Agent` of every delivery: product name and version.
pub const USER_AGENT: &str = concat!("vid-webhooks/", env!("CARGO_PKG_VERSION"));

/// Why an attempt got no usable answer. The wire spelling ([`ErrorClass::as_str`])
/// is stored in `webhook_attempts.error_class` and shown by the api.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The host name did not resolve (or resolved to nothing).
    Dns,
    /// No TCP connection to any checked address (refused, unreachable, connect timeout).
    Connect,
    /// No answer within the whole-attempt timeout.
    Timeout,
    /// The TLS handshake failed (certificate, protocol).
    Tls,
    /// The URL, or an address it resolves to, is refused by the SSRF policy. No connection was made.
    BlockedAddress,
    /// The endpoint answered 3xx; redirects are never followed.
    Redirect,
    /// The endpoint answered with a non-2xx, non-3xx status, or spoke broken HTTP.
    Http,
}

impl ErrorClass {
    /// `dns`, `connect`, `timeout`, `tls`, `blocked_address`, `redirect` or `http`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dns => "dns",
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Tls => "tls",
            Self::BlockedAddress => "blocked_address",
            Self::Redirect => "redirect",
            Self::Http => "http",
        }
    }
}

/// What the endpoint answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// The raw `Retry-After` header, if any (parsed by [`crate::retry::parse_retry_after`]).
    pub retry_after: Option<String>,
    /// The raw `Location` header, if any (recorded for redirects, never followed).
    pub location: Option<String>,
    /// The first `max_response_body_bytes` of the body, as lossy UTF-8.
    pub body: String,
}

/// The result of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint answered (any status).
    Answered(Answer),
    /// No answer; see the class.
    Failed {
        /// Why.
        class: ErrorClass,
        /// Details for the delivery log (no secrets).
        detail: String,
    },
}

impl Outcome {
    /// True for a 2xx answer: the delivery succeeded.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Answered(a) if (200..300).contains(&a.status))
    }

    /// The error class to record; `None` for a success.
    pub fn error_class(&self) -> Option<ErrorClass> {
        match self {
            Outcome::Answered(a) if (200..300).contains(&a.status) => None,
            Outcome::Answered(a) if (300..400).contains(&a.status) => Some(ErrorClass::Redirect),
            Outcome::Answered(_) => Some(ErrorClass::Http),
            Outcome::Failed { class, .. } => Some(*class),
        }
    }

    /// The HTTP status, if the endpoint answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Answered(a) => Some(a.status),
            Outcome::Failed { .. } => None,
        }
    }

    fn failed(class: ErrorClass, detail: impl Into<String>) -> Self {
        Outcome::Failed { class, detail: detail.into() }
    }
}

/// Called with every socket address the sender is about to connect to.
/// Tests use it to prove that refused addresses are never contacted.
pub type ConnectObserver = Arc<dyn Fn(SocketAddr) + Send + Sync>;

/// Sends attempts. Cheap to share behind an `Arc`.
pub struct Sender {
    policy: UrlPolicy,
    resolver: Arc<dyn Resolve>,
    tls: TlsConnector,
    connect_timeout: Duration,
    request_timeout: Duration,
    max_body: usize,
    observer: Option<ConnectObserver>,
}

/// A request to send: the endpoint URL as stored, headers, and the exact body.
#[derive(Debug, Clone)]
pub struct Request {
    /// The endpoint URL as registered (checked again here).
    pub url: String,
    /// Extra headers (the signature headers).
    pub headers: Vec<(&'static str, String)>,
    /// The body, sent byte for byte as signed.
    pub body: Bytes,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Sender {
    /// A sender applying `policy`, resolving through `resolver`, with the given
    /// timeouts and body cap. TLS trusts the Mozilla roots of `webpki-roots`.
    pub fn new(
        policy: UrlPolicy,
        resolver: Arc<dyn Resolve>,
        connect_timeout: Duration,
        request_timeout: Duration,
        max_body: usize,
        observer: Option<ConnectObserver>,
    ) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            policy,
            resolver,
            tls: TlsConnector::from(Arc::new(config)),
            connect_timeout,
            request_timeout,
            max_body,
            observer,
        })
    }

    /// Makes one attempt. Never fails: every problem is an [`Outcome::Failed`].
    pub async fn send(&self, request: Request) -> Outcome {
        let deadline = Instant::now() + self.request_timeout;
        let timeout_ms = self.request_timeout.as_millis();
        let (response, conn_task) = match tokio::time::timeout_at(deadline, self.send_head(&request, deadline)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(outcome)) => return outcome,
            Err(_) => return Outcome::failed(ErrorClass::Timeout, format!("no answer within {timeout_ms} ms")),
        };
        let status = response.status().as_u16();
        let header = |name: http::header::HeaderName| {
            response.headers().get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let retry_after = header(http::header::RETRY_AFTER);
        let location = header(http::header::LOCATION);
        let mut body = response.into_body();
        let mut buf = Vec::new();
        // The status is what counts; a body that trickles past the deadline is cut short.
        let _ = tokio::time::timeout_at(deadline, async {
            while buf.len() < self.max_body {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            let take = data.len().min(self.max_body - buf.len());
                            buf.extend_from_slice(&data[..take]);
                        }
                    }
                    _ => break,
                }
            }
        })
        .await;
        conn_task.abort();
        Outcome::Answered(Answer { status, retry_after, location, body: snippet(&buf, self.max_body) })
    }

    async fn send_head(
        &self,
        request: &Request,
        deadline: Instant,
    ) -> Result<(http::Response<hyper::body::Incoming>, tokio::task::JoinHandle<()>), Outcome> {
        let url = WebhookUrl::parse(&request.url, &self.policy).map_err(url_error)?;
        let addrs = resolve_checked(&url, &self.policy, &*self.resolver).await.map_err(url_error)?;
        let connect_deadline = deadline.min(Instant::now() + self.connect_timeout);
        let tcp = self.connect(&addrs, connect_deadline).await?;
        let io: Box<dyn Io> = if url.is_https() {
            let server_name = match url.host() {
                WebhookHost::Domain(d) => rustls::pki_types::ServerName::try_from(d.clone())
                    .map_err(|e| Outcome::failed(ErrorClass::Tls, format!("invalid TLS server name: {e}")))?,
                WebhookHost::Ip(ip) => rustls::pki_types::ServerName::IpAddress(ip_for_sni(*ip).into()),
            };
            let tls = self
                .tls
                .connect(server_name, tcp)
                .await
                .map_err(|e| Outcome::failed(ErrorClass::Tls, format!("TLS handshake failed: {e}")))?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(Pin::new(io)))
            .await
            .map_err(|e| Outcome::failed(ErrorClass::Http, format!("HTTP handshake failed: {e}")))?;
        let conn_task = tokio::spawn(async move {
            let _ = conn.await;
        });
        let host_header = match url.url().port() {
            Some(port) => format!("{}:{port}", url.host_str()),
            None => url.host_str().to_owned(),
        };
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .uri(url.path_and_query())
            .header(http::header::HOST, host_header)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::USER_AGENT, USER_AGENT)
            .header(http::header::CONTENT_LENGTH, request.body.len());
        for (name, value) in &request.headers {
            builder = builder.header(*name, value);
        }
        let req = builder
            .body(Full::new(request.body.clone()))
            .map_err(|e| Outcome::failed(ErrorClass::Http, format!("building the request: {e}")))?;
        match sender.send_request(req).await {
            Ok(response) => Ok((response, conn_task)),
            Err(e) => {
                conn_task.abort();
                Err(Outcome::failed(ErrorClass::Http, format!("no valid HTTP answer: {e}")))
            }
        }
    }

    /// Tries each checked address in order until one connects.
    async fn connect(&self, addrs: &[SocketAddr], deadline: Instant) -> Result<TcpStream, Outcome> {
        let mut errors = Vec::new();
        for addr in addrs {
            if let Some(observer) = &self.observer {
                observer(*addr);
            }
            match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => errors.push(format!("{addr}: {e}")),
                Err(_) => {
                    errors.push(format!("{addr}: connect timeout"));
                    break;
                }
            }
        }
        Err(Outcome::failed(ErrorClass::Connect, format!("could not connect: {}", errors.join("; "))))
    }
}

/// SNI is not sent for IP literals; the certificate must then carry the IP.
fn ip_for_sni(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

fn url_error(e: UrlError) -> Outcome {
    let class = match e {
        UrlError::DnsFailed { .. } | UrlError::NoAddresses { .. } => ErrorClass::Dns,
        // Everything else is a refusal by the policy (which may have changed
        // since registration): the address, the scheme, the host name.
        _ => ErrorClass::BlockedAddress,
    };
    Outcome::failed(class, format!("{}: {e}", e.code()))
}

/// The first `max` bytes as UTF-8 (invalid sequences replaced), cut at a
/// character boundary, without NUL (which PostgreSQL text refuses).
pub fn snippet(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).replace('\0', "\u{FFFD}");
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_status() {
        let answer = |status| Outcome::Answered(Answer { status, retry_after: None, location: None, body: String::new() });
        assert_eq!(answer(204).error_class(), None);
        assert!(answer(200).is_success());
        assert_eq!(answer(302).error_class(), Some(ErrorClass::Redirect));
        assert_eq!(answer(500).error_class(), Some(ErrorClass::Http));
        assert_eq!(answer(410).error_class().unwrap().as_str(), "http");
        assert!(!answer(302).is_success());
    }

    #[test]
    fn snippets_are_capped_on_char_boundaries() {
        assert_eq!(snippet(b"hello", 3), "hel");
        assert_eq!(snippet("ééé".as_bytes(), 3), "é");
        assert_eq!(snippet(b"a\0b", 10), "a\u{FFFD}b");
        assert!(snippet(&[0xff; 2000], 1024).len() <= 1024);
    }
}
