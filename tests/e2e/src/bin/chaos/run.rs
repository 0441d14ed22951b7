//! The run itself: the platform on the private instances, two receivers
//! behind their proxies, the uploads and the faults at their times, a
//! watchdog, the bounded wait for the deliveries, then the checks.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tokio::task::JoinHandle;
use vid_client::upload::Uploader;
use vid_client::Client;
use vid_core::endpoint::CreateEndpoint;
use vid_core::EndpointId;
use vid_e2e::{make_video, Stack};

use crate::checks::{verify, Ctx};
use crate::faults::{inject_all, Commands, FaultRecord};
use crate::profile::{Args, Profile, HEALING, LEASE_MS, RETRY_SCHEDULE};
use crate::proxy::Proxy;
use crate::receiver::{record_pid, ReceiverProc};
use crate::schedule::{print_schedule, schedule, FaultKind, Schedule};
use crate::shared::{Shared, UploadResult};
use crate::util::{fmt_t, free_port, sql_count, wait_200};

/// The whole run; answers whether every check passed (`Err`: the run could not be set up).
pub(crate) async fn run(args: Args, started: Instant) -> anyhow::Result<bool> {
    let profile = Profile::new(&args);
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)) % 1_000_000_000
    });
    println!("chaos: {} run, {} uploads, seed {seed} (repeat with --seed {seed})", profile.name, profile.uploads);
    let sched = schedule(seed, &profile);
    let logs = args.run_dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let pids = args.run_dir.join("children.pids");
    let clips = make_clips(&args.run_dir.join("media"), &profile)?;
    let stack = start_stack(&args, &logs, &pids).await?;
    let client = stack.client();
    let t0 = Instant::now();
    println!("chaos: load starts now, {} UTC (fault times below are from here)", chrono::Utc::now().format("%H:%M:%S"));
    let (receivers, proxies, endpoints) = start_receivers(&args, &client, &logs, &pids).await?;
    print_schedule(&sched, &args);
    let started_at = FaultKind::ALL.into_iter().map(|k| (k, tokio::sync::watch::channel(false).0)).collect();
    let shared = Arc::new(Shared {
        started: started_at,
        stack: tokio::sync::Mutex::new(stack),
        receivers: tokio::sync::Mutex::new(receivers),
        proxies,
        t0,
        findings: Mutex::default(),
        pids: pids.clone(),
    });

    // Load, faults and a watchdog, concurrently.
    let uploads = spawn_uploads(&shared, &client, &sched, &clips, &args.run_dir, t0 + profile.load + profile.ops_timeout);
    let injector = spawn_injector(&shared, &sched, &args, &endpoints);
    let watchdog = {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                shared.watch_processes().await;
            }
        })
    };
    let mut results = Vec::new();
    for u in uploads {
        results.push(u.await.unwrap_or_else(|e| UploadResult { last_error: Some(format!("task failed: {e}")), ..Default::default() }));
    }
    let faults = injector.await.context("fault injector")?;
    println!(
        "chaos: load done at {} ({} uploads), faults done; waiting for the deliveries (at most {:?})",
        fmt_t(t0.elapsed()),
        results.len(),
        profile.drain_timeout
    );

    let db = args.database_url.clone();
    let receiver_dbs: Vec<String> = shared.receivers.lock().await.iter().map(|r| r.database_url.clone()).collect();
    let drained_at = wait_settled(&db, &receiver_dbs, endpoints.len(), profile.drain_timeout, t0).await;
    shared.watch_processes().await;
    watchdog.abort();

    let ctx = Ctx {
        shared: &shared,
        client: &client,
        db: &db,
        receiver_dbs: &receiver_dbs,
        endpoints: &endpoints,
        results: &results,
        faults: &faults,
    };
    let report = verify(&ctx).await;
    let ok = report.print(&profile, seed, &faults, started.elapsed(), &args.run_dir, drained_at);
    stop(&shared).await;
    Ok(ok)
}

/// Small real videos: a few distinct clips, uploaded in turn.
fn make_clips(media: &Path, profile: &Profile) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(media)?;
    let variants = [(320, 180, 1.0), (426, 240, 1.5), (480, 270, 1.0), (640, 360, 1.2), (384, 216, 2.0)];
    let mut clips = Vec::new();
    for (i, (w, h, s)) in variants.iter().enumerate().take(profile.uploads.clamp(1, variants.len())) {
        let path = media.join(format!("clip{i}.mp4"));
        make_video(&path, *w, *h, *s, "400k");
        clips.push(path);
    }
    Ok(clips)
}

