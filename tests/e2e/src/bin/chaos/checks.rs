//! The verification after the run: one function per check, in the order the
//! report lists them. Each compares what the database, the API, the proxies
//! and the receivers recorded; facts one check gathers that later checks use
//! (the events, the deliveries, the lost pairs, the videos) live in [`Facts`].

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{anyhow, bail};
use vid_client::Client;
use vid_core::endpoint::EndpointStatus;
use vid_core::operation::{Operation, OperationStatus};
use vid_core::video::Video;
use vid_core::EndpointId;

use crate::faults::FaultRecord;
use crate::profile::RETRY_SCHEDULE;
use crate::proxy::{HitOutcome, Proxy};
use crate::report::Report;
use crate::schedule::FaultKind;
use crate::shared::{Shared, UploadResult};
use crate::util::{sql, sql_count, unanswered_attempts};

/// What the checks look at.
pub(crate) struct Ctx<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) client: &'a Client,
    /// The platform's database URL.
    pub(crate) db: &'a str,
    /// Receiver A's and B's database URLs.
    pub(crate) receiver_dbs: &'a [String],
    /// The endpoints of receiver A and B, in that order.
    pub(crate) endpoints: &'a [EndpointId],
    pub(crate) results: &'a [UploadResult],
    pub(crate) faults: &'a [FaultRecord],
}

/// What earlier checks found that later ones use.
#[derive(Default)]
struct Facts {
    /// Every event id the database holds.
    event_ids: HashSet<String>,
    /// The ids of the `video.ready` events.
    ready_events: HashSet<String>,
    /// `webhook_deliveries` rows: endpoint, event, status, attempt count, seconds from creation to last update.
    deliveries: Vec<Vec<String>>,
    /// (endpoint index, event id) pairs missing from any record.
    lost: HashSet<(usize, String)>,
    /// `GET /videos`, every page.
    api_videos: Vec<Video>,
}

/// Runs every check; a check that cannot run (a query failed) is itself a failed check.
pub(crate) async fn verify(ctx: &Ctx<'_>) -> Report {
    let mut rep = Report { uploads: ctx.results.len(), ..Default::default() };
    if let Err(e) = verify_all(&mut rep, ctx).await {
        rep.check("the checks could run", false, format!("{e:#}"));
    }
    rep
}

async fn verify_all(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let mut facts = Facts::default();
    uploads_accepted(rep, ctx);
    let api_ops = operations_succeeded(rep, ctx).await?;
    operations_agree(rep, ctx, &api_ops).await?;
    events_agree(rep, ctx, &mut facts).await?;
    one_ready_event_per_upload(rep, ctx, &facts);
    every_event_delivered(rep, ctx, &mut facts).await?;
    nothing_left_pending(rep, &facts);
    attempt_counts_agree(rep, ctx, &facts).await?;
    endpoints_enabled(rep, ctx).await?;
    api_deliveries_agree(rep, ctx, &facts).await?;
    for (i, p) in ctx.shared.proxies.iter().enumerate() {
        proxy_accepted_every_event(rep, &mut facts, i, p);
    }
    videos_agree(rep, ctx, &mut facts).await?;
    for (i, rdb) in ctx.receiver_dbs.iter().enumerate() {
        let name = ["A", "B"].get(i).copied().unwrap_or("?");
        receiver_processed_every_event(rep, &mut facts, i, name, rdb).await?;
        receiver_applied_once(rep, &facts, name, rdb).await?;
        receiver_videos_agree(rep, &facts, name, rdb).await?;
    }
    rep.lost = facts.lost.len() as i64;
    outbox_drained(rep, ctx).await?;
    healed(rep, ctx).await?;
    no_unexpected_exit(rep, ctx);
    receiver_faults_met_deliveries(rep, ctx).await?;
    every_fault_injected(rep, ctx);
    kills_hit_work(rep, ctx);
    no_panic_in_logs(rep, ctx).await
}

