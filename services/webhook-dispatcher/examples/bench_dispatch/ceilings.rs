//! The two ceilings every delivery goes through, measured in the same run
//! as the dispatcher (see the crate docs, step 3): the broker (messages/s
//! through the events exchange into its quorum queue) and the database (the
//! dispatcher's own fan-in, claim and record statements, no HTTP); and the
//! database's write floor (the durable writes alone: no claim, no advisory
//! locks, no reads beyond the writes' own key lookups).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures::StreamExt;
use vid_core::messages::EventPublished;
use vid_core::{EndpointId, TenantId};
use vid_db::schema::{tenants, webhook_endpoints as ep};
use vid_deliveries::{self as store, AttemptRecord};
use vid_infra::amqp::{Publisher, Topology, RK_EVENT};
use vid_webhook_dispatcher::{fanin, Settings};

use crate::cpu::{Snapshot, Use};
use crate::events::{bench_event, record_events};

/// Broker ceiling: `n` messages published through `prefix`'s events exchange
/// into its quorum queue (`concurrency` confirms in flight) and consumed
/// with `prefetch` and one `multiple` ack per batch. Messages/s from the
/// first publish to the last message received, and the CPU used meanwhile.
pub(crate) async fn broker_ceiling(settings: &Settings, n: usize, concurrency: usize, prefetch: u16) -> (f64, Use) {
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    let prefix = vid_testkit::unique_prefix();
    let amqp = vid_infra::amqp::connect(&settings.amqp, Duration::from_secs(10)).await.expect("RabbitMQ");
    let publisher = Arc::new(Publisher::new(&amqp).await.unwrap());
    let topology = Topology::new(&prefix);
    topology.declare(publisher.channel()).await.unwrap();
    let channel = amqp.create_channel().await.unwrap();
    channel.basic_qos(prefetch, BasicQosOptions::default()).await.unwrap();
    let mut consumer = channel
        .basic_consume(&topology.webhook_events(), "bench-ceiling", BasicConsumeOptions::default(), Default::default())
        .await
        .unwrap();
    let tenant = TenantId::generate();
    let cpu = Snapshot::take();
    let start = Instant::now();
    let exchange = topology.events_exchange();
    let publishing = tokio::spawn({
        let publisher = publisher.clone();
        async move {
            futures::stream::iter(0..n)
                .map(|_| {
                    let (publisher, exchange, msg) = (publisher.clone(), exchange.clone(), bench_event(&tenant));
                    async move {
                        let id = msg.event.id.as_str().to_owned();
                        publisher.publish_json(&exchange, RK_EVENT, &msg, Some(&id)).await.expect("publish")
                    }
                })
                .buffer_unordered(concurrency.max(1))
                .collect::<Vec<_>>()
                .await;
        }
    });
    let mut received = 0;
    while received < n {
        let first = consumer.next().await.expect("consumer").expect("delivery");
        let mut last = first.delivery_tag;
        received += 1;
        while let Some(Some(Ok(d))) = futures::FutureExt::now_or_never(consumer.next()) {
            last = d.delivery_tag;
            received += 1;
        }
        channel.basic_ack(last, BasicAckOptions { multiple: true }).await.unwrap();
    }
    let elapsed = start.elapsed();
    let cpu = cpu.until(&Snapshot::take());
    publishing.await.unwrap();
    let ch = publisher.channel();
    for q in [topology.webhook_events(), topology.transcode_jobs(), topology.transcode_dead(), topology.transcode_reports()] {
        let _ = ch.queue_delete(&q, Default::default()).await;
    }
    let _ = amqp.close(200, "done").await;
    (n as f64 / elapsed.as_secs_f64(), cpu)
}

