//! `/healthz` (liveness: the process answers), `/readyz` (PostgreSQL
//! answers and the fan-in consumer is attached to RabbitMQ) and `/metrics`
//! (Prometheus text format, [`vid_infra::metrics::render`]: the
//! `webhook_*` and `amqp_messages_consumed_total` series), on
//! `dispatcher.health_listen`. A tiny hyper 1 server; anything else is 404.
//! `HEAD` answers like `GET` without the body; any other method on these
//! paths is `405 Method Not Allowed` with `Allow: GET, HEAD` (RFC 9110
//! §9.3.2, §15.5.6).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::fanin::BrokerUp;

/// Serves until `shutdown` turns true.
pub async fn serve(listener: TcpListener, db: vid_db::Pool, broker_up: BrokerUp, mut shutdown: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "health listener accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let db = db.clone();
        let broker_up = broker_up.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let db = db.clone();
                let broker_up = broker_up.clone();
                async move { Ok::<_, Infallible>(answer(req.method(), req.uri().path(), &db, &broker_up).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// The paths served, for the `405` check.
const PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// `GET` and `HEAD` are routed; other methods on a served path get 405.
async fn answer(method: &hyper::Method, path: &str, db: &vid_db::Pool, broker_up: &BrokerUp) -> hyper::Response<Full<Bytes>> {
    if *method == hyper::Method::HEAD {
        let (parts, _) = route(path, db, broker_up).await.into_parts();
        return hyper::Response::from_parts(parts, Full::new(Bytes::new()));
    }
    if *method != hyper::Method::GET && PATHS.contains(&path) {
        let mut response = json(405, r#"{"status":"method not allowed: use GET or HEAD"}"#.to_owned());
        response.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    route(path, db, broker_up).await
}

async fn route(path: &str, db: &vid_db::Pool, broker_up: &BrokerUp) -> hyper::Response<Full<Bytes>> {
    match path {
        "/healthz" => json(200, r#"{"status":"ok"}"#.to_owned()),
        "/readyz" => {
            let database = tokio::time::timeout(Duration::from_secs(2), database_ok(db)).await.unwrap_or(false);
            let broker = broker_up.load(Ordering::SeqCst);
            let status = if database && broker { 200 } else { 503 };
            json(status, format!(r#"{{"database":{database},"broker":{broker}}}"#))
        }
        "/metrics" => hyper::Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, vid_infra::metrics::CONTENT_TYPE)
            .body(Full::new(Bytes::from(vid_infra::metrics::render())))
            .expect("static response parts are valid"),
        _ => json(404, r#"{"status":"not found"}"#.to_owned()),
    }
}

async fn database_ok(db: &vid_db::Pool) -> bool {
    use vid_db::RunQueryDsl;
    let Ok(mut conn) = db.get().await else { return false };
    diesel::sql_query("SELECT 1").execute(&mut conn).await.is_ok()
}

fn json(status: u16, body: String) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}
