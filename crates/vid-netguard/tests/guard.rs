//! Behavioural tests of the SSRF guard.
//!
//! NETWORK SAFETY: nothing here connects anywhere or calls the system
//! resolver on a name. Host names are answered by `StaticResolver` or by the
//! small test resolvers below; `SystemResolver` is only exercised with an IP
//! literal, which it answers without a lookup.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};

use vid_netguard::{
    check_registration, resolve_checked, Embedding, RangeKind, Resolve, ResolveFuture, StaticResolver, SystemResolver, UrlError, UrlPolicy,
    WebhookHost, WebhookUrl,
};

const PUBLIC_V4: &str = "93.184.216.34";
const PUBLIC_V6: &str = "2606:2800:220:1:248:1893:25c8:1946";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The resolver used by the table tests. Every answer is fixed here.
fn resolver() -> StaticResolver {
    StaticResolver::new()
        .with("hooks.example.com", [ip(PUBLIC_V4)])
        .with("dual.example.com", [ip(PUBLIC_V4), ip(PUBLIC_V6)])
        .with("xn--tda.example.com", [ip(PUBLIC_V4)])
        .with("dup.example.com", [ip(PUBLIC_V4), ip("::ffff:93.184.216.34"), ip(PUBLIC_V4)])
        .with("loopback.example.com", [ip("127.0.0.1")])
        .with("v6-loopback.example.com", [ip("::1")])
        .with("metadata.example.com", [ip("169.254.169.254")])
        .with("mapped.example.com", [ip("::ffff:10.0.0.1")])
        .with("ula.example.com", [ip("fd00:ec2::254")])
        .with("0x7f.0.0.1.nip.io", [ip("127.0.0.1")])
        .with("public-then-private.example.com", [ip(PUBLIC_V4), ip("10.0.0.1")])
        .with("private-then-public.example.com", [ip("192.168.0.10"), ip(PUBLIC_V4)])
        .with("v6-then-private.example.com", [ip(PUBLIC_V6), ip("::ffff:192.168.1.1")])
        .with("empty.example.com", [])
}

