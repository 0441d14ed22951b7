//! `Client::wait_operation` rides out a stopping api replica: a cut
//! connection and a `503` are retried; a `404` is not.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vid_core::operation::{Operation, OperationMetadata, OperationStatus, WaitReason, WaitResponse};
use vid_core::OperationId;

/// A tiny HTTP/1.1 server on loopback: answers request `n` (0-based) with
/// `script(n)`: `None` closes the connection without a word.
async fn serve(script: impl Fn(usize) -> Option<(u16, String)> + Send + Sync + 'static) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let script = Arc::new(script);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let script = script.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let _ = stream.read(&mut buf).await; // the whole small request
                if let Some((status, body)) = script(n) {
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/{}json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        if status >= 400 { "problem+" } else { "" },
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(body.as_bytes()).await;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    (url, count)
}

fn done(id: &OperationId) -> String {
    let now = Utc::now();
    let operation = Operation {
        id: id.clone(),
        status: OperationStatus::Succeeded,
        progress: 100,
        created_at: now,
        updated_at: now,
        result: None,
        error: None,
        metadata: OperationMetadata { phase: None, video_id: None, scan: None, download: None },
    };
    serde_json::to_string(&WaitResponse { operation, reason: WaitReason::Terminal, revision: 3 }).unwrap()
}

fn problem(status: u16, code: &str) -> String {
    serde_json::json!({ "type": "about:blank", "title": code, "status": status, "code": code }).to_string()
}

#[tokio::test]
async fn a_cut_connection_and_a_503_are_retried() {
    let id = OperationId::generate();
    let body = done(&id);
    let (url, count) = serve(move |n| match n {
        0 => None,                                     // replica stopping: connection cut
        1 => Some((503, problem(503, "unavailable"))), // draining
        _ => Some((200, body.clone())),
    })
    .await;
    let client = vid_client::Client::new(&url, "key");
    let mut seen = Vec::new();
    let op = client.wait_operation(&id, Duration::from_secs(30), |o| seen.push(o.status)).await.expect("the wait rides it out");
    assert_eq!(op.status, OperationStatus::Succeeded);
    assert_eq!(seen, vec![OperationStatus::Succeeded]);
    assert_eq!(count.load(Ordering::SeqCst), 3, "two failed calls, then the answer");
}

#[tokio::test]
async fn a_404_ends_the_wait() {
    let id = OperationId::generate();
    let (url, count) = serve(|_| Some((404, problem(404, "not_found")))).await;
    let client = vid_client::Client::new(&url, "key");
    let err = client.wait_operation(&id, Duration::from_secs(30), |_| {}).await.expect_err("not found");
    assert!(!err.is_transient(), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 1, "not retried");
}