/// The platform on the private instances, with the run's retry schedule and
/// lease; returns once the api and the transcoder answer their health URLs.
async fn start_stack(args: &Args, logs: &Path, pids: &Path) -> anyhow::Result<Stack> {
    let schedule_env = RETRY_SCHEDULE.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let lease = LEASE_MS.to_string();
    let mut env = vec![
        ("VID__AMQP__URL", args.amqp_url.as_str()),
        ("VID__DISPATCHER__RETRY_SCHEDULE_SECONDS", &schedule_env),
        ("VID__DISPATCHER__LEASE_MS", &lease),
        ("VID__TELEMETRY__LEVEL", "info,lapin=warn,aws=warn"),
        ("VID__TELEMETRY__FORMAT", "json"),
    ];
    env.extend_from_slice(HEALING);
    let stack = Stack::start_on(args.database_url.clone(), logs.to_path_buf(), &env).await;
    for name in ["api", "transcoder", "webhook-dispatcher"] {
        if let Some(pid) = stack.pid(name) {
            record_pid(pids, pid);
        }
    }
    let health = format!("{}/healthz", stack.api_url);
    if !wait_200(&health, Duration::from_secs(60)).await {
        bail!("the api did not answer {health}; see {}", stack.log_dir().display());
    }
    let ready = stack.env_value("VID__TRANSCODER__HEALTH_LISTEN").map(|a| format!("http://{a}/readyz")).unwrap_or_default();
    if !wait_200(&ready, Duration::from_secs(60)).await {
        bail!("the transcoder is not ready ({ready}); see {}", stack.log_dir().display());
    }
    Ok(stack)
}

/// Two receivers, each behind its proxy, each the target of one endpoint (A, then B).
async fn start_receivers(
    args: &Args,
    client: &Client,
    logs: &Path,
    pids: &Path,
) -> anyhow::Result<(Vec<ReceiverProc>, Vec<Proxy>, Vec<EndpointId>)> {
    let db_name = args.database_url.rsplit('/').next().unwrap_or("vid").to_owned();
    let run_id = format!("chaos{}", ulid::Ulid::new().to_string().to_ascii_lowercase());
    let (mut receivers, mut proxies, mut endpoints) = (Vec::new(), Vec::new(), Vec::new());
    for name in ["a", "b"] {
        let port = free_port();
        let label = if name == "a" { "A" } else { "B" };
        let proxy = Proxy::start(label, format!("http://127.0.0.1:{port}/webhooks")).await?;
        let ep = client
            .create_endpoint(&CreateEndpoint {
                url: proxy.url(),
                description: Some(format!("chaos receiver {name}")),
                event_types: None,
                signature_format: None,
            })
            .await
            .map_err(|e| anyhow!("creating endpoint {name}: {e}"))?;
        endpoints.push(ep.endpoint.id.clone());
        let mut r = ReceiverProc {
            name: label,
            port,
            database_url: format!("{}/{db_name}_receiver_{name}", args.receiver_db_server),
            amqp_url: args.receiver_amqp_url.clone().unwrap_or_else(|| args.amqp_url.clone()),
            queue: format!("receivertest.{run_id}.{name}.events"),
            secret: ep.secret.clone(),
            log: logs.join(format!("receiver-{name}.log")),
            child: None,
            pids: pids.to_path_buf(),
        };
        r.start().await?;
        assert_eq!(proxy.upstream, r.url());
        receivers.push(r);
        proxies.push(proxy);
    }
    Ok((receivers, proxies, endpoints))
}

/// One task per planned upload, each starting at its time (a pinned upload
/// also waits for its fault to begin); all give up at `deadline`.
fn spawn_uploads(
    shared: &Shared,
    client: &Client,
    sched: &Schedule,
    clips: &[PathBuf],
    run_dir: &Path,
    deadline: Instant,
) -> Vec<JoinHandle<UploadResult>> {
    let mut uploads = Vec::new();
    for (i, planned) in sched.uploads.iter().enumerate() {
        let client = client.clone();
        let clip = clips[i % clips.len()].clone();
        let state_dir = run_dir.join("upload-state").join(i.to_string());
        let at = shared.t0 + planned.at;
        let pinned = planned.after.map(|(kind, delay)| (shared.started[&kind].subscribe(), delay));
        uploads.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some((mut started, delay)) = pinned {
                // Wait for the fault to begin (a dropped sender: go on), then the delay.
                if !*started.borrow() {
                    let _ = started.wait_for(|s| *s).await;
                    tokio::time::sleep(delay).await;
                }
            }
            upload_one(&client, &clip, &state_dir, deadline).await
        }));
    }
    uploads
}

