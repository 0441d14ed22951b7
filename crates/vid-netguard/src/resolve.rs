//! Name resolution behind a dyn-compatible trait, and the checked lookup
//! that callers must connect through.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::error::UrlError;
use crate::policy::UrlPolicy;
use crate::webhook_url::{WebhookHost, WebhookUrl};

/// The future returned by [`Resolve::resolve`].
pub type ResolveFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Resolves a host name to socket addresses.
///
/// Dyn-compatible (returns a boxed future), so services can hold an
/// `Arc<dyn Resolve>` and tests can inject a [`StaticResolver`].
/// Implementations only resolve; the policy is applied by
/// [`resolve_checked`], which also overrides the port of every answer with
/// the URL's port.
pub trait Resolve: Send + Sync {
    /// Looks up `host` (a DNS name, never an IP literal when called by this
    /// crate) for `port`.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a>;
}

impl<T: Resolve + ?Sized> Resolve for &T {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        (**self).resolve(host, port)
    }
}

impl<T: Resolve + ?Sized> Resolve for Arc<T> {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        (**self).resolve(host, port)
    }
}

impl<T: Resolve + ?Sized> Resolve for Box<T> {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        (**self).resolve(host, port)
    }
}

/// Production resolver: the system resolver via [`tokio::net::lookup_host`]
/// (`getaddrinfo` on a blocking thread), with a timeout.
///
/// Names are looked up as absolute (a trailing `.` is appended), so the
/// local resolver's search domains (`/etc/resolv.conf` `search`, Kubernetes
/// `ndots:5`) can never turn a customer's name into one of ours.
#[derive(Debug, Clone, Copy)]
pub struct SystemResolver {
    timeout: Duration,
}

impl SystemResolver {
    /// Default lookup timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A resolver with [`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT).
    pub fn new() -> Self {
        Self::with_timeout(Self::DEFAULT_TIMEOUT)
    }

    /// A resolver whose lookups fail with [`io::ErrorKind::TimedOut`] after
    /// `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl Default for SystemResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        Box::pin(async move {
            if let Ok(ip) = host.parse::<IpAddr>() {
                return Ok(vec![SocketAddr::new(ip, port)]);
            }
            let absolute = if host.ends_with('.') { host.to_owned() } else { format!("{host}.") };
            let lookup = tokio::net::lookup_host((absolute.as_str(), port));
            let result = match tokio::time::timeout(self.timeout, lookup).await {
                Ok(addrs) => Ok(addrs?.collect()),
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("lookup timed out after {:?}", self.timeout))),
            };
            result
        })
    }
}

/// In-memory resolver for tests and local setups: a map host → addresses.
///
/// Host keys are case-insensitive and a trailing `.` is ignored. Unknown
/// hosts fail with [`io::ErrorKind::NotFound`]. Entries can be changed
/// through `&self` ([`insert`](Self::insert)), e.g. to simulate DNS
/// rebinding between two lookups.
#[derive(Debug, Default)]
pub struct StaticResolver {
    map: RwLock<HashMap<String, Vec<IpAddr>>>,
}

fn key(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

impl StaticResolver {
    /// An empty resolver.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builder-style [`insert`](Self::insert).
    pub fn with(self, host: &str, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.insert(host, addrs);
        self
    }

    /// Sets the answer for `host` (an empty answer is kept as empty).
    pub fn insert(&self, host: &str, addrs: impl IntoIterator<Item = IpAddr>) {
        self.map.write().unwrap_or_else(|e| e.into_inner()).insert(key(host), addrs.into_iter().collect());
    }

    /// Removes `host`, so it fails with `NotFound`.
    pub fn remove(&self, host: &str) {
        self.map.write().unwrap_or_else(|e| e.into_inner()).remove(&key(host));
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        let answer = self
            .map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key(host))
            .map(|ips| ips.iter().map(|&ip| SocketAddr::new(ip, port)).collect())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such host `{host}` (static resolver)")));
        Box::pin(std::future::ready(answer))
    }
}

/// Resolves `url` and returns the **only** addresses a caller may connect to.
///
/// * An IP-literal host is checked again against `policy` (the policy may
///   have changed since the URL was parsed) and returned as is.
/// * A domain host is resolved once with `resolver`; the URL is refused if
///   **any** answer is refused by `policy` (not just the first), or if
///   there is no answer.
/// * `policy.require_https` and `policy.allowed_ports` are re-applied.
///
/// Returned addresses carry the URL's port (the resolver's ports are
/// ignored), IPv4-mapped IPv6 answers are returned as plain IPv4
/// (`to_canonical`), and duplicates are removed, order preserved.
///
/// The webhook dispatcher must call this at every delivery and connect
/// only to the result, without resolving again, so that DNS rebinding has
/// no window between check and use.
pub async fn resolve_checked<R: Resolve + ?Sized>(url: &WebhookUrl, policy: &UrlPolicy, resolver: &R) -> Result<Vec<SocketAddr>, UrlError> {
    if policy.require_https && !url.is_https() {
        return Err(UrlError::HttpsRequired { scheme: url.scheme().to_owned() });
    }
    let port = url.port();
    policy.check_port(port)?;
    let name = match url.host() {
        WebhookHost::Ip(ip) => {
            policy.check_ip(*ip).map_err(|blocked| UrlError::BlockedAddress { host: None, blocked })?;
            return Ok(vec![SocketAddr::new(ip.to_canonical(), port)]);
        }
        WebhookHost::Domain(name) => name,
    };

    let answers = resolver.resolve(name, port).await.map_err(|source| UrlError::DnsFailed { host: name.clone(), source })?;
    if answers.is_empty() {
        return Err(UrlError::NoAddresses { host: name.clone() });
    }
    let mut approved: Vec<SocketAddr> = Vec::with_capacity(answers.len());
    for answer in answers {
        policy.check_ip(answer.ip()).map_err(|blocked| UrlError::BlockedAddress { host: Some(name.clone()), blocked })?;
        let addr = SocketAddr::new(answer.ip().to_canonical(), port);
        if !approved.contains(&addr) {
            approved.push(addr);
        }
    }
    Ok(approved)
}

/// Registration-time check: [`WebhookUrl::parse`] then [`resolve_checked`].
///
/// Returns the parsed URL to store (store [`WebhookUrl::as_str`]); the
/// addresses are discarded because delivery must resolve and check again.
pub async fn check_registration<R: Resolve + ?Sized>(input: &str, policy: &UrlPolicy, resolver: &R) -> Result<WebhookUrl, UrlError> {
    let url = WebhookUrl::parse(input, policy)?;
    resolve_checked(&url, policy, resolver).await?;
    Ok(url)
}
