//! SSRF guard for customer-supplied webhook URLs.
//!
//! * [`WebhookUrl::parse`] turns a string into a [`WebhookUrl`] that
//!   satisfies a [`UrlPolicy`] as far as possible without DNS: scheme,
//!   userinfo, fragment, host, port, and IP-literal hosts (in every IPv4
//!   notation and IPv6 form) checked against the special-purpose address
//!   tables.
//! * [`resolve_checked`] resolves a domain host through an injected
//!   [`Resolve`] implementation and refuses the URL if **any** resolved
//!   address is refused. Its result is the only set of addresses a caller may
//!   connect to: the dispatcher connects to exactly those, with no second
//!   lookup, so DNS rebinding has no window.
//! * [`check_registration`] does both, for the API at endpoint registration.
//!
//! An address is refused unless it is globally routable ([`check_global`],
//! tables [`V4_TABLE`] / [`V6_TABLE`] written from the RFC 6890
//! special-purpose registries) or inside an allow-listed CIDR
//! ([`AddressPolicy::allow_cidrs`]), which is the only way to permit a
//! non-global address.
//!
//! ```
//! use std::net::IpAddr;
//! use vid_netguard::{check_registration, resolve_checked, StaticResolver, UrlPolicy, WebhookUrl};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let policy = UrlPolicy::default();
//! let resolver = StaticResolver::new()
//!     .with("hooks.example.com", ["93.184.216.34".parse::<IpAddr>().unwrap()])
//!     .with("evil.example.com", ["127.0.0.1".parse::<IpAddr>().unwrap()]);
//!
//! // Registration (API).
//! let url = check_registration("https://hooks.example.com/v1", &policy, &resolver).await?;
//!
//! // Delivery (dispatcher): connect only to these.
//! let addrs = resolve_checked(&url, &policy, &resolver).await?;
//! assert_eq!(addrs, ["93.184.216.34:443".parse().unwrap()]);
//!
//! let err = check_registration("http://evil.example.com/", &policy, &resolver).await.unwrap_err();
//! assert_eq!(err.code(), "blocked_address");
//!
//! let err = WebhookUrl::parse("http://0x7f.1/", &policy).unwrap_err();
//! assert_eq!(err.to_string(),
//!     "address refused: 127.0.0.1 is loopback (127.0.0.0/8, RFC 1122); \
//!      webhooks may only target globally routable addresses");
//! # Ok::<(), vid_netguard::UrlError>(())
//! # }).unwrap();
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod ipv4;
mod policy;
mod ranges;
mod resolve;
mod webhook_url;

pub use error::UrlError;
pub use policy::{AddressPolicy, UrlPolicy};
pub use ranges::{check_global, embedded_ipv4, BlockedAddress, Embedding, RangeKind, SpecialRange, GLOBAL_UNICAST, V4_TABLE, V6_TABLE};
pub use resolve::{check_registration, resolve_checked, Resolve, ResolveFuture, StaticResolver, SystemResolver};
pub use webhook_url::{WebhookHost, WebhookUrl, MAX_URL_LEN};
