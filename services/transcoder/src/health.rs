//! A tiny HTTP/1.1 health server on raw tokio: `GET /healthz` (200 while the
//! process runs) and `GET /readyz` (200 while the AMQP connection is up and
//! consuming, else 503), `GET /metrics` (Prometheus text format: everything
//! recorded through `vid_infra::metrics` in this process, then the scan
//! counters of [`crate::scan::METRICS`]). `HEAD` on each answers the same
//! status and headers without the body (RFC 9110 §9.3.2); any other method
//! on these paths is `405 Method Not Allowed` with `Allow: GET, HEAD`
//! (RFC 9110 §15.5.6). Any other path is 404, whatever the method.
//! One request per connection.
//!
//! Which process serves what: this server runs in the supervising
//! `transcoder` process, the one that consumes the queue, owns the jobs and
//! outlives them. The `transcoder work` child runs the libav work of one job
//! and records no metrics; the supervisor measures it from the child's
//! protocol lines (see `worker::record_transcode_durations`). So one page,
//! one process, nothing relayed between processes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Binds `addr` and serves until the task is dropped. Errors: the bind failed.
pub async fn serve(addr: SocketAddr, ready: Arc<AtomicBool>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(%addr, "health server listening");
    Ok(tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { continue };
            let ready = ready.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
                let line = String::from_utf8_lossy(&buf[..n]);
                let mut words = line.split_whitespace();
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let resp = answer(method, path, &ready);
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    }))
}

/// The methods every path of this server allows, as sent in `Allow`.
pub const ALLOW: &str = "GET, HEAD";

/// The whole HTTP/1.1 response to `method path`: status line, headers, and
/// the body unless the method is `HEAD`.
fn answer(method: &str, path: &str, ready: &AtomicBool) -> String {
    const TEXT: &str = "text/plain";
    let metrics;
    let (status, body, ctype) = match path {
        "/healthz" | "/readyz" | "/metrics" if method != "GET" && method != "HEAD" => {
            ("405 Method Not Allowed", "method not allowed: use GET or HEAD\n", TEXT)
        }
        "/healthz" => ("200 OK", "ok\n", TEXT),
        "/readyz" if ready.load(Ordering::SeqCst) => ("200 OK", "ready\n", TEXT),
        "/readyz" => ("503 Service Unavailable", "not ready: AMQP not connected\n", TEXT),
        "/metrics" => {
            metrics = render_metrics();
            ("200 OK", metrics.as_str(), vid_infra::metrics::CONTENT_TYPE)
        }
        _ => ("404 Not Found", "not found\n", TEXT),
    };
    let allow = if status.starts_with("405") { format!("allow: {ALLOW}\r\n") } else { String::new() };
    // HEAD: the headers GET would send, Content-Length included, and no body.
    let length = body.len();
    let body = if method == "HEAD" { "" } else { body };
    format!("HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {length}\r\n{allow}connection: close\r\n\r\n{body}")
}

/// The `/metrics` page: the `vid_infra::metrics` recorder's exposition
/// (installed here if `main` did not) followed by the scan counters.
pub fn render_metrics() -> String {
    let mut page = vid_infra::metrics::render();
    if !page.is_empty() && !page.ends_with('\n') {
        page.push('\n');
    }
    page.push_str(&crate::scan::METRICS.render());
    page
}
