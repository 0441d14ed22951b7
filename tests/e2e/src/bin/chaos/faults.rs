//! Injecting the faults: kills (each waits for work in flight first, then
//! restarts the service), restarts of RabbitMQ and PostgreSQL (by the
//! commands chaos.sh passes), the reset of the platform's RabbitMQ node (it
//! loses every queue and message; waits for messages in flight first), and
//! the two receiver windows.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::receiver::record_pid;
use crate::schedule::{FaultKind, Planned};
use crate::shared::Shared;
use crate::util::{fmt_t, sql, unanswered_attempts, wait_200};

/// A fault as it happened.
#[derive(Debug, Clone)]
pub(crate) struct FaultRecord {
    pub(crate) kind: FaultKind,
    pub(crate) at: Duration,
    pub(crate) ended: Duration,
    pub(crate) detail: String,
    /// Not injected, and why.
    pub(crate) skipped: Option<String>,
    /// Injection itself failed (a check fails).
    pub(crate) error: Option<String>,
}

/// Runs the faults in order, each at its time (or when the previous one is
/// over, if later). Windows run in the background; point faults in sequence.
/// `cmds`: the restart and reset commands, or why each is skipped.
pub(crate) async fn inject_all(shared: Arc<Shared>, faults: Vec<Planned>, cmds: Commands) -> Vec<FaultRecord> {
    let mut records = Vec::new();
    let mut windows = Vec::new();
    for f in faults {
        tokio::time::sleep_until((shared.t0 + f.at).into()).await;
        match f.kind {
            FaultKind::ReceiverDown | FaultKind::Receiver500 => {
                let (shared, db, a) = (shared.clone(), cmds.db.clone(), cmds.endpoint_a.clone());
                windows.push(tokio::spawn(async move { window(&shared, &f, &db, &a).await }));
            }
            FaultKind::RestartPostgres => records.push(restart(&shared, &f, &cmds.restart_pg, "").await),
            FaultKind::RestartRabbitmq => records.push(restart(&shared, &f, &cmds.restart_mq, "").await),
            FaultKind::ResetRabbitmq => {
                let met = match &cmds.reset_mq {
                    Ok(_) => wait_for_messages(&shared, &cmds.db).await,
                    Err(_) => String::new(),
                };
                records.push(restart(&shared, &f, &cmds.reset_mq, &met).await);
                thaw(&shared).await;
            }
            FaultKind::KillApi | FaultKind::KillTranscoder | FaultKind::KillDispatcher => records.push(kill(&shared, &f).await),
        }
    }
    for w in windows {
        if let Ok(r) = w.await {
            records.push(r);
        }
    }
    records.sort_by_key(|r| r.at);
    records
}

/// The commands of the restart and reset faults (`Err`: why it is skipped),
/// and the platform's database (the reset looks there for work in flight).
pub(crate) struct Commands {
    pub(crate) restart_pg: Result<String, String>,
    pub(crate) restart_mq: Result<String, String>,
    pub(crate) reset_mq: Result<String, String>,
    pub(crate) db: String,
    /// Receiver A's endpoint (its down window waits for a refused attempt there).
    pub(crate) endpoint_a: String,
}

/// Restarts RabbitMQ or PostgreSQL, or resets RabbitMQ, with `cmd` (the
/// seconds to stay stopped are its last argument), or records why it is
/// skipped. `met`: what the fault met (put in front of the detail).
async fn restart(shared: &Shared, f: &Planned, cmd: &Result<String, String>, met: &str) -> FaultRecord {
    let kind = f.kind;
    let at = shared.t0.elapsed();
    let mut rec = FaultRecord { kind, at, ended: at, detail: String::new(), skipped: None, error: None };
    let cmd = match cmd {
        Ok(c) => c,
        Err(why) => {
            rec.skipped = Some(why.clone());
            println!("chaos: {} {}: SKIPPED ({why})", fmt_t(at), kind.label());
            return rec;
        }
    };
    println!("chaos: {} {} ...", fmt_t(at), kind.label());
    if f.kind != FaultKind::ResetRabbitmq {
        shared.started[&kind].send_replace(true);
    }
    // The command gets the seconds to stay stopped as its last argument.
    let cmd = format!("{cmd} {:.1}", f.length.as_secs_f64());
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("bash").args(["-c", &cmd]).stdin(Stdio::null()).output(),
    )
    .await;
    rec.ended = shared.t0.elapsed();
    match out {
        Ok(Ok(o)) if o.status.success() => {
            rec.detail = format!(
                "{met}stopped, kept down {:.1} s, started again; {:.1} s in all",
                f.length.as_secs_f64(),
                (rec.ended - at).as_secs_f64()
            )
        }
        Ok(Ok(o)) => rec.error = Some(format!("restart command failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim())),
        Ok(Err(e)) => rec.error = Some(format!("restart command did not run: {e}")),
        Err(_) => rec.error = Some("restart command took more than 180 s".into()),
    }
    println!("chaos: {} {}: {}", fmt_t(rec.ended), kind.label(), rec.error.as_deref().unwrap_or(&rec.detail));
    rec
}

/// SIGKILLs a service once it has work in flight (the transcoder a job, the
/// dispatcher an open request), keeps it down for the planned time, and
/// starts it again.
async fn kill(shared: &Shared, f: &Planned) -> FaultRecord {
    let name: &'static str = match f.kind {
        FaultKind::KillApi => "api",
        FaultKind::KillTranscoder => "transcoder",
        _ => "webhook-dispatcher",
    };
    let detail = match f.kind {
        FaultKind::KillTranscoder => wait_for_job(shared, f.kind).await,
        FaultKind::KillDispatcher => hold_an_attempt(shared, f.kind).await,
        _ => String::new(),
    };
    shared.started[&f.kind].send_replace(true);
    let at = shared.t0.elapsed();
    shared.stack.lock().await.kill(name);
    println!("chaos: {} SIGKILL {name} {detail}", fmt_t(at));
    tokio::time::sleep(f.length).await;
    let error = respawn(shared, name).await;
    let ended = shared.t0.elapsed();
    println!("chaos: {} restarted {name} (down {:.1} s)", fmt_t(ended), (ended - at).as_secs_f64());
    FaultRecord {
        kind: f.kind,
        at,
        ended,
        detail: format!("{detail}; restarted after {:.1} s", (ended - at).as_secs_f64()),
        skipped: None,
        error,
    }
}

