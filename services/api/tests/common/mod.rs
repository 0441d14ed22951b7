//! Spawns the real api in-process against the local stack, with a fresh
//! database and RabbitMQ prefix per test.

#![allow(dead_code)]

use vid_api::{Application, Settings};

pub struct TestApi {
    pub url: String,
    pub key: String,
    pub state: vid_api::state::AppState,
}

impl TestApi {
    pub async fn start(overrides: &[(&str, &str)]) -> TestApi {
        let db = vid_testkit::fresh_database().await;
        let prefix = vid_testkit::unique_prefix();
        let mut all: Vec<(&str, &str)> =
            vec![("database.url", db.as_str()), ("amqp.prefix", prefix.as_str()), ("api.listen", "127.0.0.1:0")];
        all.extend_from_slice(overrides);
        let settings: Settings = vid_testkit::settings(&all);
        let app = Application::build(settings).expect("api builds");
        let url = format!("http://127.0.0.1:{}", app.port());
        let state = app.state().clone();
        tokio::spawn(app.run());
        let (_, key) = vid_api::auth::create_tenant(&state.db, "test").await.unwrap();
        TestApi { url, key, state }
    }

    pub fn client(&self) -> vid_client::Client {
        vid_client::Client::new(&self.url, &self.key)
    }

    /// Sets every tenant's `max_uploads_in_flight` (the per-tenant cap on
    /// uploads in flight; `POST /uploads` answers 429 past it).
    pub async fn set_upload_cap(&self, cap: i32) {
        use diesel::prelude::*;
        use vid_db::RunQueryDsl;
        let mut conn = self.state.db.get().await.unwrap();
        diesel::update(vid_db::schema::tenants::table)
            .set(vid_db::schema::tenants::max_uploads_in_flight.eq(Some(cap)))
            .execute(&mut conn)
            .await
            .unwrap();
    }

    /// The id of the tenant whose key this api's [`TestApi::client`] uses.
    pub async fn tenant_id(&self) -> vid_core::TenantId {
        use diesel::prelude::*;
        use vid_db::RunQueryDsl;
        let mut conn = self.state.db.get().await.unwrap();
        vid_db::schema::api_keys::table
            .filter(vid_db::schema::api_keys::key_hash.eq(vid_api::auth::hash_key(&self.key)))
            .select(vid_db::schema::api_keys::tenant_id)
            .first(&mut conn)
            .await
            .unwrap()
    }

    /// A client of another tenant of the same api.
    pub async fn other_tenant(&self) -> vid_client::Client {
        let (_, key) = vid_api::auth::create_tenant(&self.state.db, "other").await.unwrap();
        vid_client::Client::new(&self.url, &key)
    }
}

/// A `pending` operation of `tenant` with its `processing` video and
/// `completed` upload, rows as `complete` writes them (source key `k`, 1 byte);
/// returns (operation, video).
pub async fn pending_operation(api: &TestApi, tenant: &vid_core::TenantId) -> (vid_core::OperationId, vid_core::VideoId) {
    use diesel::sql_types::Text;
    use vid_core::{OperationId, UploadId, VideoId};
    use vid_db::RunQueryDsl;
    let (upload, video, op) = (UploadId::generate(), VideoId::generate(), OperationId::generate());
    let mut conn = api.state.db.get().await.unwrap();
    diesel::sql_query(
        "INSERT INTO uploads (id, tenant_id, status, size_bytes, content_type, part_size, part_count, storage_key, s3_upload_id, expires_at)
         VALUES ($1, $2, 'completed', 1, 'video/mp4', 1, 1, 'k', 's', now() + interval '1 day')",
    )
    .bind::<Text, _>(upload.as_str())
    .bind::<Text, _>(tenant.as_str())
    .execute(&mut conn)
    .await
    .unwrap();
    diesel::sql_query(
        "INSERT INTO videos (id, tenant_id, upload_id, operation_id, status, content_type, source_key)
         VALUES ($1, $2, $3, $4, 'processing', 'video/mp4', 'k')",
    )
    .bind::<Text, _>(video.as_str())
    .bind::<Text, _>(tenant.as_str())
    .bind::<Text, _>(upload.as_str())
    .bind::<Text, _>(op.as_str())
    .execute(&mut conn)
    .await
    .unwrap();
    diesel::sql_query("INSERT INTO operations (id, tenant_id, video_id, status, phase) VALUES ($1, $2, $3, 'pending', 'queued')")
        .bind::<Text, _>(op.as_str())
        .bind::<Text, _>(tenant.as_str())
        .bind::<Text, _>(video.as_str())
        .execute(&mut conn)
        .await
        .unwrap();
    (op, video)
}

pub fn problem_code(e: &vid_client::ClientError) -> String {
    e.problem().map(|p| p.code.clone()).unwrap_or_else(|| format!("not a problem: {e}"))
}

/// Appends every `.rs` file under `dir` (recursively) to `out`: the api's own
/// sources, for tests that read its route registrations.
pub fn collect_rs(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The test's side of RabbitMQ for the api's janitor tests: a channel (jobs
/// are read off their queues with basic.get), a publisher (reports, as a
/// worker publishes them), and a consumer of an exclusive queue bound to the
/// control exchange (the cancels the api broadcasts). Each test file adds the
/// helpers it needs in an `impl Broker` of its own.
pub struct Broker {
    pub _conn: lapin::Connection,
    pub channel: lapin::Channel,
    pub publisher: vid_infra::amqp::Publisher,
    pub cancels: lapin::Consumer,
    pub topology: vid_infra::amqp::Topology,
}

impl Broker {
    /// Connects with the api's own settings and declares its topology.
    pub async fn connect(api: &TestApi) -> Broker {
        use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
        use lapin::types::FieldTable;
        let conn = vid_infra::amqp::connect(&api.state.settings.amqp, std::time::Duration::from_secs(30)).await.unwrap();
        let channel = conn.create_channel().await.unwrap();
        let topology = api.state.topology.clone();
        topology.declare(&channel).await.unwrap();
        let q = channel
            .queue_declare("", QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() }, FieldTable::default())
            .await
            .unwrap();
        let queue = q.name().as_str().to_owned();
        channel.queue_bind(&queue, &topology.control_exchange(), "", QueueBindOptions::default(), FieldTable::default()).await.unwrap();
        let cancels = channel.basic_consume(&queue, "test-cancels", BasicConsumeOptions::default(), FieldTable::default()).await.unwrap();
        let publisher = vid_infra::amqp::Publisher::new(&conn).await.unwrap();
        Broker { _conn: conn, channel, publisher, cancels, topology }
    }

    /// The next cancel published on the control exchange (within 30 s), acked.
    pub async fn next_cancel(&mut self) -> vid_core::messages::CancelTranscode {
        use futures::StreamExt;
        let delivery = tokio::time::timeout(std::time::Duration::from_secs(30), self.cancels.next())
            .await
            .expect("a cancel within 30 s")
            .expect("the consumer is open")
            .unwrap();
        delivery.acker.ack(lapin::options::BasicAckOptions::default()).await.unwrap();
        serde_json::from_slice(&delivery.data).unwrap()
    }
}

/// Polls the operation (every 50 ms, up to 30 s) until `pred` holds; returns
/// what it saw last. Fails the test with `what` and that operation otherwise.
pub async fn until(
    client: &vid_client::Client,
    op: &vid_core::OperationId,
    what: &str,
    pred: impl Fn(&vid_core::operation::Operation) -> bool,
) -> vid_core::operation::Operation {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let seen = client.get_operation(op).await.unwrap();
        if pred(&seen) {
            return seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: never; last seen {seen:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
