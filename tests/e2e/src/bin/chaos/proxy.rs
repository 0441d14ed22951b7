//! The recording proxy in front of each receiver: it records every request,
//! can answer 500 instead of forwarding, hold one request open (to kill the
//! dispatcher mid-attempt), and be taken down.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

use crate::util::note;

/// What a proxy did with one request.
#[derive(Debug, Clone)]
pub(crate) enum HitOutcome {
    /// Forwarded to the receiver, which answered `status`.
    Forwarded { status: u16, already_processed: bool },
    /// Answered 500 by the proxy (the 500 window); the receiver never saw it.
    Injected500,
    /// The receiver could not be reached; answered 502.
    ForwardFailed(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) event_id: String,
    /// This request was held open while the dispatcher was SIGKILLed.
    pub(crate) held: bool,
    pub(crate) outcome: HitOutcome,
}

#[derive(Default)]
pub(crate) struct ProxyState {
    pub(crate) fail_500: bool,
    pub(crate) hits: Vec<Hit>,
    /// Armed by the dispatcher fault: the next request is held and reported here.
    pub(crate) hold: Option<oneshot::Sender<String>>,
}

/// An HTTP proxy on loopback, registered as the webhook endpoint, forwarding
/// to a reference receiver. It records every request, can answer 500 instead
/// of forwarding, can hold one request open (to kill the dispatcher
/// mid-attempt), and can be taken down (listener and connections closed).
#[derive(Clone)]
pub(crate) struct Proxy {
    pub(crate) name: &'static str,
    pub(crate) addr: SocketAddr,
    pub(crate) upstream: String,
    pub(crate) state: Arc<Mutex<ProxyState>>,
    pub(crate) http: reqwest::Client,
    pub(crate) server: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    pub(crate) async fn start(name: &'static str, upstream: String) -> anyhow::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let proxy = Proxy { name, addr, upstream, state: Arc::default(), http, server: Arc::default() };
        proxy.serve(listener);
        Ok(proxy)
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/webhooks", self.addr)
    }

    pub(crate) fn serve(&self, listener: tokio::net::TcpListener) {
        let this = self.clone();
        let task = tokio::spawn(async move {
            // Connection tasks live in this set: aborting the server task drops
            // the set, which aborts them, so `down` closes every connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let this = this.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let this = this.clone();
                        // In its own task: a request held while the dispatcher is killed
                        // is still forwarded and recorded after its connection is gone.
                        async move {
                            let answer = tokio::spawn(async move { this.handle(req).await }).await;
                            Ok::<_, hyper::Error>(
                                answer.unwrap_or_else(|_| Response::builder().status(500).body(Full::new(Bytes::new())).unwrap()),
                            )
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        *self.server.lock().unwrap() = Some(task);
    }

    /// Closes the port and every open connection.
    pub(crate) fn down(&self) {
        if let Some(t) = self.server.lock().unwrap().take() {
            t.abort();
        }
    }

    /// Listens again on the same port.
    pub(crate) async fn up(&self) -> anyhow::Result<()> {
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    note(&format!("rebinding {}: {e}; retrying", self.addr));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("rebinding {}", self.addr)),
            }
        };
        self.serve(listener);
        Ok(())
    }

    pub(crate) async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let headers = req.headers().clone();
        let event_id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let (fail, hold) = {
            let mut s = self.state.lock().unwrap();
            (s.fail_500, s.hold.take())
        };
        let held = hold.is_some();
        if let Some(tx) = hold {
            // The dispatcher is killed while this request is open.
            let _ = tx.send(event_id.clone());
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let (outcome, status, text) = if fail && !held {
            (HitOutcome::Injected500, 500, Bytes::from_static(b"{\"error\":\"chaos: answering 500\"}"))
        } else {
            let mut fwd = self.http.post(&self.upstream).body(body);
            for (k, v) in headers.iter() {
                if !matches!(k.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
                    fwd = fwd.header(k.clone(), v.clone());
                }
            }
            match fwd.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.bytes().await.unwrap_or_default();
                    let already = String::from_utf8_lossy(&text).contains("already_processed");
                    (HitOutcome::Forwarded { status, already_processed: already }, status, text)
                }
                Err(e) => {
                    (HitOutcome::ForwardFailed(e.to_string()), 502, Bytes::from(format!("{{\"error\":\"receiver unreachable: {e}\"}}")))
                }
            }
        };
        self.state.lock().unwrap().hits.push(Hit { event_id, held, outcome });
        Response::builder().status(status).header("content-type", "application/json").body(Full::new(text)).unwrap()
    }

    pub(crate) fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }

    /// How many requests this proxy answered 500 itself (receiver B's window).
    pub(crate) fn injected_500(&self) -> usize {
        self.state.lock().unwrap().hits.iter().filter(|h| matches!(h.outcome, HitOutcome::Injected500)).count()
    }
}