/// Waits (at most 60 s) until the transcoder holds a job: its work dir has
/// `<operation id>/`. Answers what the kill met.
async fn wait_for_job(shared: &Shared, kind: FaultKind) -> String {
    let work = shared.stack.lock().await.transcoder_work_dir();
    shared.started[&kind].send_replace(true);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job = std::fs::read_dir(&work)
            .ok()
            .and_then(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).find(|n| n.starts_with("op_")));
        if let Some(op) = job {
            return format!("mid-job ({op} in its work dir)");
        }
        if Instant::now() > deadline {
            return "no job in flight within 60 s: killed idle".into();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the broker should be holding for the platform: operations still
/// `pending` (their job queued), open operations, and recent events that have
/// no delivery yet (their message on its way to the fan-in).
const IN_FLIGHT: &str = "SELECT (SELECT count(*) FROM operations WHERE status = 'pending'), \
     (SELECT count(*) FROM operations WHERE status IN ('pending', 'running')), \
     (SELECT count(*) FROM events e WHERE e.created_at > now() - interval '60 seconds' \
      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id))";

/// `(pending, open, events not fanned in)` now (zeros if the query fails).
async fn in_flight(db: &str) -> (i64, i64, i64) {
    let rows = sql(db, IN_FLIGHT).await.unwrap_or_default();
    let n = |i: usize| rows.first().and_then(|r| r.get(i)).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    (n(0), n(1), n(2))
}

/// Polls [`in_flight`] every 50 ms until `done` holds (or `limit` passed).
async fn wait_until(db: &str, limit: Duration, done: impl Fn((i64, i64, i64)) -> bool) -> (i64, i64, i64) {
    let deadline = Instant::now() + limit;
    loop {
        let now = in_flight(db).await;
        if done(now) || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `signal` (`STOP` / `CONT`) to the named services.
async fn signal(shared: &Shared, signal: &str, names: &[&str]) {
    let pids: Vec<String> = {
        let stack = shared.stack.lock().await;
        names.iter().filter_map(|n| stack.pid(n)).map(|p| p.to_string()).collect()
    };
    let _ = tokio::process::Command::new("kill").arg(format!("-{signal}")).args(&pids).status().await;
}

/// Makes sure the reset wipes work only PostgreSQL can heal, with the
/// queues' consumers held back (SIGSTOP: a backlog, as when consumers are
/// slow): the dispatcher is frozen and the reset's first pinned upload runs
/// until its events are recorded and its job is done (so they wait in the
/// broker, and no job is mid-run); then the transcoder is frozen too, between
/// two jobs (its work dir empty), and the second pinned upload's job waits in
/// the queue. The waits: at most 15 s for the events (less with a
/// backlog, where no moment is without open operations), 30 s for the others.
/// The caller resets, then [`thaw`]s. Answers what the reset met.
async fn wait_for_messages(shared: &Shared, db: &str) -> String {
    signal(shared, "STOP", &["webhook-dispatcher"]).await;
    shared.started[&FaultKind::ResetRabbitmq].send_replace(true);
    wait_until(db, Duration::from_secs(15), |(_, open, events)| events > 0 && open == 0).await;
    // With a backlog the transcoder is rarely idle: freeze it between two jobs.
    let work = shared.stack.lock().await.transcoder_work_dir();
    let deadline = Instant::now() + Duration::from_secs(30);
    while holds_job(&work) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    signal(shared, "STOP", &["transcoder"]).await;
    let (pending, _, events) = wait_until(db, Duration::from_secs(30), |(pending, _, _)| pending > 0).await;
    format!("dispatcher and transcoder frozen; reset begun with {pending} queued job(s) and {events} event(s) not yet fanned in; ")
}

/// Whether the transcoder's work dir holds a job (`op_…`).
fn holds_job(work: &std::path::Path) -> bool {
    std::fs::read_dir(work).map(|d| d.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().starts_with("op_"))).unwrap_or(false)
}

/// Lets the frozen consumers go on (SIGCONT) once the broker is back.
async fn thaw(shared: &Shared) {
    signal(shared, "CONT", &["transcoder", "webhook-dispatcher"]).await;
}

/// Holds the next webhook request at either proxy (at most 60 s), so the
/// dispatcher is killed while it is open. Answers what the kill met.
async fn hold_an_attempt(shared: &Shared, kind: FaultKind) -> String {
    let mut rxs = Vec::new();
    for p in &shared.proxies {
        let (tx, rx) = oneshot::channel();
        p.state.lock().unwrap().hold = Some(tx);
        rxs.push(Box::pin(rx));
    }
    shared.started[&kind].send_replace(true);
    let first = tokio::time::timeout(Duration::from_secs(60), futures::future::select_all(rxs)).await;
    for p in &shared.proxies {
        p.state.lock().unwrap().hold = None;
    }
    match first {
        Ok((Ok(event), i, _)) => format!("mid-attempt (delivery of {event} held open at proxy {})", shared.proxies[i].name),
        _ => "no attempt in flight within 60 s: killed idle".into(),
    }
}

/// Starts the killed service again and waits (at most 120 s) for its health
/// URL (the dispatcher has none here); answers the error when it stays down.
async fn respawn(shared: &Shared, name: &'static str) -> Option<String> {
    let mut stack = shared.stack.lock().await;
    stack.spawn(name);
    if let Some(pid) = stack.pid(name) {
        record_pid(&shared.pids, pid);
    }
    let health = match name {
        "api" => Some(format!("{}/healthz", stack.api_url)),
        "transcoder" => stack.env_value("VID__TRANSCODER__HEALTH_LISTEN").map(|a| format!("http://{a}/readyz")),
        _ => None,
    };
    let url = health?;
    if wait_200(&url, Duration::from_secs(120)).await {
        None
    } else {
        Some(format!("the restarted {name} did not answer 200 on {url} within 120 s"))
    }
}

/// The longest a receiver window is kept open past its planned length while
/// no delivery has met it yet (the dispatcher may be frozen or killed, or the
/// events not yet made, when it begins).
const WINDOW_GRACE: Duration = Duration::from_secs(90);

/// A receiver window: A down (process killed, port closed) or B answering
/// 500, for the planned length and then until it has met a delivery (an
/// attempt to A refused, a request at B answered 500), at most
/// [`WINDOW_GRACE`] longer; so the check that the windows met deliveries
/// does not depend on where the point faults put the dispatcher.
async fn window(shared: &Shared, f: &Planned, db: &str, endpoint_a: &str) -> FaultRecord {
    let at = shared.t0.elapsed();
    let mut error = None;
    let met = match f.kind {
        FaultKind::ReceiverDown => {
            let proxy = &shared.proxies[0];
            proxy.down();
            shared.receivers.lock().await[0].kill();
            println!("chaos: {} receiver A down (process SIGKILLed, port closed) for {:.0} s", fmt_t(at), f.length.as_secs_f64());
            shared.started[&f.kind].send_replace(true);
            tokio::time::sleep(f.length).await;
            // No endpoint A (its creation failed): nothing to wait for; the check fails.
            let met =
                !endpoint_a.is_empty() && hold_until(|| async { unanswered_attempts(db, endpoint_a).await.is_ok_and(|n| n > 0) }).await;
            if let Err(e) = shared.receivers.lock().await[0].start().await {
                error = Some(format!("receiver A did not come back: {e:#}"));
            }
            if let Err(e) = proxy.up().await {
                error = Some(format!("proxy A did not come back: {e:#}"));
            }
            met
        }
        _ => {
            let proxy = &shared.proxies[1];
            proxy.state.lock().unwrap().fail_500 = true;
            println!("chaos: {} receiver B answers 500 for {:.0} s", fmt_t(at), f.length.as_secs_f64());
            shared.started[&f.kind].send_replace(true);
            tokio::time::sleep(f.length).await;
            let met = hold_until(|| async { proxy.injected_500() > 0 }).await;
            proxy.state.lock().unwrap().fail_500 = false;
            met
        }
    };
    let ended = shared.t0.elapsed();
    let stretched = ended.saturating_sub(at).saturating_sub(f.length);
    let detail = match met {
        true if stretched > Duration::from_secs(1) => {
            format!("for {:.1} s ({:.1} s past its length, until a delivery met it)", (ended - at).as_secs_f64(), stretched.as_secs_f64())
        }
        true => format!("for {:.1} s", (ended - at).as_secs_f64()),
        false => format!("for {:.1} s; no delivery met it", (ended - at).as_secs_f64()),
    };
    println!("chaos: {} {} over ({detail})", fmt_t(ended), f.kind.label());
    FaultRecord { kind: f.kind, at, ended, detail, skipped: None, error }
}

/// Polls `met` every 200 ms until it holds (true) or [`WINDOW_GRACE`] has passed (false).
async fn hold_until<F, Fut>(met: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WINDOW_GRACE;
    loop {
        if met().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