/// Every list item across every page (at most 1000 pages).
async fn all_pages<T, F, Fut>(mut fetch: F) -> anyhow::Result<Vec<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<vid_client::Page<T>, vid_client::ClientError>>,
{
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..1000 {
        let page = fetch(cursor.clone()).await.map_err(|e| anyhow!("{e}"))?;
        out.extend(page.data);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(out),
        }
    }
    bail!("more than 1000 pages")
}

// --- uploads and operations -------------------------------------------------

fn uploads_accepted(rep: &mut Report, ctx: &Ctx<'_>) {
    let results = ctx.results;
    rep.accepted = results.iter().filter(|r| r.operation.is_some()).count();
    rep.sdk_retries = results.iter().map(|r| r.sdk_retries).sum();
    let errors: Vec<String> = results.iter().filter(|r| r.operation.is_none()).filter_map(|r| r.last_error.clone()).collect();
    rep.check(
        "every upload accepted through the SDK",
        rep.accepted == results.len(),
        if errors.is_empty() { String::new() } else { format!("last errors: {errors:?}") },
    );
}

/// Answers each upload's operation as the API shows it, by id.
async fn operations_succeeded(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<HashMap<String, Operation>> {
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut api_ops = HashMap::new();
    for id in ctx.results.iter().filter_map(|r| r.operation.as_ref()) {
        let op = ctx.client.get_operation(id).await.map_err(|e| anyhow!("GET /operations/{id}: {e}"))?;
        *by_status.entry(op.status.as_str().to_owned()).or_default() += 1;
        api_ops.insert(id.as_str().to_owned(), op);
    }
    rep.succeeded = by_status.get("succeeded").copied().unwrap_or(0);
    let failed: Vec<String> = api_ops
        .values()
        .filter(|o| o.status != OperationStatus::Succeeded)
        .map(|o| format!("{} {:?}", o.id, o.error.as_ref().map(|p| p.code.clone())))
        .collect();
    let failed = if failed.is_empty() { String::new() } else { format!("; not succeeded: {failed:?}") };
    rep.check("every operation terminal and succeeded (API)", rep.succeeded == ctx.results.len(), format!("{by_status:?}{failed}"));
    Ok(api_ops)
}

async fn operations_agree(rep: &mut Report, ctx: &Ctx<'_>, api_ops: &HashMap<String, Operation>) -> anyhow::Result<()> {
    let (client, n) = (ctx.client, ctx.results.len());
    let db_ops = sql(ctx.db, "SELECT id, status FROM operations").await?;
    let db_succeeded = db_ops.iter().filter(|r| r[1] == "succeeded").count();
    let listed = all_pages(|c| async move { client.list_operations(None, c.as_deref()).await }).await?;
    let db_ids: HashSet<&str> = db_ops.iter().map(|r| r[0].as_str()).collect();
    let listed_ids: HashSet<&str> = listed.iter().map(|o| o.id.as_str()).collect();
    let ours: HashSet<&str> = api_ops.keys().map(String::as_str).collect();
    rep.check(
        "operations: database, GET /operations and the uploads agree",
        db_ops.len() == n && db_succeeded == n && db_ids == listed_ids && listed_ids == ours,
        format!("database {} ({} succeeded), listed {}, uploads {}", db_ops.len(), db_succeeded, listed.len(), ours.len()),
    );
    Ok(())
}

// --- events -------------------------------------------------------------------

async fn events_agree(rep: &mut Report, ctx: &Ctx<'_>, facts: &mut Facts) -> anyhow::Result<()> {
    let client = ctx.client;
    let db_events = sql(ctx.db, "SELECT id, event_type FROM events ORDER BY id").await?;
    let api_events = all_pages(|c| async move {
        let filter = vid_client::EventFilter { cursor: c.as_deref(), ..Default::default() };
        client.list_events(&filter).await
    })
    .await?;
    facts.event_ids = db_events.iter().map(|r| r[0].clone()).collect();
    facts.ready_events = db_events.iter().filter(|r| r[1] == "video.ready").map(|r| r[0].clone()).collect();
    let api_event_ids: HashSet<String> = api_events.iter().map(|e| e.id.as_str().to_owned()).collect();
    rep.events = facts.event_ids.len();
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &db_events {
        *types.entry(r[1].as_str()).or_default() += 1;
    }
    rep.check(
        "events: database and GET /events agree",
        facts.event_ids == api_event_ids && !facts.event_ids.is_empty(),
        format!("database {}, API {}; {types:?}", facts.event_ids.len(), api_event_ids.len()),
    );
    Ok(())
}

fn one_ready_event_per_upload(rep: &mut Report, ctx: &Ctx<'_>, facts: &Facts) {
    let n = facts.ready_events.len();
    rep.check("one video.ready event per upload", n == ctx.results.len(), format!("{n} video.ready events"));
}

// --- deliveries (database) ------------------------------------------------------

async fn every_event_delivered(rep: &mut Report, ctx: &Ctx<'_>, facts: &mut Facts) -> anyhow::Result<()> {
    facts.deliveries = sql(
        ctx.db,
        "SELECT endpoint_id, event_id, status, attempt_count, extract(epoch FROM (updated_at - created_at)) FROM webhook_deliveries",
    )
    .await?;
    rep.deliveries = facts.deliveries.len() as i64;
    let mut delivered: HashMap<&str, HashSet<&str>> = HashMap::new();
    for d in &facts.deliveries {
        if d[2] == "succeeded" {
            delivered.entry(d[0].as_str()).or_default().insert(d[1].as_str());
        }
        rep.max_delivery_secs = rep.max_delivery_secs.max(d[4].parse().unwrap_or(0.0));
    }
    let mut lost_db = 0;
    for (i, ep) in ctx.endpoints.iter().enumerate() {
        let got = delivered.get(ep.as_str());
        for e in facts.event_ids.iter().filter(|e| !got.is_some_and(|g| g.contains(e.as_str()))) {
            lost_db += 1;
            facts.lost.insert((i, e.clone()));
        }
    }
    let (deliveries, events, endpoints) = (facts.deliveries.len(), facts.event_ids.len(), ctx.endpoints.len());
    rep.check(
        "every event delivered (succeeded) to each endpoint (dispatcher's records)",
        lost_db == 0 && deliveries == events * endpoints,
        format!("{deliveries} deliveries for {events} events × {endpoints} endpoints; {lost_db} missing"),
    );
    Ok(())
}

fn nothing_left_pending(rep: &mut Report, facts: &Facts) {
    let mut status_count: BTreeMap<String, usize> = BTreeMap::new();
    for d in &facts.deliveries {
        *status_count.entry(d[2].clone()).or_default() += 1;
    }
    rep.check(
        "no delivery left pending, failed or paused after the retry schedule",
        status_count.keys().all(|s| s == "succeeded"),
        format!("{status_count:?} (schedule {RETRY_SCHEDULE:?} s, ≤ {:.0} s with jitter)", RETRY_SCHEDULE.iter().sum::<u64>() as f64 * 1.2),
    );
}

async fn attempt_counts_agree(rep: &mut Report, ctx: &Ctx<'_>, facts: &Facts) -> anyhow::Result<()> {
    let attempts =
        sql(ctx.db, "SELECT coalesce(response_status::text, error_class, 'other'), count(*) FROM webhook_attempts GROUP BY 1 ORDER BY 1")
            .await?;
    for a in &attempts {
        let n: i64 = a[1].parse().unwrap_or(0);
        rep.attempts += n;
        let class = match a[0].parse::<u16>() {
            Ok(s) => format!("HTTP {s}"),
            Err(_) => a[0].clone(),
        };
        *rep.attempt_classes.entry(class).or_default() += n;
    }
    let attempt_sum: i64 = facts.deliveries.iter().map(|d| d[3].parse::<i64>().unwrap_or(0)).sum();
    rep.check(
        "attempt counts agree with the attempt log",
        attempt_sum == rep.attempts,
        format!("Σ attempt_count {attempt_sum}, webhook_attempts rows {}", rep.attempts),
    );
    Ok(())
}

// --- deliveries (API) -----------------------------------------------------------

async fn endpoints_enabled(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<()> {
    for ep in ctx.endpoints {
        let e = ctx.client.get_endpoint(ep).await.map_err(|e| anyhow!("GET endpoint {ep}: {e}"))?.endpoint;
        rep.check(&format!("endpoint {ep} still enabled"), e.status == EndpointStatus::Enabled, e.disabled_reason.unwrap_or_default());
    }
    Ok(())
}

async fn api_deliveries_agree(rep: &mut Report, ctx: &Ctx<'_>, facts: &Facts) -> anyhow::Result<()> {
    let client = ctx.client;
    let (mut total, mut attempts, mut not_succeeded) = (0, 0, 0);
    for ep in ctx.endpoints {
        let list = all_pages(|c| async move {
            let filter = vid_client::resources::DeliveryFilter { limit: Some(100), cursor: c.as_deref(), ..Default::default() };
            client.list_deliveries(ep, &filter).await
        })
        .await?;
        total += list.len();
        not_succeeded += list.iter().filter(|d| d["status"] != "succeeded").count();
        attempts += list.iter().map(|d| d["attempts"].as_array().map_or(0, Vec::len)).sum::<usize>();
    }
    rep.check(
        "GET …/deliveries agrees with the database",
        total == facts.deliveries.len() && not_succeeded == 0 && attempts as i64 == rep.attempts,
        format!("API {total} deliveries ({not_succeeded} not succeeded), {attempts} attempts"),
    );
    Ok(())
}

// --- what the endpoints received (proxies) ------------------------------------------

/// Endpoint `i` (behind proxy `p`) accepted every event at least once.
fn proxy_accepted_every_event(rep: &mut Report, facts: &mut Facts, i: usize, p: &Proxy) {
    let hits = p.hits();
    rep.requests.insert(p.name, hits.len());
    let mut accepted: HashSet<&str> = HashSet::new();
    let (mut dups, mut already) = (0, 0);
    for h in &hits {
        if let HitOutcome::Forwarded { status, already_processed } = &h.outcome {
            if accepted.contains(h.event_id.as_str()) {
                dups += 1;
            }
            if *already_processed {
                already += 1;
            }
            if (200..300).contains(status) {
                accepted.insert(h.event_id.as_str());
            }
        }
    }
    rep.dup_received.insert(p.name, (dups, already));
    let missing: Vec<&String> = facts.event_ids.iter().filter(|e| !accepted.contains(e.as_str())).collect();
    facts.lost.extend(missing.iter().map(|e| (i, (*e).clone())));
    let held = hits.iter().filter(|h| h.held).count();
    let injected = hits.iter().filter(|h| matches!(h.outcome, HitOutcome::Injected500)).count();
    let unreachable: Vec<&str> = hits
        .iter()
        .filter_map(|h| match &h.outcome {
            HitOutcome::ForwardFailed(e) => Some(e.as_str()),
            _ => None,
        })
        .collect();
    rep.check(
        &format!("endpoint {} accepted every event at least once (proxy's record)", p.name),
        missing.is_empty(),
        format!(
            "{} requests, {injected} answered 500 by the fault, {held} held for the dispatcher kill, {} found the receiver unreachable{}; missing {:?}",
            hits.len(),
            unreachable.len(),
            unreachable.first().map(|e| format!(" (e.g. {e})")).unwrap_or_default(),
            missing.iter().take(5).collect::<Vec<_>>()
        ),
    );
}

// --- videos and receivers -----------------------------------------------------------

async fn videos_agree(rep: &mut Report, ctx: &Ctx<'_>, facts: &mut Facts) -> anyhow::Result<()> {
    let client = ctx.client;
    facts.api_videos = all_pages(|c| async move { client.list_videos(c.as_deref()).await }).await?;
    let api_videos = &facts.api_videos;
    let db_videos = sql(ctx.db, "SELECT id, status, version FROM videos").await?;
    let db_video: HashMap<&str, (&str, i64)> =
        db_videos.iter().map(|r| (r[0].as_str(), (r[1].as_str(), r[2].parse().unwrap_or(-1)))).collect();
    let api_agree = api_videos.len() == db_videos.len()
        && api_videos.iter().all(|v| db_video.get(v.id.as_str()).is_some_and(|(s, ver)| *s == v.status.as_str() && *ver == v.version));
    rep.check(
        "videos: database and GET /videos agree, all ready",
        api_agree && api_videos.len() == ctx.results.len() && api_videos.iter().all(|v| v.status.as_str() == "ready"),
        format!("API {}, database {}", api_videos.len(), db_videos.len()),
    );
    Ok(())
}

/// Receiver `i` (`name`, database `rdb`): `seen_events` holds exactly the api's events.
async fn receiver_processed_every_event(rep: &mut Report, facts: &mut Facts, i: usize, name: &str, rdb: &str) -> anyhow::Result<()> {
    let seen = sql(rdb, "SELECT event_id, outcome FROM seen_events").await?;
    let seen_ids: HashSet<&str> = seen.iter().map(|r| r[0].as_str()).collect();
    let missing_ids: Vec<String> = facts.event_ids.iter().filter(|e| !seen_ids.contains(e.as_str())).cloned().collect();
    let missing = missing_ids.len();
    facts.lost.extend(missing_ids.into_iter().map(|e| (i, e)));
    let unknown = seen_ids.iter().filter(|e| !facts.event_ids.contains(**e)).count();
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &seen {
        *outcomes.entry(r[1].as_str()).or_default() += 1;
    }
    rep.check(
        &format!("receiver {name} processed every event once (seen_events = the api's events)"),
        missing == 0 && unknown == 0,
        format!("{} processed {outcomes:?}; {missing} missing, {unknown} unknown", seen.len()),
    );
    Ok(())
}

async fn receiver_applied_once(rep: &mut Report, facts: &Facts, name: &str, rdb: &str) -> anyhow::Result<()> {
    let dup = sql_count(
        rdb,
        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM applied_effects GROUP BY event_id HAVING count(*) > 1) d",
    )
    .await?;
    rep.dup_effects += dup;
    let effects = sql(rdb, "SELECT event_id, event_type FROM applied_effects").await?;
    let ready_applied: HashMap<&str, usize> = effects.iter().filter(|e| e[1] == "video.ready").fold(HashMap::new(), |mut m, e| {
        *m.entry(e[0].as_str()).or_default() += 1;
        m
    });
    let ready_once = facts.ready_events.iter().all(|e| ready_applied.get(e.as_str()) == Some(&1));
    let stale_with_effect =
        sql_count(rdb, "SELECT count(*) FROM applied_effects a JOIN seen_events s USING (event_id) WHERE s.outcome <> 'applied'").await?;
    rep.check(
        &format!("receiver {name} applied each effect exactly once"),
        dup == 0 && ready_once && stale_with_effect == 0,
        format!(
            "{} effects, {dup} duplicate, every video.ready applied once: {ready_once}, effects of non-applied events: {stale_with_effect}",
            effects.len()
        ),
    );
    Ok(())
}

async fn receiver_videos_agree(rep: &mut Report, facts: &Facts, name: &str, rdb: &str) -> anyhow::Result<()> {
    let api_videos = &facts.api_videos;
    let rv = sql(rdb, "SELECT video_id, status, version FROM videos").await?;
    let agree = rv.len() == api_videos.len()
        && rv
            .iter()
            .all(|r| api_videos.iter().any(|v| v.id.as_str() == r[0] && v.status.as_str() == r[1] && v.version.to_string() == r[2]));
    rep.check(
        &format!("receiver {name}'s videos agree with GET /videos (status and version)"),
        agree,
        format!("receiver {} videos, API {}", rv.len(), api_videos.len()),
    );
    Ok(())
}

// --- the system itself --------------------------------------------------------------

async fn outbox_drained(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let outbox = sql_count(ctx.db, "SELECT count(*) FROM outbox").await?;
    rep.check("outbox drained", outbox == 0, format!("{outbox} rows"));
    Ok(())
}

/// Not a check: what the healing of issue 24 did (after a broker reset it
/// should not be zero unless the reset found nothing left in the broker).
/// Re-drives from `operations.job_attempt`; reconciled events summed from the
/// dispatcher's "reconciled events whose deliveries were missing" log lines.
async fn healed(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let redriven = sql_count(ctx.db, "SELECT count(*) FROM operations WHERE job_attempt > 1").await?;
    let redrives = sql_count(ctx.db, "SELECT coalesce(sum(job_attempt - 1), 0) FROM operations").await?;
    let log = ctx.shared.stack.lock().await.log_dir().join("webhook-dispatcher.log");
    let reconciled: u64 = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("reconciled events whose deliveries were missing"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("events").and_then(serde_json::Value::as_u64))
        .sum();
    rep.healed = format!(
        "{redriven} operation(s) re-driven ({redrives} re-publication(s) of their jobs), {reconciled} event(s) reconciled into deliveries"
    );
    Ok(())
}

fn no_unexpected_exit(rep: &mut Report, ctx: &Ctx<'_>) {
    let findings = ctx.shared.findings.lock().unwrap().clone();
    rep.check("no service or receiver exited unless killed by the run", findings.is_empty(), findings.join("; "));
}

async fn receiver_faults_met_deliveries(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let a = ctx.endpoints.first().map(EndpointId::as_str).unwrap_or("");
    let down_refused = unanswered_attempts(ctx.db, a).await?;
    let injected_500: usize = ctx.shared.proxies.iter().map(Proxy::injected_500).sum();
    let ran = |k| ctx.faults.iter().any(|f| f.kind == k);
    let windows_ran = ran(FaultKind::ReceiverDown) && ran(FaultKind::Receiver500);
    rep.check(
        "the receiver faults met deliveries (A refused attempts, B answered 500)",
        windows_ran && down_refused > 0 && injected_500 > 0,
        format!("{down_refused} attempts to A failed without an HTTP answer, {injected_500} answered 500 at B"),
    );
    Ok(())
}

fn every_fault_injected(rep: &mut Report, ctx: &Ctx<'_>) {
    let bad: Vec<String> = ctx.faults.iter().filter_map(|f| f.error.as_ref().map(|e| format!("{}: {e}", f.kind.label()))).collect();
    rep.check("every fault injected or skipped with a reason", bad.is_empty(), bad.join("; "));
}

fn kills_hit_work(rep: &mut Report, ctx: &Ctx<'_>) {
    let idle: Vec<&str> = ctx.faults.iter().filter(|f| f.detail.contains("killed idle")).map(|f| f.kind.label()).collect();
    rep.check(
        "kills hit work in flight (mid-job, mid-attempt)",
        idle.is_empty(),
        if idle.is_empty() { String::new() } else { format!("idle: {idle:?}") },
    );
}

async fn no_panic_in_logs(rep: &mut Report, ctx: &Ctx<'_>) -> anyhow::Result<()> {
    let log_dir = ctx.shared.stack.lock().await.log_dir().to_path_buf();
    let mut panics = Vec::new();
    for entry in std::fs::read_dir(&log_dir)?.filter_map(Result::ok) {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let n = text.lines().filter(|l| l.contains("panicked")).count();
        if n > 0 {
            panics.push(format!("{}: {n}", entry.file_name().to_string_lossy()));
        }
    }
    rep.check("no panic in any log", panics.is_empty(), panics.join(", "));
    Ok(())
}
