//! `GET /healthz` (200 while the process runs), `GET /readyz` (200 while the
//! job consumer is attached to RabbitMQ, else 503) and `GET /metrics`
//! (Prometheus text format: `ingest_*` and `amqp_messages_consumed_total`).
//! `HEAD` answers like `GET` without the body (RFC 9110 §9.3.2); another
//! method on these paths is `405` with `Allow: GET, HEAD` (RFC 9110
//! §15.5.6); any other path is 404. One request per connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves on `listener` until the task is dropped.
pub fn spawn(listener: TcpListener, ready: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { continue };
            let ready = ready.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await else { return };
                let line = String::from_utf8_lossy(&buf[..n]);
                let mut words = line.split_whitespace();
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let _ = sock.write_all(answer(method, path, ready.load(Ordering::SeqCst)).as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    })
}

fn answer(method: &str, path: &str, ready: bool) -> String {
    let known = matches!(path, "/healthz" | "/readyz" | "/metrics");
    let (status, body, ctype) = if known && method != "GET" && method != "HEAD" {
        ("405 Method Not Allowed", "method not allowed: use GET or HEAD\n".to_owned(), "text/plain")
    } else {
        match path {
            "/healthz" => ("200 OK", "ok\n".to_owned(), "text/plain"),
            "/readyz" if ready => ("200 OK", "ready\n".to_owned(), "text/plain"),
            "/readyz" => ("503 Service Unavailable", "not consuming\n".to_owned(), "text/plain"),
            "/metrics" => ("200 OK", vid_infra::metrics::render(), vid_infra::metrics::CONTENT_TYPE),
            _ => ("404 Not Found", "not found\n".to_owned(), "text/plain"),
        }
    };
    let allow = if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    let len = body.len();
    let body = if method == "HEAD" { String::new() } else { body };
    format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\n{allow}Connection: close\r\n\r\n{body}")
}

#[cfg(test)]
mod tests {
    use super::answer;

    #[test]
    fn readiness_follows_the_consumer_and_other_methods_are_405() {
        assert!(answer("GET", "/readyz", true).starts_with("HTTP/1.1 200"));
        assert!(answer("GET", "/readyz", false).starts_with("HTTP/1.1 503"));
        let post = answer("POST", "/healthz", true);
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"));
        assert!(answer("GET", "/nope", true).starts_with("HTTP/1.1 404"));
        assert!(answer("HEAD", "/healthz", true).ends_with("\r\n\r\n"));
    }
}
