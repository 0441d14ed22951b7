//! `source_unreachable` (issue 21 item 4: "failures get stable codes"): an
//! ingest whose source accepts no connection fails its operation with that
//! code. The real api and the real ingest worker (`vid_ingest::worker`) run
//! in-process on one RabbitMQ prefix, with the real PostgreSQL and Garage.
//! The source is a loopback port that is bound but not listening (the
//! kernel answers the SYN with a reset: connection refused); the test
//! profile's `[ingest] allow_cidrs` allows 127.0.0.0/8, so the guard lets
//! the worker try. Names resolve through an empty in-memory resolver: no
//! DNS, and nothing but that loopback port is ever connected to (the
//! worker's connect observer records every address it is handed).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::{until, TestApi};
use vid_core::operation::{Operation, OperationStatus};
use vid_netguard::StaticResolver;

/// Starts the real ingest worker on the api's RabbitMQ prefix and storage;
/// returns what its fetcher was handed to connect to, and the sender that
/// stops it.
async fn start_worker(api: &TestApi) -> (Arc<Mutex<Vec<SocketAddr>>>, tokio::sync::watch::Sender<bool>) {
    let prefix = api.state.settings.amqp.prefix.clone();
    let settings: vid_ingest::Settings =
        vid_testkit::settings(&[("amqp.prefix", prefix.as_str()), ("ingest_worker.health_listen", "127.0.0.1:0")]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let observer: vid_ingest::fetch::ConnectObserver =
        Arc::new(move |_url: &str, addrs: &[SocketAddr]| log.lock().unwrap().extend_from_slice(addrs));
    let worker =
        vid_ingest::worker::Worker::build(settings, Arc::new(StaticResolver::new()), Some(observer)).await.expect("the worker builds");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(worker.run(stopped));
    (seen, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_refuses_the_connection_fails_the_ingest_with_source_unreachable() {
    let api = TestApi::start(&[("operations.janitor_interval_seconds", "3600")]).await;
    let (seen, stop) = start_worker(&api).await;

    // Bound, never listening: connecting to it is refused for as long as `closed` lives.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = closed.local_addr().unwrap();

    let url = format!("http://{addr}/clips/gone.mp4?sig=s3cr3t");
    let resp = reqwest::Client::new()
        .post(format!("{}/ingests", api.url))
        .bearer_auth(&api.key)
        .json(&serde_json::json!({ "source_url": url }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "POST /ingests accepts a loopback URL in the test profile");
    let op: Operation = resp.json().await.unwrap();

    let client = api.client();
    let done = until(&client, &op.id, "the ingest ends", |o| o.status.is_terminal()).await;
    assert_eq!(done.status, OperationStatus::Failed, "{done:?}");
    let error = done.error.as_ref().expect("a failed operation carries its problem");
    assert_eq!((error.code.as_str(), error.status), ("source_unreachable", 502), "{error:?}");
    // The detail names the host at most: never the path or the query (a presigned URL's signature).
    let detail = error.detail.clone().unwrap_or_default();
    assert!(!detail.contains("gone.mp4") && !detail.contains("s3cr3t"), "{detail}");

    // The worker did try, and only that checked loopback address.
    assert_eq!(*seen.lock().unwrap(), vec![addr], "the fetcher was handed exactly the source's address");

    // Nothing was stored for the source: its key holds no object.
    let video = done.metadata.video_id.clone().expect("the ingest's video");
    let stored_key = {
        use diesel::prelude::*;
        use vid_db::RunQueryDsl;
        let mut conn = api.state.db.get().await.unwrap();
        vid_db::schema::videos::table
            .filter(vid_db::schema::videos::id.eq(video.as_str()))
            .select(vid_db::schema::videos::source_key)
            .first::<String>(&mut conn)
            .await
            .unwrap()
    };
    let head = api.state.s3.head_object().bucket(&api.state.settings.s3.bucket).key(&stored_key).send().await;
    assert!(head.is_err_and(|e| e.as_service_error().is_some_and(|s| s.is_not_found())), "no source object under {stored_key}");

    let _ = stop.send(true);
    drop(closed);
}
