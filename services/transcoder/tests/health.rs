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