/// The fault injector's task, with the restart commands (or why each restart is skipped).
fn spawn_injector(shared: &Arc<Shared>, sched: &Schedule, args: &Args, endpoints: &[EndpointId]) -> JoinHandle<Vec<FaultRecord>> {
    let shared = shared.clone();
    let faults = sched.faults.clone();
    let command = |cmd: &Option<String>, skip: &Option<String>, flag: &str| match (cmd, skip) {
        (Some(c), None) => Ok(c.clone()),
        (_, Some(why)) => Err(why.clone()),
        (None, None) => Err(format!("no {flag} given")),
    };
    let cmds = Commands {
        restart_pg: command(&args.postgres_restart_cmd, &args.skip_postgres_restart, "--postgres-restart-cmd"),
        restart_mq: command(&args.rabbitmq_restart_cmd, &args.skip_rabbitmq_restart, "--rabbitmq-restart-cmd"),
        reset_mq: command(&args.rabbitmq_reset_cmd, &args.skip_rabbitmq_reset, "--rabbitmq-reset-cmd"),
        db: args.database_url.clone(),
        endpoint_a: endpoints.first().map(|e| e.as_str().to_owned()).unwrap_or_default(),
    };
    tokio::spawn(async move { inject_all(shared, faults, cmds).await })
}

/// Bounded wait until every event reached both receivers and nothing is
/// pending; answers when it ended, from `t0`.
async fn wait_settled(db: &str, receiver_dbs: &[String], endpoints: usize, timeout: Duration, t0: Instant) -> Duration {
    let deadline = Instant::now() + timeout;
    let mut last_state;
    loop {
        match drain_state(db, receiver_dbs, endpoints).await {
            Ok((true, s)) => {
                last_state = s;
                break;
            }
            Ok((false, s)) => last_state = s,
            Err(e) => last_state = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            println!("chaos: bounded wait over; state: {last_state}");
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let drained_at = t0.elapsed();
    println!("chaos: settled at {} ({last_state})", fmt_t(drained_at));
    drained_at
}

/// Stops the receivers and proxies (the stack's Drop kills the services).
async fn stop(shared: &Shared) {
    for r in shared.receivers.lock().await.iter_mut() {
        r.kill();
    }
    for p in &shared.proxies {
        p.down();
    }
}

/// One upload through the SDK, retried (resuming the same upload) until it is
/// accepted, then followed until its operation is terminal.
async fn upload_one(client: &Client, clip: &Path, state_dir: &Path, deadline: Instant) -> UploadResult {
    let mut r = UploadResult::default();
    let _ = std::fs::create_dir_all(state_dir);
    let op = loop {
        match Uploader::new(client).state_dir(Some(state_dir.to_path_buf())).upload_file(clip, Some("video/mp4")).await {
            Ok(accepted) => break accepted.operation.id,
            Err(e) => {
                r.sdk_retries += 1;
                r.last_error = Some(e.to_string());
                if Instant::now() > deadline {
                    return r;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    r.operation = Some(op.clone());
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        match client.wait_operation(&op, left.min(Duration::from_secs(60)), |_| {}).await {
            Ok(o) => {
                r.status = Some(o.status);
                return r;
            }
            Err(e) => {
                if Instant::now() > deadline {
                    r.last_error = Some(e.to_string());
                    return r;
                }
                if !matches!(e, vid_client::ClientError::Timeout(_)) {
                    r.sdk_retries += 1;
                    r.last_error = Some(e.to_string());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// `(settled, summary)`: settled when the outbox is empty, every event has a
/// delivery per endpoint, none is pending, and each receiver processed every event.
async fn drain_state(db: &str, receiver_dbs: &[String], endpoints: usize) -> anyhow::Result<(bool, String)> {
    let outbox = sql_count(db, "SELECT count(*) FROM outbox").await?;
    let events = sql_count(db, "SELECT count(*) FROM events").await?;
    let deliveries = sql_count(db, "SELECT count(*) FROM webhook_deliveries").await?;
    let pending = sql_count(db, "SELECT count(*) FROM webhook_deliveries WHERE status <> 'succeeded'").await?;
    let ops_open = sql_count(db, "SELECT count(*) FROM operations WHERE status IN ('pending','running')").await?;
    let mut seen = Vec::new();
    for r in receiver_dbs {
        seen.push(sql_count(r, "SELECT count(*) FROM seen_events").await.unwrap_or(-1));
    }
    let settled =
        outbox == 0 && ops_open == 0 && deliveries == events * endpoints as i64 && pending == 0 && seen.iter().all(|s| *s >= events);
    Ok((settled, format!("events {events}, outbox {outbox}, open operations {ops_open}, deliveries {deliveries} ({pending} not succeeded), receivers processed {seen:?}")))
}