/// Expected refusal: error code, and for `blocked_address` the range kind.
#[derive(Debug, Clone, Copy)]
enum Want {
    Code(&'static str),
    Blocked(RangeKind),
    Embedded(RangeKind, Embedding),
}

use RangeKind as K;
use Want::{Blocked, Code, Embedded};

const MAPPED: Embedding = Embedding::Ipv4Mapped;
const NAT64: Embedding = Embedding::Nat64;
const SIX_TO_FOUR: Embedding = Embedding::SixToFour;

fn refused_cases() -> Vec<(String, Want)> {
    let long = format!("https://hooks.example.com/{}", "a".repeat(3000));
    let cases: Vec<(&str, Want)> = vec![
        // ---- IPv4 loopback, every notation (RFC 1122) ----
        ("http://127.0.0.1/", Blocked(K::Loopback)),
        ("http://127.255.255.254:8080/x", Blocked(K::Loopback)),
        ("http://2130706433/", Blocked(K::Loopback)), // decimal
        ("http://0177.0.0.1/", Blocked(K::Loopback)), // octal
        ("http://0x7f.0.0.1/", Blocked(K::Loopback)), // hex octet
        ("http://0X7F.0.0.1/", Blocked(K::Loopback)),
        ("http://0x7f000001/", Blocked(K::Loopback)),   // hex integer
        ("http://017700000001/", Blocked(K::Loopback)), // octal integer
        ("http://127.1/", Blocked(K::Loopback)),        // short form
        ("http://127.0.1/", Blocked(K::Loopback)),
        ("http://0x7f.1/", Blocked(K::Loopback)),          // short + hex
        ("http://0177.0x0.1/", Blocked(K::Loopback)),      // mixed
        ("http://0x7f.0.0.01/", Blocked(K::Loopback)),     // mixed
        ("http://127.0.0.1./", Blocked(K::Loopback)),      // trailing dot
        ("http://%31%32%37.0.0.1/", Blocked(K::Loopback)), // percent-encoded
        ("http://127.0.0.1%2e/", Blocked(K::Loopback)),
        ("http://\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}/", Blocked(K::Loopback)), // full-width
        ("HTTP://127.0.0.1:80/", Blocked(K::Loopback)),
        // ---- private (RFC 1918) ----
        ("http://10.0.0.1/", Blocked(K::Private)),
        ("http://10.1/", Blocked(K::Private)),
        ("http://167772161/", Blocked(K::Private)),
        ("http://0xa000001/", Blocked(K::Private)),
        ("http://012.0.0.1/", Blocked(K::Private)),
        ("http://10.255.255.255/", Blocked(K::Private)),
        ("http://172.16.0.1/", Blocked(K::Private)),
        ("http://172.31.255.255/", Blocked(K::Private)),
        ("http://0xac100001/", Blocked(K::Private)),
        ("http://192.168.1.1/", Blocked(K::Private)),
        ("http://3232235777/", Blocked(K::Private)),
        ("http://0300.0250.1.1/", Blocked(K::Private)),
        ("http://192.168.257/", Blocked(K::Private)),
        // ---- CGNAT (RFC 6598) ----
        ("http://100.64.0.1/", Blocked(K::SharedAddressSpace)),
        ("http://100.127.255.254/", Blocked(K::SharedAddressSpace)),
        ("http://100.100.100.200/", Blocked(K::SharedAddressSpace)), // Alibaba metadata
        // ---- link-local incl. metadata (RFC 3927) ----
        ("http://169.254.169.254/latest/meta-data/", Blocked(K::LinkLocal)),
        ("http://2852039166/", Blocked(K::LinkLocal)),
        ("http://0xa9.0xfe.0xa9.0xfe/", Blocked(K::LinkLocal)),
        ("http://0251.0376.0251.0376/", Blocked(K::LinkLocal)),
        ("http://169.254.43518/", Blocked(K::LinkLocal)),
        ("http://0xa9fea9fe/", Blocked(K::LinkLocal)),
        ("http://169.254.0.1/", Blocked(K::LinkLocal)),
        // ---- 0.0.0.0/8 (RFC 1122) ----
        ("http://0.0.0.0/", Blocked(K::ThisNetwork)),
        ("http://0/", Blocked(K::ThisNetwork)),
        ("http://0x0/", Blocked(K::ThisNetwork)),
        ("http://0.1.2.3/", Blocked(K::ThisNetwork)),
        // ---- multicast, reserved, broadcast ----
        ("http://224.0.0.1/", Blocked(K::Multicast)),
        ("http://239.255.255.250/", Blocked(K::Multicast)),
        ("http://240.0.0.1/", Blocked(K::Reserved)),
        ("http://254.255.255.255/", Blocked(K::Reserved)),
        ("http://255.255.255.255/", Blocked(K::Broadcast)),
        ("http://4294967295/", Blocked(K::Broadcast)),
        // ---- documentation (RFC 5737), benchmarking (RFC 2544), 192.0.0/24 ----
        ("http://192.0.2.1/", Blocked(K::Documentation)),
        ("http://198.51.100.7/", Blocked(K::Documentation)),
        ("http://203.0.113.9/", Blocked(K::Documentation)),
        ("http://198.18.0.1/", Blocked(K::Benchmarking)),
        ("http://198.19.255.255/", Blocked(K::Benchmarking)),
        ("http://192.0.0.1/", Blocked(K::Ipv4ProtocolAssignments)),
        ("http://192.0.0.170/", Blocked(K::Ipv4ProtocolAssignments)),
        ("http://192.88.99.1/", Blocked(K::SixToFourRelayAnycast)),
        // ---- IPv6 ----
        ("http://[::]/", Blocked(K::Unspecified)),
        ("http://[::1]/", Blocked(K::Loopback)),
        ("http://[0:0:0:0:0:0:0:1]:8080/", Blocked(K::Loopback)),
        ("http://[fc00::1]/", Blocked(K::UniqueLocal)),
        ("http://[fd00:ec2::254]/", Blocked(K::UniqueLocal)), // AWS IMDS v6
        ("http://[fe80::1]/", Blocked(K::LinkLocal)),
        ("http://[febf:ffff::1]/", Blocked(K::LinkLocal)),
        ("http://[fec0::1]/", Blocked(K::SiteLocal)),
        ("http://[ff02::1]/", Blocked(K::Multicast)),
        ("http://[ff0e::1]/", Blocked(K::Multicast)),
        ("http://[2001:db8::1]/", Blocked(K::Documentation)),
        ("http://[3fff::1]/", Blocked(K::Documentation)),
        ("http://[100::1]/", Blocked(K::Discard)),
        ("http://[2001::1]/", Blocked(K::Teredo)),
        ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", Blocked(K::Teredo)),
        ("http://[2001:2::1]/", Blocked(K::Ipv6ProtocolAssignments)),
        ("http://[64:ff9b:1::a00:1]/", Blocked(K::Nat64LocalUse)),
        ("http://[::127.0.0.1]/", Blocked(K::Ipv4Compatible)),
        ("http://[::8.8.8.8]/", Blocked(K::Ipv4Compatible)), // refused even with a global v4
        ("http://[::ffff:0:7f00:1]/", Blocked(K::NotGlobalUnicast)), // IPv4-translated (SIIT)
        ("http://[5f00::1]/", Blocked(K::NotGlobalUnicast)),
        ("http://[4000::1]/", Blocked(K::NotGlobalUnicast)),
        ("http://[1::1]/", Blocked(K::NotGlobalUnicast)),
        // ---- IPv6 embedding a refused IPv4 ----
        ("http://[::ffff:127.0.0.1]/", Embedded(K::Loopback, MAPPED)),
        ("http://[::ffff:7f00:1]/", Embedded(K::Loopback, MAPPED)),
        ("http://[0:0:0:0:0:ffff:127.0.0.1]:8080/", Embedded(K::Loopback, MAPPED)),
        ("http://[::ffff:169.254.169.254]/", Embedded(K::LinkLocal, MAPPED)),
        ("http://[::ffff:a00:1]/", Embedded(K::Private, MAPPED)),
        ("http://[::ffff:0.0.0.0]/", Embedded(K::ThisNetwork, MAPPED)),
        ("http://[64:ff9b::a9fe:a9fe]/", Embedded(K::LinkLocal, NAT64)),
        ("http://[64:ff9b::127.0.0.1]/", Embedded(K::Loopback, NAT64)),
        ("http://[64:ff9b::10.0.0.1]/", Embedded(K::Private, NAT64)),
        ("http://[2002:7f00:1::]/", Embedded(K::Loopback, SIX_TO_FOUR)),
        ("http://[2002:c0a8:101::1]/", Embedded(K::Private, SIX_TO_FOUR)),
        ("http://[2002:a9fe:a9fe::1]/", Embedded(K::LinkLocal, SIX_TO_FOUR)),
        // ---- IPv6 zone ids: not valid in URLs (WHATWG) ----
        ("http://[fe80::1%25eth0]/", Code("invalid_url")),
        ("http://[fe80::1%eth0]/", Code("invalid_url")),
        // ---- host names refused without DNS ----
        ("http://localhost/", Code("host_not_allowed")),
        ("http://LOCALHOST./", Code("host_not_allowed")),
        ("http://api.localhost/", Code("host_not_allowed")),
        ("http://printer.local/", Code("host_not_allowed")),
        ("http://api.default.svc.cluster.local/", Code("host_not_allowed")),
        ("http://metadata.google.internal/", Code("host_not_allowed")),
        ("http://router.home.arpa/", Code("host_not_allowed")),
        ("http://x.invalid/", Code("host_not_allowed")),
        ("http://metadata/", Code("host_not_allowed")),
        ("http://redis:6379/", Code("host_not_allowed")),
        // ---- host names resolving to refused addresses ----
        ("http://loopback.example.com/", Blocked(K::Loopback)),
        ("http://0x7f.0.0.1.nip.io/", Blocked(K::Loopback)),
        ("http://v6-loopback.example.com/", Blocked(K::Loopback)),
        ("http://metadata.example.com/", Blocked(K::LinkLocal)),
        ("http://mapped.example.com/", Embedded(K::Private, MAPPED)),
        ("http://ula.example.com/", Blocked(K::UniqueLocal)),
        ("http://public-then-private.example.com/", Blocked(K::Private)),
        ("http://private-then-public.example.com/", Blocked(K::Private)),
        ("http://v6-then-private.example.com/", Embedded(K::Private, MAPPED)),
        // ---- DNS failures ----
        ("http://unknown.example.com/", Code("dns_failed")),
        ("http://empty.example.com/", Code("no_addresses")),
        // ---- schemes ----
        ("ftp://hooks.example.com/", Code("scheme_not_allowed")),
        ("file:///etc/passwd", Code("scheme_not_allowed")),
        ("gopher://127.0.0.1:6379/_INFO", Code("scheme_not_allowed")),
        ("ws://hooks.example.com/", Code("scheme_not_allowed")),
        ("javascript:alert(1)", Code("scheme_not_allowed")),
        ("data:text/plain,hi", Code("scheme_not_allowed")),
        // ---- userinfo ----
        ("http://user:pass@hooks.example.com/", Code("userinfo_not_allowed")),
        ("http://user@hooks.example.com/", Code("userinfo_not_allowed")),
        ("http://:pass@hooks.example.com/", Code("userinfo_not_allowed")),
        ("http://@hooks.example.com/", Code("userinfo_not_allowed")),
        ("http://:@hooks.example.com/", Code("userinfo_not_allowed")),
        ("https://hooks.example.com@127.0.0.1/", Code("userinfo_not_allowed")),
        // ---- fragments ----
        ("http://hooks.example.com/#frag", Code("fragment_not_allowed")),
        ("http://hooks.example.com/#", Code("fragment_not_allowed")),
        // ---- malformed / ambiguous ----
        ("", Code("invalid_url")),
        ("not a url", Code("invalid_url")),
        ("/relative/path", Code("invalid_url")),
        ("hooks.example.com", Code("invalid_url")),
        ("http://", Code("invalid_url")),
        ("http:///", Code("invalid_url")),
        (" http://hooks.example.com/", Code("invalid_url")),
        ("http://hooks.example.com/\n", Code("invalid_url")),
        ("http://hooks.exa\tmple.com/", Code("invalid_url")),
        ("http://hooks.example.com\\@127.0.0.1/", Code("invalid_url")),
        ("http:/\\hooks.example.com/", Code("invalid_url")),
        ("http://1.2.3.4.5/", Code("invalid_url")),
        ("http://256.0.0.1/", Code("invalid_url")),
        ("http://4294967296/", Code("invalid_url")),
        ("http://08.0.0.1/", Code("invalid_url")),
        ("http://hooks.123/", Code("invalid_url")),
        ("http://hooks.example.com:0/", Code("invalid_url")),
        ("http://hooks.example.com:65536/", Code("invalid_url")),
        ("http://a..example.com/", Code("invalid_url")),
        ("http://.example.com/", Code("invalid_url")),
    ];
    let mut cases: Vec<(String, Want)> = cases.into_iter().map(|(u, w)| (u.to_owned(), w)).collect();
    cases.push((long, Code("invalid_url")));
    cases
}

fn check_refusal(input: &str, want: Want, err: &UrlError) -> Result<(), String> {
    let code = err.code();
    let ok = match want {
        Code(c) => code == c,
        Blocked(kind) => err.blocked().is_some_and(|b| b.kind() == kind && b.embedded.is_none()),
        Embedded(kind, via) => err.blocked().is_some_and(|b| b.kind() == kind && b.embedded.map(|e| e.0) == Some(via)),
    };
    if ok {
        // Every blocked refusal must also say so with the stable code and a
        // message naming the reason.
        if let Some(b) = err.blocked() {
            if code != "blocked_address" || !err.to_string().contains(b.kind().description()) {
                return Err(format!("{input:?}: inconsistent error {err:?} / {err}"));
            }
        }
        Ok(())
    } else {
        Err(format!("{input:?}: wanted {want:?}, got {code} ({err})"))
    }
}

#[tokio::test]
async fn refused_at_registration_with_default_policy() {
    let policy = UrlPolicy::default();
    assert!(policy.addresses.allow_cidrs.is_empty());
    let resolver = resolver();
    let mut failures = Vec::new();
    let cases = refused_cases();
    for (input, want) in &cases {
        match check_registration(input, &policy, &resolver).await {
            Ok(url) => failures.push(format!("{input:?}: accepted as {url}")),
            Err(err) => {
                if let Err(msg) = check_refusal(input, *want, &err) {
                    failures.push(msg);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[tokio::test]
async fn accepted_with_default_policy() {
    let policy = UrlPolicy::default();
    let resolver = resolver();
    // (input, normalized URL, addresses a caller may connect to)
    let cases: Vec<(&str, &str, Vec<SocketAddr>)> = vec![
        ("http://93.184.216.34/", "http://93.184.216.34/", vec![sa("93.184.216.34:80")]),
        ("https://93.184.216.34:8443/hook?x=1", "https://93.184.216.34:8443/hook?x=1", vec![sa("93.184.216.34:8443")]),
        ("http://1572395042/", "http://93.184.216.34/", vec![sa("93.184.216.34:80")]),
        ("http://0x5d.0xb8.0xd8.0x22/", "http://93.184.216.34/", vec![sa("93.184.216.34:80")]),
        ("http://8.8.8.8/", "http://8.8.8.8/", vec![sa("8.8.8.8:80")]),
        (
            "http://[2606:2800:220:1:248:1893:25c8:1946]/",
            "http://[2606:2800:220:1:248:1893:25c8:1946]/",
            vec![sa("[2606:2800:220:1:248:1893:25c8:1946]:80")],
        ),
        // IPv4-mapped global: same host, returned as plain IPv4.
        ("http://[::ffff:93.184.216.34]/", "http://[::ffff:5db8:d822]/", vec![sa("93.184.216.34:80")]),
        // NAT64 well-known prefix / 6to4 embedding a global IPv4: accepted.
        ("http://[64:ff9b::93.184.216.34]/", "http://[64:ff9b::5db8:d822]/", vec![sa("[64:ff9b::5db8:d822]:80")]),
        ("http://[2002:5db8:d822::1]/", "http://[2002:5db8:d822::1]/", vec![sa("[2002:5db8:d822::1]:80")]),
        // Just outside refused ranges.
        ("http://100.63.255.255/", "http://100.63.255.255/", vec![sa("100.63.255.255:80")]),
        ("http://100.128.0.0/", "http://100.128.0.0/", vec![sa("100.128.0.0:80")]),
        ("http://172.15.255.255/", "http://172.15.255.255/", vec![sa("172.15.255.255:80")]),
        ("http://172.32.0.0/", "http://172.32.0.0/", vec![sa("172.32.0.0:80")]),
        ("http://169.253.255.255/", "http://169.253.255.255/", vec![sa("169.253.255.255:80")]),
        ("http://198.17.255.255/", "http://198.17.255.255/", vec![sa("198.17.255.255:80")]),
        ("http://198.20.0.0/", "http://198.20.0.0/", vec![sa("198.20.0.0:80")]),
        ("http://192.0.3.1/", "http://192.0.3.1/", vec![sa("192.0.3.1:80")]),
        ("http://223.255.255.255/", "http://223.255.255.255/", vec![sa("223.255.255.255:80")]),
        ("http://11.0.0.1/", "http://11.0.0.1/", vec![sa("11.0.0.1:80")]),
        ("http://[2a00:1450:4001::1]/", "http://[2a00:1450:4001::1]/", vec![sa("[2a00:1450:4001::1]:80")]),
        // Host names via the static resolver.
        ("https://hooks.example.com/v1/events", "https://hooks.example.com/v1/events", vec![sa("93.184.216.34:443")]),
        ("HTTPS://HOOKS.Example.COM:8443/a/../b?q=1", "https://hooks.example.com:8443/b?q=1", vec![sa("93.184.216.34:8443")]),
        ("https://hooks.example.com./x", "https://hooks.example.com./x", vec![sa("93.184.216.34:443")]),
        (
            "https://dual.example.com/",
            "https://dual.example.com/",
            vec![sa("93.184.216.34:443"), sa("[2606:2800:220:1:248:1893:25c8:1946]:443")],
        ),
        ("https://\u{fc}.example.com/", "https://xn--tda.example.com/", vec![sa("93.184.216.34:443")]),
        ("https://dup.example.com/", "https://dup.example.com/", vec![sa("93.184.216.34:443")]),
    ];
    let mut failures = Vec::new();
    for (input, normalized, want_addrs) in &cases {
        let url = match check_registration(input, &policy, &resolver).await {
            Ok(url) => url,
            Err(e) => {
                failures.push(format!("{input:?}: refused: {} ({e})", e.code()));
                continue;
            }
        };
        if url.as_str() != *normalized {
            failures.push(format!("{input:?}: normalized to {url}, want {normalized}"));
        }
        match resolve_checked(&url, &policy, &resolver).await {
            Ok(addrs) if addrs == *want_addrs => {}
            other => failures.push(format!("{input:?}: resolved to {other:?}, want {want_addrs:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn url_crate_normalises_odd_ipv4_notations() {
    // What `url::Url` (WHATWG) does on its own; WebhookUrl relies on it but
    // re-checks (see the lenient parser unit tests for the fallback).
    for input in [
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://0x7f.0.0.1/",
        "http://0x7f000001/",
        "http://017700000001/",
        "http://127.1/",
        "http://0x7f.1/",
        "http://0177.0x0.1/",
        "http://127.0.0.1./",
        "http://%31%32%37.0.0.1/",
        "http://\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}/",
    ] {
        let u = url::Url::parse(input).unwrap();
        assert_eq!(u.host(), Some(url::Host::Ipv4("127.0.0.1".parse().unwrap())), "{input}");
        assert_eq!(u.as_str(), "http://127.0.0.1/", "{input}");
    }
    // Numeric-looking prefix labels of a real domain stay a domain.
    let u = url::Url::parse("http://0x7f.0.0.1.nip.io/").unwrap();
    assert_eq!(u.host(), Some(url::Host::Domain("0x7f.0.0.1.nip.io")));
    // Invalid IPv4 with a numeric last label fails instead of becoming a name.
    for input in ["http://1.2.3.4.5/", "http://256.0.0.1/", "http://hooks.123/", "http://08.0.0.1/"] {
        assert!(url::Url::parse(input).is_err(), "{input}");
    }
    // IPv6: embedded v4 forms are parsed to a real address; zone ids rejected.
    assert_eq!(url::Url::parse("http://[::ffff:127.0.0.1]/").unwrap().as_str(), "http://[::ffff:7f00:1]/");
    assert_eq!(url::Url::parse("http://[::127.0.0.1]/").unwrap().as_str(), "http://[::7f00:1]/");
    assert!(url::Url::parse("http://[fe80::1%25eth0]/").is_err());
    // Empty userinfo is silently dropped, hence the raw-authority check.
    assert_eq!(url::Url::parse("http://@example.com/").unwrap().as_str(), "http://example.com/");
    // Non-special schemes get no IPv4 normalisation at all (we refuse them).
    assert_eq!(url::Url::parse("gopher://0x7f.1/").unwrap().host_str(), Some("0x7f.1"));
}

#[tokio::test]
async fn allow_list_permits_only_listed_ranges() {
    let policy: UrlPolicy = UrlPolicy::default().with_allow_cidrs(vec!["127.0.0.0/8".parse().unwrap()]);
    let resolver =
        StaticResolver::new().with("local.example.com", [ip("127.0.0.2")]).with("half.example.com", [ip("127.0.0.2"), ip("10.0.0.1")]);

    let url = check_registration("http://127.0.0.1:9000/hook", &policy, &resolver).await.unwrap();
    assert_eq!(url.host(), &WebhookHost::Ip(ip("127.0.0.1")));
    assert_eq!(resolve_checked(&url, &policy, &resolver).await.unwrap(), vec![sa("127.0.0.1:9000")]);

    // Any notation of an allow-listed address, including the mapped form.
    for input in ["http://0x7f.1:9000/hook", "http://[::ffff:127.0.0.1]:9000/hook"] {
        let url = check_registration(input, &policy, &resolver).await.unwrap();
        assert_eq!(resolve_checked(&url, &policy, &resolver).await.unwrap(), vec![sa("127.0.0.1:9000")], "{input}");
    }
    let url = check_registration("http://local.example.com:9000/", &policy, &resolver).await.unwrap();
    assert_eq!(resolve_checked(&url, &policy, &resolver).await.unwrap(), vec![sa("127.0.0.2:9000")]);

    // Everything else is still refused.
    for (input, kind) in [
        ("http://10.0.0.1/", K::Private),
        ("http://[::1]:9000/", K::Loopback),
        ("http://169.254.169.254/", K::LinkLocal),
        ("http://half.example.com/", K::Private),
    ] {
        let err = check_registration(input, &policy, &resolver).await.unwrap_err();
        assert_eq!(err.code(), "blocked_address", "{input}");
        assert_eq!(err.blocked().unwrap().kind(), kind, "{input}");
    }

    // Without the allow-list the same URL is refused.
    let err = check_registration("http://127.0.0.1:9000/hook", &UrlPolicy::default(), &resolver).await.unwrap_err();
    assert_eq!(err.blocked().unwrap().kind(), K::Loopback);
}

#[test]
fn policy_deserializes_from_settings() {
    let p: UrlPolicy = serde_json::from_str(r#"{"require_https": true, "allow_cidrs": ["127.0.0.0/8", "fd00::/8"]}"#).unwrap();
    assert!(p.require_https);
    assert_eq!(p.addresses.allow_cidrs, vec!["127.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()]);
    assert!(p.check_ip(ip("127.9.9.9")).is_ok());
    assert!(p.check_ip(ip("fd00::1")).is_ok());
    assert!(p.check_ip(ip("10.0.0.1")).is_err());

    let empty: UrlPolicy = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, UrlPolicy::default());

    // A typo must not silently weaken the policy.
    assert!(serde_json::from_str::<UrlPolicy>(r#"{"require_http": true}"#).is_err());
    assert!(serde_json::from_str::<UrlPolicy>(r#"{"allow_cidrs": ["not-a-cidr"]}"#).is_err());

    // Round-trip.
    let back: UrlPolicy = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[tokio::test]
async fn https_required_refuses_http() {
    let strict = UrlPolicy::strict();
    let resolver = resolver();
    for input in ["http://93.184.216.34/", "http://hooks.example.com/"] {
        let err = check_registration(input, &strict, &resolver).await.unwrap_err();
        assert_eq!(err.code(), "https_required", "{input}");
    }
    assert!(check_registration("https://hooks.example.com/", &strict, &resolver).await.is_ok());

    // Re-applied at delivery if the policy got stricter after registration.
    let url = WebhookUrl::parse("http://hooks.example.com/", &UrlPolicy::default()).unwrap();
    let err = resolve_checked(&url, &strict, &resolver).await.unwrap_err();
    assert_eq!(err.code(), "https_required");
}

/// `allowed_ports` (what the network lets the dispatcher reach): other
/// ports, explicit or a scheme's default, are refused at registration with
/// `port_not_allowed`, and again at delivery if the policy narrowed since.
/// Empty means any port. Nothing is resolved or connected for a refusal.
#[tokio::test]
async fn ports_outside_allowed_ports_are_refused() {
    let web = UrlPolicy::strict().with_require_https(false).with_allowed_ports(vec![443, 80]);
    let resolver = resolver();
    for ok in ["https://hooks.example.com/", "https://hooks.example.com:443/x", "http://hooks.example.com/", "https://93.184.216.34:80/"] {
        assert!(check_registration(ok, &web, &resolver).await.is_ok(), "{ok}");
    }
    for (input, port) in
        [("https://hooks.example.com:8443/", 8443), ("http://93.184.216.34:8080/", 8080), ("https://[2606:2800::1]:22/", 22)]
    {
        let err = check_registration(input, &web, &resolver).await.unwrap_err();
        assert_eq!(err.code(), "port_not_allowed", "{input}");
        assert!(matches!(&err, UrlError::PortNotAllowed { port: p, allowed } if *p == port && allowed == &vec![443, 80]), "{err:?}");
        assert_eq!(err.to_string(), format!("port {port} is not allowed; webhook URLs may use port 80 or 443"));
    }
    let only_tls = UrlPolicy::strict().with_allowed_ports(vec![443]);
    let err = check_registration("https://hooks.example.com:444/", &only_tls, &resolver).await.unwrap_err();
    assert_eq!(err.to_string(), "port 444 is not allowed; webhook URLs may use port 443");

    // Empty: any port.
    assert!(check_registration("https://hooks.example.com:8443/", &UrlPolicy::strict(), &resolver).await.is_ok());

    // Re-applied at delivery.
    let url = WebhookUrl::parse("https://hooks.example.com:8443/", &UrlPolicy::strict()).unwrap();
    let err = resolve_checked(&url, &web, &resolver).await.unwrap_err();
    assert_eq!(err.code(), "port_not_allowed");

    // From settings.
    let p: UrlPolicy = serde_json::from_str(r#"{"allowed_ports": [443]}"#).unwrap();
    assert_eq!(p.allowed_ports, vec![443]);
    assert!(serde_json::from_str::<UrlPolicy>(r#"{"allowed_ports": [70000]}"#).is_err());
}

#[test]
fn userinfo_refused() {
    let policy = UrlPolicy::default();
    for input in [
        "https://user:secret@hooks.example.com/",
        "https://user@hooks.example.com/",
        "https://@hooks.example.com/",
        "https://93.184.216.34@127.0.0.1/",
    ] {
        let err = WebhookUrl::parse(input, &policy).unwrap_err();
        assert!(matches!(err, UrlError::UserinfoNotAllowed), "{input}: {err:?}");
        assert_eq!(err.code(), "userinfo_not_allowed");
    }
    // '@' in the path or query is fine.
    let url = WebhookUrl::parse("https://hooks.example.com/a@b?c=d@e", &policy).unwrap();
    assert_eq!(url.path_and_query(), "/a@b?c=d@e");
}

#[tokio::test]
async fn one_private_answer_among_public_ones_refuses_the_host() {
    let policy = UrlPolicy::default();
    let resolver = StaticResolver::new().with("mixed.example.com", [ip(PUBLIC_V4), ip(PUBLIC_V6), ip("10.1.2.3"), ip("8.8.8.8")]);
    let url = WebhookUrl::parse("https://mixed.example.com/hook", &policy).unwrap();
    let err = resolve_checked(&url, &policy, &resolver).await.unwrap_err();
    assert_eq!(err.code(), "blocked_address");
    assert_eq!(err.blocked().unwrap().address, ip("10.1.2.3"));
    assert_eq!(
        err.to_string(),
        "`mixed.example.com` resolves to a refused address: 10.1.2.3 is private-use \
         (10.0.0.0/8, RFC 1918); webhooks may only target globally routable addresses"
    );
}

/// Answers a public address on the first lookup and loopback afterwards,
/// like a rebinding DNS server with TTL 0.
struct Rebinding {
    calls: AtomicUsize,
}

impl Resolve for Rebinding {
    fn resolve<'a>(&'a self, _host: &'a str, port: u16) -> ResolveFuture<'a> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let ip = if n == 0 { ip(PUBLIC_V4) } else { ip("127.0.0.1") };
        Box::pin(async move { Ok(vec![SocketAddr::new(ip, port)]) })
    }
}

#[tokio::test]
async fn dns_rebinding_is_caught_at_the_next_check() {
    let policy = UrlPolicy::default();
    let resolver: std::sync::Arc<dyn Resolve> = std::sync::Arc::new(Rebinding { calls: AtomicUsize::new(0) });

    // Registration sees the public answer.
    let url = check_registration("https://rebind.example.com/hook", &policy, &*resolver).await.unwrap();
    // Delivery resolves again (through the Arc<dyn Resolve>) and gets loopback.
    let err = resolve_checked(&url, &policy, &resolver).await.unwrap_err();
    assert_eq!(err.code(), "blocked_address");
    assert_eq!(err.blocked().unwrap().kind(), K::Loopback);

    // Same with StaticResolver mutated between two deliveries.
    let resolver = StaticResolver::new().with("rebind.example.com", [ip(PUBLIC_V4)]);
    assert_eq!(resolve_checked(&url, &policy, &resolver).await.unwrap(), vec![sa("93.184.216.34:443")]);
    resolver.insert("rebind.example.com", [ip("127.0.0.1")]);
    let err = resolve_checked(&url, &policy, &resolver).await.unwrap_err();
    assert_eq!(err.blocked().unwrap().address, ip("127.0.0.1"));
}

/// Fails the test if a lookup is attempted.
struct NoLookups;

impl Resolve for NoLookups {
    fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> ResolveFuture<'a> {
        panic!("unexpected lookup of {host}")
    }
}

#[tokio::test]
async fn ip_literals_never_touch_the_resolver() {
    let policy = UrlPolicy::default();
    let url = check_registration("http://93.184.216.34:8080/", &policy, &NoLookups).await.unwrap();
    assert_eq!(resolve_checked(&url, &policy, &NoLookups).await.unwrap(), vec![sa("93.184.216.34:8080")]);
    let err = check_registration("http://[::1]/", &policy, &NoLookups).await.unwrap_err();
    assert_eq!(err.code(), "blocked_address");
}

#[tokio::test]
async fn ip_literal_rechecked_at_delivery_against_current_policy() {
    let lax = UrlPolicy::default().with_allow_cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    let url = WebhookUrl::parse("http://10.0.0.5/", &lax).unwrap();
    assert!(resolve_checked(&url, &lax, &NoLookups).await.is_ok());
    let err = resolve_checked(&url, &UrlPolicy::default(), &NoLookups).await.unwrap_err();
    assert_eq!(err.blocked().unwrap().kind(), K::Private);
}

/// Returns answers with a port different from the one asked for.
struct WrongPort;

impl Resolve for WrongPort {
    fn resolve<'a>(&'a self, _host: &'a str, _port: u16) -> ResolveFuture<'a> {
        Box::pin(async { Ok(vec![sa("93.184.216.34:22")]) })
    }
}

#[tokio::test]
async fn returned_addresses_use_the_url_port() {
    let policy = UrlPolicy::default();
    let url = WebhookUrl::parse("https://hooks.example.com/", &policy).unwrap();
    assert_eq!(resolve_checked(&url, &policy, &WrongPort).await.unwrap(), vec![sa("93.184.216.34:443")]);
}

#[tokio::test]
async fn system_resolver_answers_ip_literals_without_lookup() {
    // Only an IP literal: SystemResolver short-circuits it, no getaddrinfo.
    let addrs = SystemResolver::new().resolve("127.0.0.1", 8080).await.unwrap();
    assert_eq!(addrs, vec![sa("127.0.0.1:8080")]);
}

#[test]
fn webhook_url_accessors() {
    let policy = UrlPolicy::default();
    let url = WebhookUrl::parse("HTTPS://Hooks.Example.com/v1/hook?a=1&b=2", &policy).unwrap();
    assert_eq!(url.as_str(), "https://hooks.example.com/v1/hook?a=1&b=2");
    assert_eq!(url.scheme(), "https");
    assert!(url.is_https());
    assert_eq!(url.host(), &WebhookHost::Domain("hooks.example.com".into()));
    assert_eq!(url.host_str(), "hooks.example.com");
    assert_eq!(url.port(), 443);
    assert_eq!(url.path_and_query(), "/v1/hook?a=1&b=2");

    let url = WebhookUrl::parse("http://[2606:2800:220:1:248:1893:25c8:1946]", &policy).unwrap();
    assert_eq!(url.port(), 80);
    assert_eq!(url.path_and_query(), "/");
    assert_eq!(url.host_str(), "[2606:2800:220:1:248:1893:25c8:1946]");
    assert_eq!(url.host().to_string(), "[2606:2800:220:1:248:1893:25c8:1946]");
}

#[test]
fn messages_say_what_and_why() {
    let policy = UrlPolicy::default();
    let msg = |input: &str| WebhookUrl::parse(input, &policy).unwrap_err().to_string();
    assert_eq!(
        msg("http://2130706433/"),
        "address refused: 127.0.0.1 is loopback (127.0.0.0/8, RFC 1122); \
         webhooks may only target globally routable addresses"
    );
    assert_eq!(
        msg("http://[::ffff:169.254.169.254]/"),
        "address refused: ::ffff:169.254.169.254 is an IPv4-mapped IPv6 address (RFC 4291) \
         embedding 169.254.169.254, which is link-local (includes cloud metadata endpoints) \
         (169.254.0.0/16, RFC 3927); webhooks may only target globally routable addresses"
    );
    assert_eq!(
        msg("http://[fc00::1]/"),
        "address refused: fc00::1 is unique local (private IPv6) (fc00::/7, RFC 4193); \
         webhooks may only target globally routable addresses"
    );
    assert_eq!(msg("ftp://x.example.com/"), "scheme `ftp` is not allowed; only http and https URLs are accepted");
    assert_eq!(msg("http://localhost/"), "host `localhost` is not allowed: `localhost` names are loopback (RFC 6761 §6.3)");
    let err = WebhookUrl::parse("http://10.0.0.1/", &policy).unwrap_err();
    assert_eq!(err.blocked().unwrap().category(), "private");
}
