//! The built binary, killed with SIGKILL mid-run and restarted, loses
//! nothing; SIGTERM drains and exits 0.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;

fn spawn_binary(w: &World) -> Child {
    spawn_binary_with(w, &[])
}

fn spawn_binary_with(w: &World, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_webhook-dispatcher"));
    for (k, v) in vid_testkit::stack_env() {
        cmd.env(k, v);
    }
    cmd.env("VID_CONFIG_DIR", vid_testkit::repo_root().join("config"))
        .env("VID_PROFILE", "test")
        .env("VID__DATABASE__URL", &w.db_url)
        .env("VID__DATABASE__POOL_SIZE", "8")
        .env("VID__AMQP__PREFIX", &w.prefix)
        .env("VID__DISPATCHER__HEALTH_LISTEN", "127.0.0.1:0")
        // A crashed process's leases expire quickly in this test.
        .env("VID__DISPATCHER__LEASE_MS", "3000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start webhook-dispatcher")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_run_then_restarted_loses_nothing() {
    let w = World::new(&[]).await;
    // Each event: first attempt 500, then 200; answers take 200 ms so attempts are in flight.
    let rx = Receiver::start(Arc::new(|_, prior| Reply::Slow(Duration::from_millis(200), if prior == 0 { 500 } else { 200 }))).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let mut child = spawn_binary(&w);

    let mut ids = vec![];
    for _ in 0..20 {
        ids.push(w.publish().await.0);
    }
    eventually(Duration::from_secs(30), "some traffic before the kill", || async { (rx.received().len() >= 8).then_some(()) }).await;
    child.kill().unwrap(); // SIGKILL: no drain, no lease release, no ack of anything in flight
    child.wait().unwrap();
    let unfinished = w.deliveries(&endpoint).await.iter().filter(|d| d.status != "succeeded").count();
    // Events published while no dispatcher runs wait in the queue.
    for _ in 0..10 {
        ids.push(w.publish().await.0);
    }
    assert!(unfinished > 0, "the kill happened mid-run");

    let mut child = spawn_binary(&w);
    eventually(Duration::from_secs(60), "every event delivered", || async {
        let d = w.deliveries(&endpoint).await;
        (d.len() == ids.len() && d.iter().all(|d| d.status == "succeeded")).then_some(())
    })
    .await;
    let received = rx.received();
    for id in &ids {
        assert!(
            received.iter().filter(|r| r.id() == id.as_str()).count() >= 2,
            "event {id} got its failed attempt and its successful retry"
        );
    }

    // SIGTERM: drains and exits 0.
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(exit.success(), "exit status {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_attempts_finish() {
    let w = World::new(&[]).await;
    let rx = Receiver::start(Arc::new(|_, _| Reply::Slow(Duration::from_millis(1500), 200))).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let mut child = spawn_binary(&w);
    w.publish().await;
    eventually(Duration::from_secs(20), "request in flight", || async { (!rx.received().is_empty()).then_some(()) }).await;
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(exit.success(), "exit status {exit:?}");
    let d = w.deliveries(&endpoint).await;
    assert_eq!(d[0].status, "succeeded", "the in-flight attempt finished and was recorded before exit");
    assert_eq!(d[0].locked_until, None);
}

fn sigterm(child: &Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// SIGTERM while many attempts are in flight at a slow receiver: they all
/// finish within the grace period and are recorded before exit (no lease
/// left), events still queued wait for the next process, and at the end
/// every event was received exactly once: nothing lost, nothing sent twice
/// because of the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_attempts_in_flight_loses_nothing_and_sends_nothing_twice() {
    let w = World::new(&[]).await;
    let rx = Receiver::start(Arc::new(|_, _| Reply::Slow(Duration::from_millis(1500), 200))).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    // Nothing here waits for a lease to expire (the drain records or releases
    // every lease), so the lease is far above the 1.5 s answers: a lease that
    // ran out on a starved box would have a delivery sent twice.
    let env = [
        ("VID__DISPATCHER__PER_ENDPOINT_CONCURRENCY", "8"),
        ("VID__DISPATCHER__SHUTDOWN_GRACE_SECONDS", "15"),
        ("VID__DISPATCHER__LEASE_MS", "30000"),
    ];
    let child = spawn_binary_with(&w, &env);
    let mut ids = vec![];
    for _ in 0..40 {
        ids.push(w.publish().await.0);
    }
    // Several requests have reached the receiver and wait for its answer.
    eventually(Duration::from_secs(30), "attempts in flight", || async { (rx.received().len() >= 4).then_some(()) }).await;
    sigterm(&child);
    let exit = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(exit.success(), "exit status {exit:?}");

    let received_before_restart = rx.counts();
    assert!(!received_before_restart.is_empty());
    assert!(received_before_restart.len() < ids.len(), "the shutdown came mid-run");
    let deliveries = w.deliveries(&endpoint).await;
    assert!(deliveries.iter().all(|d| d.locked_until.is_none()), "no lease left behind: {deliveries:?}");
    for d in &deliveries {
        let got = received_before_restart.get(&d.event_id).copied().unwrap_or(0);
        if got > 0 {
            assert_eq!(d.status, "succeeded", "an attempt that reached the receiver was finished and recorded: {d:?}");
        } else {
            assert_eq!(d.status, "pending", "{d:?}");
        }
    }

    let child = spawn_binary_with(&w, &env);
    eventually(Duration::from_secs(90), "every event delivered", || async {
        let d = w.deliveries(&endpoint).await;
        (d.len() == ids.len() && d.iter().all(|d| d.status == "succeeded")).then_some(())
    })
    .await;
    sigterm(&child);
    let exit = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(exit.success(), "exit status {exit:?}");
    let counts = rx.counts();
    for id in &ids {
        assert_eq!(counts.get(id.as_str()).copied(), Some(1), "event {id} received exactly once");
    }
    assert_eq!(counts.len(), ids.len());
}

/// SIGTERM with a grace period shorter than the receiver's answers: the
/// unfinished attempts are aborted and their leases released at once (not
/// left to expire), so the deliveries are due again and a restarted
/// dispatcher delivers them. At least once: those may arrive twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_period_releases_the_leases() {
    let w = World::new(&[]).await;
    let rx = Receiver::start(Arc::new(
        |_, prior| {
            if prior == 0 {
                Reply::Slow(Duration::from_secs(8), 200)
            } else {
                Reply::Status(200, vec![])
            }
        },
    ))
    .await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let env = [("VID__DISPATCHER__SHUTDOWN_GRACE_SECONDS", "1"), ("VID__DISPATCHER__LEASE_MS", "600000")];
    let child = spawn_binary_with(&w, &env);
    let (id, _) = w.publish().await;
    eventually(Duration::from_secs(30), "attempt in flight", || async { (!rx.received().is_empty()).then_some(()) }).await;
    sigterm(&child);
    let exit = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(exit.success(), "exit status {exit:?}");
    let d = w.deliveries(&endpoint).await;
    assert_eq!(d[0].status, "pending");
    assert_eq!(d[0].locked_until, None, "the lease was released, not left for 10 minutes");

    let child = spawn_binary_with(&w, &env);
    eventually(Duration::from_secs(30), "delivered after the restart", || async {
        let d = w.deliveries(&endpoint).await;
        (d[0].status == "succeeded").then_some(())
    })
    .await;
    sigterm(&child);
    let _ = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait().unwrap()
    })
    .await;
    assert!(rx.counts().get(id.as_str()).copied().unwrap_or(0) >= 2);
}