/// A fresh database (a second or third one beside the dispatcher's) with
/// one tenant and one enabled endpoint: its pool, tenant and endpoint.
async fn ceiling_world(settings: &Settings) -> (vid_db::Pool, TenantId, EndpointId) {
    let db_url = vid_testkit::fresh_database().await;
    let mut db_settings = settings.database.clone();
    db_settings.url = db_url.clone().into();
    let pool = vid_db::pool(&db_settings).unwrap();
    let tenant = TenantId::generate();
    let endpoint = EndpointId::generate();
    let mut conn = AsyncPgConnection::establish(&db_url).await.unwrap();
    diesel::insert_into(tenants::table).values((tenants::id.eq(&tenant), tenants::name.eq("ceiling"))).execute(&mut conn).await.unwrap();
    diesel::insert_into(ep::table)
        .values((
            ep::id.eq(&endpoint),
            ep::tenant_id.eq(&tenant),
            ep::url.eq("http://127.0.0.1:9/never-called"),
            ep::signature_format.eq("webhook-signature"),
            ep::status.eq("enabled"),
            ep::secret_sealed.eq(vec![0u8; 16]),
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    (pool, tenant, endpoint)
}

/// `workers` tasks each repeat `round` until `n` deliveries are recorded
/// (each round returns how many it recorded). Deliveries/s, and the CPU used meanwhile.
async fn rounds<F, Fut>(n: usize, workers: usize, round: F) -> (f64, Use)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = usize> + Send,
{
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let recorded = Arc::new(AtomicUsize::new(0));
    let cpu = Snapshot::take();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let (recorded, round) = (recorded.clone(), round.clone());
        tasks.spawn(async move {
            while AtomicUsize::load(&recorded, SeqCst) < n {
                recorded.fetch_add(round().await, SeqCst);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let rate = AtomicUsize::load(&recorded, SeqCst) as f64 / start.elapsed().as_secs_f64();
    (rate, cpu.until(&Snapshot::take()))
}

/// A success as the scheduler records it (200, "ok", 1 ms).
fn success(now: chrono::DateTime<Utc>) -> AttemptRecord {
    AttemptRecord {
        started_at: now,
        duration_ms: 1,
        response_status: Some(200),
        error_class: None,
        error_detail: None,
        response_body: Some("ok".into()),
        success: true,
        retry_in: None,
    }
}

/// Database ceiling: in a second fresh database with one tenant and one
/// enabled endpoint, `workers` tasks each repeat fan-in of `batch` new
/// events, a claim of up to `batch`, and recording those as successes,
/// until `n` deliveries are recorded. Deliveries/s, and the CPU used meanwhile.
pub(crate) async fn database_ceiling(settings: &Settings, n: usize, batch: usize, workers: usize) -> (f64, Use) {
    let (pool, tenant, _) = ceiling_world(settings).await;
    rounds(n, workers, move || {
        let (pool, tenant) = (pool.clone(), tenant.clone());
        async move {
            let messages: Vec<EventPublished> = (0..batch).map(|_| bench_event(&tenant)).collect();
            let mut conn = pool.get().await.unwrap();
            record_events(&mut conn, &messages).await;
            fanin::fan_in_batch(&pool, &messages).await.unwrap();
            // The scheduler's claim: the leases with their endpoints.
            let claimed = store::claim_for_send(&mut conn, i32::MAX, batch as i32, 60_000, &[]).await.unwrap();
            let now = Utc::now();
            let rows: Vec<_> = claimed.into_iter().map(|(c, _endpoint)| (c, success(now))).collect();
            store::record_successes(&mut conn, &rows, i32::MAX).await.unwrap()
        }
    })
    .await
}

/// Write floor: what the durable state alone costs the database, in a third
/// fresh database with one tenant and one enabled endpoint. `workers` tasks
/// each insert `batch` deliveries already leased (one multi-row `INSERT`,
/// autocommit: the rows the fan-in writes when it leases) and record them as
/// successes with the dispatcher's own statement ([`store::record_successes`]:
/// the attempt rows, the deliveries `succeeded`, one commit), until `n` are
/// recorded. No event rows, no claim, no advisory locks, no reads beyond
/// the writes' own foreign-key checks and key lookups (and the recording
/// statement's endpoint health check): the two writes (and two commits a
/// batch) every delivery needs at least, with the schema's indexes,
/// triggers and foreign keys. Deliveries/s, and the CPU used meanwhile.
pub(crate) async fn write_floor(settings: &Settings, n: usize, batch: usize, workers: usize) -> (f64, Use) {
    use chrono::SubsecRound;
    use vid_db::schema::webhook_deliveries as dl;
    let (pool, tenant, endpoint) = ceiling_world(settings).await;
    rounds(n, workers, move || {
        let (pool, tenant, endpoint) = (pool.clone(), tenant.clone(), endpoint.clone());
        async move {
            // Microseconds, as PostgreSQL keeps it (diesel would cut it the same way when binding).
            let token = (Utc::now() + chrono::Duration::seconds(60)).trunc_subsecs(6);
            let leased: Vec<store::Claimed> = (0..batch)
                .map(|_| {
                    let m = bench_event(&tenant);
                    store::Claimed {
                        id: vid_core::DeliveryId::generate(),
                        endpoint_id: endpoint.clone(),
                        tenant_id: tenant.clone(),
                        event_id: m.event.id,
                        payload: m.payload,
                        attempt_count: 0,
                        manual_retry: false,
                        locked_until: token,
                    }
                })
                .collect();
            let rows: Vec<_> = leased
                .iter()
                .map(|c| {
                    (
                        dl::id.eq(&c.id),
                        dl::tenant_id.eq(&c.tenant_id),
                        dl::endpoint_id.eq(&c.endpoint_id),
                        dl::event_id.eq(&c.event_id),
                        dl::event_type.eq("video.ready"),
                        dl::payload.eq(&c.payload),
                        dl::status.eq("pending"),
                        dl::next_attempt_at.eq(Utc::now()),
                        dl::locked_until.eq(token),
                    )
                })
                .collect();
            let mut conn = pool.get().await.unwrap();
            diesel::insert_into(dl::table).values(rows).execute(&mut conn).await.unwrap();
            let now = Utc::now();
            let rows: Vec<_> = leased.into_iter().map(|c| (c, success(now))).collect();
            store::record_successes(&mut conn, &rows, i32::MAX).await.unwrap()
        }
    })
    .await
}
