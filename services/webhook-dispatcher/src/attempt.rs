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
//! - connections are kept alive and reused per scheme/host/port (see
//!   [`Sender`]): a new connection is only ever opened to an address checked
//!   for the attempt that opens it, and a pooled one was opened that way too.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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
    /// The `Location` header, if any (recorded for redirects, never
    /// followed), cut to [`MAX_LOCATION_BYTES`].
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

    /// The `outcome` label of `webhook_delivery_attempts_total`: `succeeded`;
    /// `http_1xx`, `http_4xx`, `http_5xx` (any other status class likewise);
    /// `redirect` for 3xx; else the error class (`timeout`, `connect`, `dns`,
    /// `tls`, `blocked_address`, `http` for a broken HTTP exchange).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Outcome::Answered(a) => match a.status {
                200..=299 => "succeeded",
                300..=399 => "redirect",
                100..=199 => "http_1xx",
                400..=499 => "http_4xx",
                500..=599 => "http_5xx",
                _ => "http_other",
            },
            Outcome::Failed { class, .. } => class.as_str(),
        }
    }

    fn failed(class: ErrorClass, detail: impl Into<String>) -> Self {
        Outcome::Failed { class, detail: detail.into() }
    }
}

/// Called with every socket address the sender is about to connect to.
/// Tests use it to prove that refused addresses are never contacted.
pub type ConnectObserver = Arc<dyn Fn(SocketAddr) + Send + Sync>;

