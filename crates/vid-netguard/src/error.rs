//! Errors, each with a stable machine-readable code.

use std::io;

use crate::ranges::BlockedAddress;

/// Why a webhook URL was refused.
///
/// [`code`](UrlError::code) is stable and meant for API problem details
/// (`type`/`code` field); `Display` is a human sentence saying what was
/// refused and why, suitable for the problem `detail`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Not a well-formed absolute URL, or a form this crate refuses as
    /// ambiguous (control characters, whitespace, backslashes, numeric host
    /// names, port 0, over-long input).
    #[error("invalid URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// Scheme other than `http`/`https`.
    #[error("scheme `{scheme}` is not allowed; only http and https URLs are accepted")]
    SchemeNotAllowed {
        /// The (lower-cased) scheme that was given.
        scheme: String,
    },
    /// `http` given while the policy requires `https`.
    #[error("https is required; `{scheme}` URLs are not accepted")]
    HttpsRequired {
        /// The scheme that was given.
        scheme: String,
    },
    /// The URL's port (explicit, or its scheme's default) is not one of the
    /// policy's [`allowed_ports`](crate::UrlPolicy::allowed_ports).
    #[error("port {port} is not allowed; webhook URLs may use port {}", ports_list(.allowed))]
    PortNotAllowed {
        /// The port the URL names.
        port: u16,
        /// The ports that are allowed.
        allowed: Vec<u16>,
    },
    /// The URL carries credentials (`user:password@host`), which would leak
    /// into logs and the `Authorization` header.
    #[error("URLs with credentials (user:password@host) are not allowed")]
    UserinfoNotAllowed,
    /// The URL has a `#fragment`, which is never sent to a server.
    #[error("URLs with a #fragment are not allowed")]
    FragmentNotAllowed,
    /// The URL has no host.
    #[error("the URL has no host")]
    MissingHost,
    /// The host name is refused without resolving it (special-use or
    /// single-label names that only resolve inside our own network).
    #[error("host `{host}` is not allowed: {reason}")]
    HostNotAllowed {
        /// The host as normalized.
        host: String,
        /// Why, including the RFC.
        reason: &'static str,
    },
    /// The IP literal, or an address the host name resolved to, is not
    /// globally routable and not allow-listed.
    #[error("{}", blocked_message(.host.as_deref(), .blocked))]
    BlockedAddress {
        /// The host name that resolved to `blocked`; `None` for IP literals.
        host: Option<String>,
        /// The refused address and the reason.
        blocked: BlockedAddress,
    },
    /// Resolving the host name failed.
    #[error("DNS lookup for `{host}` failed: {source}")]
    DnsFailed {
        /// The host name.
        host: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// The host name resolved to no addresses at all.
    #[error("`{host}` resolved to no addresses")]
    NoAddresses {
        /// The host name.
        host: String,
    },
}

fn ports_list(ports: &[u16]) -> String {
    let mut ports = ports.to_vec();
    ports.sort_unstable();
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    match list.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => list.join(""),
    }
}

fn blocked_message(host: Option<&str>, blocked: &BlockedAddress) -> String {
    match host {
        Some(host) => format!("`{host}` resolves to a refused address: {blocked}; webhooks may only target globally routable addresses"),
        None => format!("address refused: {blocked}; webhooks may only target globally routable addresses"),
    }
}

impl UrlError {
    /// Stable machine-readable error code: one of `invalid_url`,
    /// `scheme_not_allowed`, `https_required`, `userinfo_not_allowed`,
    /// `fragment_not_allowed`, `missing_host`, `host_not_allowed`,
    /// `blocked_address`, `dns_failed`, `no_addresses`.
    pub fn code(&self) -> &'static str {
        match self {
            UrlError::InvalidUrl { .. } => "invalid_url",
            UrlError::SchemeNotAllowed { .. } => "scheme_not_allowed",
            UrlError::HttpsRequired { .. } => "https_required",
            UrlError::PortNotAllowed { .. } => "port_not_allowed",
            UrlError::UserinfoNotAllowed => "userinfo_not_allowed",
            UrlError::FragmentNotAllowed => "fragment_not_allowed",
            UrlError::MissingHost => "missing_host",
            UrlError::HostNotAllowed { .. } => "host_not_allowed",
            UrlError::BlockedAddress { .. } => "blocked_address",
            UrlError::DnsFailed { .. } => "dns_failed",
            UrlError::NoAddresses { .. } => "no_addresses",
        }
    }

    /// The refused address, for [`UrlError::BlockedAddress`].
    pub fn blocked(&self) -> Option<&BlockedAddress> {
        match self {
            UrlError::BlockedAddress { blocked, .. } => Some(blocked),
            _ => None,
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        UrlError::InvalidUrl { reason: reason.into() }
    }
}
