//! Address and URL policies.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::ranges::{check_global, BlockedAddress};

/// Which destination addresses may be connected to.
///
/// An address is refused unless it is globally routable (see
/// [`check_global`](crate::check_global), RFC 6890 special-purpose
/// registries) **or** inside one of [`allow_cidrs`](Self::allow_cidrs). The
/// allow-list is the only way to permit a non-global address (e.g. a
/// staging receiver on `10.20.0.0/16`).
///
/// Deserializes from settings as `{ "allow_cidrs": ["127.0.0.0/8"] }`;
/// unknown keys are rejected so a typo does not silently change the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AddressPolicy {
    /// CIDRs that are permitted even though they are not globally routable.
    /// Empty by default.
    pub allow_cidrs: Vec<IpNet>,
}

impl AddressPolicy {
    /// A policy permitting global addresses plus `allow_cidrs`.
    pub fn new(allow_cidrs: Vec<IpNet>) -> Self {
        Self { allow_cidrs }
    }

    /// True when `ip` is inside an allow-listed CIDR. An IPv4-mapped IPv6
    /// address (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2) also matches IPv4 CIDRs
    /// through its embedded address, since it denotes the same host. Other
    /// embedding forms (NAT64, 6to4) only match IPv6 CIDRs.
    pub fn is_allowlisted(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.allow_cidrs.iter().any(|net| net.contains(&ip) || net.contains(&canonical))
    }

    /// Decides whether `ip` may be connected to: `Ok` if allow-listed or
    /// globally routable, otherwise the reason it is refused.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), BlockedAddress> {
        if self.is_allowlisted(ip) {
            return Ok(());
        }
        check_global(ip)
    }
}

/// Policy applied to customer-supplied webhook URLs: the [`AddressPolicy`]
/// plus transport requirements.
///
/// Deserializes flat from settings, unknown keys rejected:
///
/// ```toml
/// require_https = true
/// allow_cidrs = ["10.20.0.0/16"]
/// allowed_ports = [443, 80]   # empty or absent: any port
/// ```
///
/// `Default` is `require_https = false` with an empty allow-list (global
/// addresses only) and any port. Production settings should normally set
/// `require_https = true`; see also [`UrlPolicy::strict`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "UrlPolicyRepr", into = "UrlPolicyRepr")]
pub struct UrlPolicy {
    /// Refuse `http://` URLs.
    pub require_https: bool,
    /// Which resolved or literal addresses are acceptable.
    pub addresses: AddressPolicy,
    /// The TCP ports a URL may name (explicitly or by its scheme's default,
    /// 80/443); empty means any. Set it to what the network lets the
    /// dispatcher reach (e.g. a Kubernetes egress policy allowing 80 and 443),
    /// so other ports are refused when the endpoint is registered instead of
    /// timing out at every delivery.
    pub allowed_ports: Vec<u16>,
}

impl UrlPolicy {
    /// `https` required, empty allow-list.
    pub fn strict() -> Self {
        Self { require_https: true, addresses: AddressPolicy::default(), allowed_ports: Vec::new() }
    }

    /// Builder-style: set [`require_https`](Self::require_https).
    pub fn with_require_https(mut self, require_https: bool) -> Self {
        self.require_https = require_https;
        self
    }

    /// Builder-style: replace the allow-list.
    pub fn with_allow_cidrs(mut self, allow_cidrs: Vec<IpNet>) -> Self {
        self.addresses.allow_cidrs = allow_cidrs;
        self
    }

    /// Builder-style: replace [`allowed_ports`](Self::allowed_ports) (empty: any).
    pub fn with_allowed_ports(mut self, allowed_ports: Vec<u16>) -> Self {
        self.allowed_ports = allowed_ports;
        self
    }

    /// Whether a URL may name `port`: [`UrlError::PortNotAllowed`](crate::UrlError::PortNotAllowed) if not.
    pub fn check_port(&self, port: u16) -> Result<(), crate::UrlError> {
        if self.allowed_ports.is_empty() || self.allowed_ports.contains(&port) {
            Ok(())
        } else {
            Err(crate::UrlError::PortNotAllowed { port, allowed: self.allowed_ports.clone() })
        }
    }

    /// Shorthand for [`AddressPolicy::check_ip`] on [`addresses`](Self::addresses).
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), BlockedAddress> {
        self.addresses.check_ip(ip)
    }
}

/// Flat serde representation of [`UrlPolicy`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct UrlPolicyRepr {
    require_https: bool,
    allow_cidrs: Vec<IpNet>,
    allowed_ports: Vec<u16>,
}

impl From<UrlPolicyRepr> for UrlPolicy {
    fn from(r: UrlPolicyRepr) -> Self {
        Self { require_https: r.require_https, addresses: AddressPolicy::new(r.allow_cidrs), allowed_ports: r.allowed_ports }
    }
}

impl From<UrlPolicy> for UrlPolicyRepr {
    fn from(p: UrlPolicy) -> Self {
        Self { require_https: p.require_https, allow_cidrs: p.addresses.allow_cidrs, allowed_ports: p.allowed_ports }
    }
}
