//! [`WebhookUrl`]: a customer URL that has passed every check that can be
//! done without DNS.

use std::fmt;
use std::net::IpAddr;

use url::{Position, Url};

use crate::error::UrlError;
use crate::ipv4;
use crate::policy::UrlPolicy;

/// Longest accepted input, in bytes.
pub const MAX_URL_LEN: usize = 2048;

/// Host of a [`WebhookUrl`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WebhookHost {
    /// A DNS name, lower-case ASCII (IDNA/punycode-normalized by the WHATWG
    /// URL parser). Must be resolved with
    /// [`resolve_checked`](crate::resolve_checked) before connecting.
    Domain(String),
    /// An IP literal, parsed to a real address (any IPv4 notation, bracketed
    /// IPv6). Already checked against the policy at parse time.
    Ip(IpAddr),
}

impl fmt::Display for WebhookHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WebhookHost::Domain(d) => f.write_str(d),
            WebhookHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            WebhookHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// A webhook URL accepted by a [`UrlPolicy`] ("parse, don't validate": the
/// only way to get one is [`WebhookUrl::parse`]).
///
/// Guarantees: scheme `http` or `https` (`https` if the policy requires it),
/// no userinfo, no fragment, a host, a non-zero port, and an IP-literal host
/// that the policy accepts. A domain host still has to go through
/// [`resolve_checked`](crate::resolve_checked), whose answer is the only set
/// of addresses a caller may connect to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WebhookUrl {
    url: Url,
    host: WebhookHost,
    port: u16,
}

/// Special-use DNS names refused without resolving them: they can only
/// reach our own network.
const SPECIAL_USE_SUFFIXES: &[(&str, &str)] = &[
    ("localhost", "`localhost` names are loopback (RFC 6761 §6.3)"),
    ("local", "`.local` names are multicast DNS, link-local only (RFC 6762)"),
    ("home.arpa", "`.home.arpa` names are for home networks (RFC 8375)"),
    ("internal", "`.internal` is reserved for private use (ICANN, 2024)"),
    ("invalid", "`.invalid` names never resolve (RFC 6761 §6.4)"),
];

impl WebhookUrl {
    /// Parses and checks a customer-supplied URL against `policy`.
    ///
    /// Steps, in order (the first failure is returned):
    /// 1. input is at most [`MAX_URL_LEN`] bytes and has no whitespace,
    ///    control characters or backslashes (which URL parsers disagree on) →
    ///    [`UrlError::InvalidUrl`];
    /// 2. WHATWG parse with the `url` crate → [`UrlError::InvalidUrl`];
    /// 3. scheme `http`/`https` → [`UrlError::SchemeNotAllowed`], and
    ///    `https` if `policy.require_https` → [`UrlError::HttpsRequired`];
    /// 4. no userinfo, not even an empty `@` → [`UrlError::UserinfoNotAllowed`];
    /// 5. no fragment, not even an empty `#` → [`UrlError::FragmentNotAllowed`];
    /// 6. a host and a non-zero port (default 80/443 per scheme), one of
    ///    `policy.allowed_ports` unless that is empty → [`UrlError::PortNotAllowed`];
    /// 7. IP-literal hosts are checked with [`UrlPolicy::check_ip`] →
    ///    [`UrlError::BlockedAddress`]. The WHATWG parser turns every IPv4
    ///    notation (decimal `2130706433`, octal `0177.0.0.1`, hex
    ///    `0x7f.0.0.1`/`0x7f000001`, short `127.1`, mixed, percent-encoded,
    ///    full-width digits) into an IPv4 address; as a second line of
    ///    defence a domain host that still parses as `inet_aton`-style IPv4
    ///    is checked as that address, and one ending in a numeric label is
    ///    refused as ambiguous. IPv6 zone ids are rejected by the parser;
    /// 8. domain hosts that are single-label (resolved via local search
    ///    domains) or special-use (`localhost`, `.local`, `.home.arpa`,
    ///    `.internal`, `.invalid`) → [`UrlError::HostNotAllowed`].
    pub fn parse(input: &str, policy: &UrlPolicy) -> Result<WebhookUrl, UrlError> {
        if input.is_empty() {
            return Err(UrlError::invalid("empty URL"));
        }
        if input.len() > MAX_URL_LEN {
            return Err(UrlError::invalid(format!("URL is longer than {MAX_URL_LEN} bytes")));
        }
        if let Some(c) = input.chars().find(|c| c.is_control() || c.is_whitespace()) {
            return Err(UrlError::invalid(format!("URL contains whitespace or a control character ({c:?})")));
        }
        if input.contains('\\') {
            return Err(UrlError::invalid("URL contains a backslash, which URL parsers interpret differently"));
        }

        let url = Url::parse(input).map_err(|e| UrlError::invalid(e.to_string()))?;

        match url.scheme() {
            "https" => {}
            "http" if policy.require_https => return Err(UrlError::HttpsRequired { scheme: "http".into() }),
            "http" => {}
            other => return Err(UrlError::SchemeNotAllowed { scheme: other.into() }),
        }

        // `url` drops an empty userinfo (`http://@host/`), so also look at
        // the raw authority: after `scheme:` and any number of slashes (as
        // WHATWG does for special schemes), up to the first '/', '?' or '#'
        // (backslashes were refused above).
        let raw_authority = input
            .split_once(':')
            .map(|(_, rest)| rest.trim_start_matches('/'))
            .and_then(|rest| rest.split(['/', '?', '#']).next())
            .unwrap_or("");
        if !url.username().is_empty() || url.password().is_some() || raw_authority.contains('@') {
            return Err(UrlError::UserinfoNotAllowed);
        }

        if url.fragment().is_some() {
            return Err(UrlError::FragmentNotAllowed);
        }

        let host = match url.host() {
            None => return Err(UrlError::MissingHost),
            Some(url::Host::Ipv4(ip)) => WebhookHost::Ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => WebhookHost::Ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(d)) => {
                if d.is_empty() {
                    return Err(UrlError::MissingHost);
                }
                if let Some(ip) = ipv4::parse_lenient(d) {
                    // Unreachable with a WHATWG-conforming parser; refuse
                    // either way, with the most precise reason available.
                    policy.check_ip(IpAddr::V4(ip)).map_err(|blocked| UrlError::BlockedAddress { host: None, blocked })?;
                    return Err(UrlError::invalid(format!(
                        "host `{d}` is the IPv4 address {ip} in a non-canonical notation; write it as {ip}"
                    )));
                }
                if ipv4::ends_in_number(d) {
                    return Err(UrlError::invalid(format!("host `{d}` ends in a numeric label and is not a valid IPv4 address")));
                }
                check_domain(d)?;
                WebhookHost::Domain(d.to_owned())
            }
        };