/// Idle keep-alive connections are closed after this long.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends attempts over a keep-alive connection pool. Cheap to share behind an `Arc`.
///
/// The pool is hyper-util's legacy [`Client`] (keyed by scheme, host and
/// port, HTTP/1.1 only) over [`CheckedConnector`], which connects only to
/// the addresses checked for the attempt that asked for the connection. An
/// idle pooled connection is reused by later attempts to the same host: it
/// was opened to an address that passed the check then, and each attempt
/// still checks the URL and its resolution first (a refused resolution
/// never reaches the pool).
pub struct Sender {
    policy: UrlPolicy,
    resolver: Arc<dyn Resolve>,
    client: Client<CheckedConnector, Full<Bytes>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    max_body: usize,
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

/// What the connector may connect to for the attempt being sent: the
/// addresses [`resolve_checked`] returned, the TLS server name, and the
/// connect deadline. Set with [`CHECKED`] around the client's request
/// future, read synchronously by [`CheckedConnector`] when the pool asks for
/// a new connection (hyper-util calls the connector inside that future).
#[derive(Clone)]
struct Checked {
    addrs: Arc<[SocketAddr]>,
    server_name: Option<rustls::pki_types::ServerName<'static>>,
    connect_deadline: Instant,
}

tokio::task_local! {
    static CHECKED: Checked;
}

/// The connector behind the pool: TCP to the checked addresses only (in
/// order, until one connects), then TLS for `https`. Without checked
/// addresses in scope it refuses to connect (fails closed).
#[derive(Clone)]
struct CheckedConnector {
    tls: TlsConnector,
    observer: Option<ConnectObserver>,
}

/// Why the connector could not give a connection; carried through the
/// client's error chain so the attempt gets the right [`ErrorClass`].
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
struct ConnectError {
    class: ErrorClass,
    detail: String,
}

/// A plain or TLS connection, as the pool holds it.
enum Stream {
    /// `http://`
    Plain(TcpStream),
    /// `https://`
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl tower_service::Service<http::Uri> for CheckedConnector {
    type Response = TokioIo<Stream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<Stream>, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: http::Uri) -> Self::Future {
        // Read now, in the attempt's task: the future below may be finished
        // in the background (hyper-util spawns a started connect whose
        // request was served by a pooled connection meanwhile).
        let checked = CHECKED.try_with(Checked::clone).ok();
        let (tls, observer) = (self.tls.clone(), self.observer.clone());
        Box::pin(async move {
            let Some(checked) = checked else {
                return Err(ConnectError { class: ErrorClass::BlockedAddress, detail: "no checked addresses for this connection".into() });
            };
            let tcp = connect_checked(&checked.addrs, checked.connect_deadline, observer.as_ref()).await?;
            let stream = if dst.scheme() == Some(&http::uri::Scheme::HTTPS) {
                let server_name =
                    checked.server_name.ok_or_else(|| ConnectError { class: ErrorClass::Tls, detail: "no TLS server name".into() })?;
                let tls = tls
                    .connect(server_name, tcp)
                    .await
                    .map_err(|e| ConnectError { class: ErrorClass::Tls, detail: format!("TLS handshake failed: {e}") })?;
                Stream::Tls(Box::new(tls))
            } else {
                Stream::Plain(tcp)
            };
            Ok(TokioIo::new(stream))
        })
    }
}

/// Tries each checked address in order until one connects.
async fn connect_checked(addrs: &[SocketAddr], deadline: Instant, observer: Option<&ConnectObserver>) -> Result<TcpStream, ConnectError> {
    let mut errors = Vec::new();
    for addr in addrs {
        if let Some(observer) = observer {
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
    Err(ConnectError { class: ErrorClass::Connect, detail: format!("could not connect: {}", errors.join("; ")) })
}

impl Sender {
    /// A sender applying `policy`, resolving through `resolver`, with the given
    /// timeouts and body cap, keeping at most `max_idle_per_host` idle
    /// connections per scheme/host/port. TLS trusts the Mozilla roots of
    /// `webpki-roots`.
    pub fn new(
        policy: UrlPolicy,
        resolver: Arc<dyn Resolve>,
        connect_timeout: Duration,
        request_timeout: Duration,
        max_body: usize,
        max_idle_per_host: usize,
        observer: Option<ConnectObserver>,
    ) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = CheckedConnector { tls: TlsConnector::from(Arc::new(config)), observer };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(Self { policy, resolver, client, connect_timeout, request_timeout, max_body })
    }

    /// Makes one attempt. Never fails: every problem is an [`Outcome::Failed`].
    pub async fn send(&self, request: Request) -> Outcome {
        let deadline = Instant::now() + self.request_timeout;
        let timeout_ms = self.request_timeout.as_millis();
        let response = match tokio::time::timeout_at(deadline, self.send_head(&request, deadline)).await {
            Ok(Ok(response)) => response,
            Ok(Err(outcome)) => return outcome,
            Err(_) => return Outcome::failed(ErrorClass::Timeout, format!("no answer within {timeout_ms} ms")),
        };
        let status = response.status().as_u16();
        let header =
            |name: http::header::HeaderName| response.headers().get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let retry_after = header(http::header::RETRY_AFTER);
        // Kept for the delivery log (a redirect is not followed): capped like
        // the body, so a receiver cannot store megabytes per attempt through it.
        let location = header(http::header::LOCATION).map(|l| snippet(l.as_bytes(), MAX_LOCATION_BYTES));
        let mut body = response.into_body();
        let mut buf = Vec::new();
        // The status is what counts; a body that trickles past the deadline is
        // cut short. A body read to its end frees the connection for reuse; one
        // cut short closes it when dropped.
        let _ = tokio::time::timeout_at(deadline, async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    let take = data.len().min(self.max_body - buf.len());
                    buf.extend_from_slice(&data[..take]);
                    if take < data.len() {
                        break;
                    }
                }
            }
        })
        .await;
        Outcome::Answered(Answer { status, retry_after, location, body: snippet(&buf, self.max_body) })
    }

    async fn send_head(&self, request: &Request, deadline: Instant) -> Result<http::Response<hyper::body::Incoming>, Outcome> {
        let url = WebhookUrl::parse(&request.url, &self.policy).map_err(url_error)?;
        let addrs = resolve_checked(&url, &self.policy, &*self.resolver).await.map_err(url_error)?;
        let server_name = if url.is_https() {
            Some(match url.host() {
                WebhookHost::Domain(d) => rustls::pki_types::ServerName::try_from(d.clone())
                    .map_err(|e| Outcome::failed(ErrorClass::Tls, format!("invalid TLS server name: {e}")))?,
                WebhookHost::Ip(ip) => rustls::pki_types::ServerName::IpAddress(ip_for_sni(*ip).into()),
            })
        } else {
            None
        };
        let checked = Checked { addrs: addrs.into(), server_name, connect_deadline: deadline.min(Instant::now() + self.connect_timeout) };
        let uri: http::Uri =
            url.url().as_str().parse().map_err(|e| Outcome::failed(ErrorClass::BlockedAddress, format!("unusable URL: {e}")))?;
        let host_header = match url.url().port() {
            Some(port) => format!("{}:{port}", url.host_str()),
            None => url.host_str().to_owned(),
        };
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .uri(uri)
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
        CHECKED.scope(checked, self.client.request(req)).await.map_err(client_error)
    }
}

/// Classifies a client error: the connector's own class if it failed, else
/// a broken HTTP exchange.
fn client_error(e: hyper_util::client::legacy::Error) -> Outcome {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            return Outcome::failed(c.class, c.detail.clone());
        }
        source = s.source();
    }
    let detail = match std::error::Error::source(&e) {
        Some(s) => format!("no valid HTTP answer: {e}: {s}"),
        None => format!("no valid HTTP answer: {e}"),
    };
    Outcome::failed(ErrorClass::Http, detail)
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

/// The most of a redirect's `Location` kept in the delivery log, in bytes.
pub const MAX_LOCATION_BYTES: usize = 512;

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
