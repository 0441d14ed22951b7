//! The fetcher's SSRF guard, with the evidence that refused targets are
//! never contacted: the connect observer sees every address the HTTP client
//! is handed, and only checked ones ever reach it. Names resolve through an
//! in-memory resolver (no DNS traffic); the only server is on loopback.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vid_ingest::fetch::{Fetcher, Limits};
use vid_netguard::{StaticResolver, UrlPolicy};

const LIMITS: Limits = Limits { connect_timeout: Duration::from_secs(2), idle_timeout: Duration::from_secs(2), max_redirects: 5 };

fn observed() -> (Arc<Mutex<Vec<SocketAddr>>>, vid_ingest::fetch::ConnectObserver) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    (seen, Arc::new(move |_url: &str, addrs: &[SocketAddr]| log.lock().unwrap().extend_from_slice(addrs)))
}

/// A loopback server answering every request with `302 Location: <to>`.
async fn redirector(to: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = [0u8; 2048];
            let _ = sock.read(&mut buf).await;
            let _ = sock.write_all(format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
        }
    });
    addr
}

#[tokio::test]
async fn refused_names_and_literals_are_never_connected_to() {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let resolver = StaticResolver::new()
        .with("internal.example.com", [ip("10.1.2.3")])
        .with("mixed.example.com", [ip("93.184.216.34"), ip("192.168.0.10")])
        .with("mapped.example.com", [ip("::ffff:127.0.0.1")]);
    let (seen, observer) = observed();
    // The production policy: nothing private, not even loopback.
    let fetcher = Fetcher::new(UrlPolicy::default(), Arc::new(resolver), LIMITS).with_observer(observer);
    for (url, code) in [
        ("http://internal.example.com/a.mp4", "blocked_address"),
        ("http://mixed.example.com/a.mp4", "blocked_address"),
        ("http://mapped.example.com/a.mp4", "blocked_address"),
        ("http://127.0.0.1/a.mp4", "blocked_address"),
        ("http://2130706433/a.mp4", "blocked_address"),
        ("http://[::1]/a.mp4", "blocked_address"),
        ("http://localhost/a.mp4", "host_not_allowed"),
        ("gopher://example.com/", "scheme_not_allowed"),
    ] {
        let err = fetcher.open(url).await.err().expect(url);
        assert_eq!(err.code(), code, "{url}: {err}");
    }
    assert!(seen.lock().unwrap().is_empty(), "no address was handed to the client: {:?}", seen.lock().unwrap());
}

#[tokio::test]
async fn a_redirect_to_a_private_address_is_refused_after_the_first_hop_only() {
    let addr = redirector("http://10.0.0.1/secret").await;
    let (seen, observer) = observed();
    // Loopback allowed (as in the test profile), 10/8 not.
    let policy = UrlPolicy::default().with_allow_cidrs(vec!["127.0.0.0/8".parse().unwrap()]);
    let fetcher = Fetcher::new(policy, Arc::new(StaticResolver::new()), LIMITS).with_observer(observer);
    let err = fetcher.open(&format!("http://{addr}/start")).await.err().expect("refused");
    assert_eq!(err.code(), "blocked_address", "{err}");
    assert_eq!(*seen.lock().unwrap(), vec![addr], "only the loopback server was connected to");
}

#[tokio::test]
async fn a_name_is_connected_to_only_at_its_checked_address() {
    // `media.example.com` "resolves" to the loopback redirector; the client
    // must connect there (never look the name up itself) and stop at the 6th redirect.
    let addr = redirector("/again").await;
    let resolver = StaticResolver::new().with("media.example.com", [addr.ip()]);
    let (seen, observer) = observed();
    let policy = UrlPolicy::default().with_allow_cidrs(vec!["127.0.0.0/8".parse().unwrap()]);
    let fetcher = Fetcher::new(policy, Arc::new(resolver), LIMITS).with_observer(observer);
    let err = fetcher.open(&format!("http://media.example.com:{}/start", addr.port())).await.err().expect("refused");
    assert_eq!(err.code(), "too_many_redirects", "{err}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 6, "the first request and 5 redirects: {seen:?}");
    assert!(seen.iter().all(|a| *a == addr));
}
