//! `/healthz` and `/readyz` over real TCP.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.lines().next().unwrap().to_owned()
}

#[tokio::test]
async fn health_and_readiness() {
    // Find a free port, then serve on it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let ready = Arc::new(AtomicBool::new(false));
    let _h = vid_transcoder::health::serve(addr, ready.clone()).await.unwrap();
    assert_eq!(get(addr, "/healthz").await, "HTTP/1.1 200 OK");
    assert_eq!(get(addr, "/readyz").await, "HTTP/1.1 503 Service Unavailable");
    ready.store(true, Ordering::SeqCst);
    assert_eq!(get(addr, "/readyz").await, "HTTP/1.1 200 OK");
    assert_eq!(get(addr, "/nope").await, "HTTP/1.1 404 Not Found");
}

#[tokio::test]
async fn metrics_page_has_the_facade_metrics_and_the_scan_counters() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let _h = vid_transcoder::health::serve(addr, Arc::new(AtomicBool::new(true))).await.unwrap();
    vid_infra::metrics::install();
    vid_infra::metrics::counter!("transcode_jobs_total", "outcome" => "health_test").increment(2);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains(&format!("content-type: {}", vid_infra::metrics::CONTENT_TYPE)), "{out}");
    assert!(out.contains("transcode_jobs_total{outcome=\"health_test\"} 2"), "{out}");
    assert!(out.contains("# TYPE vid_transcoder_scans_total counter"), "{out}");
}

/// The whole response to one raw request line.
async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// RFC 9110 §15.5.6: a method the path does not support is `405` with the
/// `Allow` header; `HEAD` is `GET` without the body (§9.3.2); unknown paths
/// stay `404` whatever the method.
#[tokio::test]
async fn other_methods_are_405_with_allow_and_head_is_get_without_a_body() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let _h = vid_transcoder::health::serve(addr, Arc::new(AtomicBool::new(true))).await.unwrap();
    for path in ["/healthz", "/readyz", "/metrics"] {
        for method in ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"] {
            let out = request(addr, method, path).await;
            assert!(out.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{method} {path}: {out}");
            assert!(out.to_ascii_lowercase().contains("\r\nallow: get, head\r\n"), "{method} {path}: {out}");
        }
        let get = request(addr, "GET", path).await;
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "GET {path}: {get}");
        let head = request(addr, "HEAD", path).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "HEAD {path}: {head}");
        let (head_headers, head_body) = head.split_once("\r\n\r\n").unwrap();
        assert_eq!(head_body, "", "HEAD {path} sent a body");
        assert!(!head_headers.to_ascii_lowercase().contains("allow:"), "{head}");
        if path != "/metrics" {
            // Same headers as GET (the metrics page may change between the two).
            assert_eq!(head_headers, get.split_once("\r\n\r\n").unwrap().0, "HEAD {path}");
        }
    }
    for method in ["GET", "HEAD", "POST", "DELETE"] {
        let out = request(addr, method, "/nope").await;
        assert!(out.starts_with("HTTP/1.1 404 Not Found\r\n"), "{method} /nope: {out}");
        assert!(!out.to_ascii_lowercase().contains("allow:"), "{out}");
    }
}