        let port = url.port_or_known_default().ok_or_else(|| UrlError::invalid("URL has no port"))?;
        if port == 0 {
            return Err(UrlError::invalid("port 0 is not allowed"));
        }
        policy.check_port(port)?;

        if let WebhookHost::Ip(ip) = host {
            policy.check_ip(ip).map_err(|blocked| UrlError::BlockedAddress { host: None, blocked })?;
        }

        Ok(WebhookUrl { url, host, port })
    }

    /// The normalized URL (WHATWG serialization).
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The normalized URL as a [`url::Url`].
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// `"http"` or `"https"`.
    pub fn scheme(&self) -> &str {
        self.url.scheme()
    }

    /// True for `https`.
    pub fn is_https(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// The host: a domain to resolve, or a checked IP literal.
    pub fn host(&self) -> &WebhookHost {
        &self.host
    }

    /// The host as it appears in the normalized URL (IPv6 in brackets), for
    /// the `Host` header. For TLS SNI use the domain of [`host`](Self::host).
    pub fn host_str(&self) -> &str {
        // Always present: checked in `parse`.
        self.url.host_str().unwrap_or_default()
    }

    /// The port, explicit or the scheme default (80/443).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Path plus `?query` (if any), e.g. `/hooks/v1?x=1`, for the request
    /// line. Never empty: at least `/`.
    pub fn path_and_query(&self) -> &str {
        &self.url[Position::BeforePath..Position::AfterQuery]
    }
}

impl fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for WebhookUrl {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Refuses host names that can only resolve inside our own network.
fn check_domain(domain: &str) -> Result<(), UrlError> {
    let name = domain.strip_suffix('.').unwrap_or(domain);
    let refuse = |reason| UrlError::HostNotAllowed { host: domain.to_owned(), reason };
    if name.is_empty() || name.split('.').any(str::is_empty) {
        return Err(UrlError::invalid(format!("host `{domain}` has an empty label")));
    }
    for (suffix, reason) in SPECIAL_USE_SUFFIXES {
        if name == *suffix || name.strip_suffix(suffix).is_some_and(|rest| rest.ends_with('.')) {
            return Err(refuse(reason));
        }
    }
    if !name.contains('.') {
        return Err(refuse("single-label names are completed with the resolver's local search domains"));
    }
    Ok(())
}
