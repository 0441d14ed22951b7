//! Issue 19, the api half: `playback_policy` and `mp4_support` on `POST
//! /uploads`, carried to the video and its transcode job; playback IDs made
//! when a `Succeeded` report with a stream is applied; the
//! `/videos/{id}/playback-ids` routes; the late run's stream deleted after a
//! cancel. Real api in-process against the real PostgreSQL, RabbitMQ and
//! Garage: uploads go through storage, reports are published to the reports
//! exchange and applied by the api's own consumer, jobs are read from the
//! jobs queue. Every wait polls for the state it needs, with a deadline.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::{problem_code, TestApi};
use diesel::prelude::*;
use lapin::options::BasicGetOptions;
use vid_core::messages::{Mp4Support, ReportKind, StreamOutputs, TranscodeJob, TranscodeReport};
use vid_core::playback::PlaybackPolicy;
use vid_core::upload::CreateUpload;
use vid_core::video::{SourceMetadata, Video, VideoStatus};
use vid_core::{OperationId, PlaybackId, VideoId};
use vid_db::RunQueryDsl;

/// Janitor passes only when the test runs them.
const QUIET_JANITOR: (&str, &str) = ("operations.janitor_interval_seconds", "3600");
/// A base with a path and a trailing `/`: URLs hang off it without a double slash.
const BASE: (&str, &str) = ("api.playback_base_url", "https://stream.example.test/v1/");

/// The test's side of RabbitMQ: a publisher, and the jobs queue read with basic.get.
struct Broker {
    _conn: lapin::Connection,
    channel: lapin::Channel,
    publisher: vid_infra::amqp::Publisher,
    topology: vid_infra::amqp::Topology,
}

impl Broker {
    async fn connect(api: &TestApi) -> Broker {
        let conn = vid_infra::amqp::connect(&api.state.settings.amqp, Duration::from_secs(30)).await.unwrap();
        let channel = conn.create_channel().await.unwrap();
        let topology = api.state.topology.clone();
        topology.declare(&channel).await.unwrap();
        let publisher = vid_infra::amqp::Publisher::new(&conn).await.unwrap();
        Broker { _conn: conn, channel, publisher, topology }
    }

    /// Publishes a report of run `run` (job attempt 1) as a transcoder does.
    async fn report(&self, op: &OperationId, video: &VideoId, run: &str, kind: ReportKind) {
        let report = TranscodeReport {
            operation_id: op.clone(),
            video_id: video.clone(),
            worker: "test".into(),
            emitted_at: Utc::now(),
            run_id: run.into(),
            attempt: 1,
            kind,
        };
        self.publisher
            .publish_json(&self.topology.reports_exchange(), vid_infra::amqp::RK_REPORT, &report, Some(op.as_str()))
            .await
            .unwrap();
    }

    /// Waits (up to 30 s) until the relay has published a job of `op`; returns it.
    async fn job_of(&self, op: &OperationId) -> TranscodeJob {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let queue = self.topology.transcode_jobs();
        loop {
            while let Some(m) = self.channel.basic_get(&queue, BasicGetOptions { no_ack: true }).await.unwrap() {
                let job: TranscodeJob = serde_json::from_slice(&m.delivery.data).unwrap();
                if &job.operation_id == op {
                    return job;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "no job of {op} published");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn upload_req(playback_policy: Option<Vec<PlaybackPolicy>>, mp4_support: Option<Mp4Support>) -> CreateUpload {
    CreateUpload {
        size_bytes: 100,
        content_type: "video/mp4".into(),
        filename: Some("a.mp4".into()),
        playback_policy,
        mp4_support,
        ..Default::default()
    }
}

/// Creates an upload with `req`, sends its one part to storage, completes it:
/// (operation, video) of the `processing` video.
async fn uploaded(client: &vid_client::Client, req: &CreateUpload) -> (OperationId, VideoId) {
    let created = client.create_upload(req, None).await.unwrap();
    assert_eq!(created.parts.len(), 1);
    let part = &created.parts[0];
    let resp = client.http().put(&part.url).body(vec![7u8; req.size_bytes as usize]).send().await.unwrap();
    assert!(resp.status().is_success(), "storage refused the part: {}", resp.status());
    let accepted = client.complete_upload(&created.id, None).await.unwrap();
    let video = accepted.operation.metadata.video_id.clone().expect("the operation names its video");
    (accepted.operation.id, video)
}

/// (`uploads.playback_policy`, `uploads.mp4_support`) and the same of `videos`, as stored.
async fn stored_options(api: &TestApi, video: &VideoId) -> ((Vec<String>, String), (Vec<String>, String)) {
    use vid_db::schema::{uploads, videos};
    let mut conn = api.state.db.get().await.unwrap();
    let upload: (Vec<String>, String) = uploads::table
        .inner_join(videos::table.on(videos::upload_id.eq(uploads::id)))
        .filter(videos::id.eq(video.as_str()))
        .select((uploads::playback_policy, uploads::mp4_support))
        .first(&mut conn)
        .await
        .unwrap();
    let video: (Vec<String>, String) = videos::table
        .filter(videos::id.eq(video.as_str()))
        .select((videos::playback_policy, videos::mp4_support))
        .first(&mut conn)
        .await
        .unwrap();
    (upload, video)
}

/// Rows of `playback_ids` of `video` (any tenant): (id, policy).
async fn playback_rows(api: &TestApi, video: &VideoId) -> Vec<(String, String)> {
    use vid_db::schema::playback_ids;
    let mut conn = api.state.db.get().await.unwrap();
    playback_ids::table
        .filter(playback_ids::video_id.eq(video.as_str()))
        .order(playback_ids::created_at.asc())
        .select((playback_ids::id, playback_ids::policy))
        .load(&mut conn)
        .await
        .unwrap()
}

/// `videos.stream` as stored.
async fn stored_stream(api: &TestApi, video: &VideoId) -> Option<serde_json::Value> {
    use vid_db::schema::videos;
    let mut conn = api.state.db.get().await.unwrap();
    videos::table.filter(videos::id.eq(video.as_str())).select(videos::stream).first(&mut conn).await.unwrap()
}

/// Polls the video (every 50 ms, up to 30 s) until `pred` holds.
async fn video_until(client: &vid_client::Client, video: &VideoId, what: &str, pred: impl Fn(&Video) -> bool) -> Video {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = client.get_video(video).await.unwrap();
        if pred(&seen) {
            return seen;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: never; last seen {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn source() -> SourceMetadata {
    SourceMetadata {
        container: "mp4".into(),
        duration_seconds: Some(1.0),
        width: 64,
        height: 64,
        rotation: 0,
        video_codec: "h264".into(),
        audio_codec: None,
        frame_rate: Some(25.0),
        size_bytes: 100,
    }
}

/// The stream a transcoder writes for `video` of `tenant`.
fn stream_of(tenant: &vid_core::TenantId, video: &VideoId) -> StreamOutputs {
    let prefix = format!("tenants/{tenant}/videos/{video}/stream/");
    StreamOutputs {
        hls_master_key: format!("{prefix}master.m3u8"),
        dash_manifest_key: format!("{prefix}manifest.mpd"),
        prefix,
        segment_duration_ms: 4000,
        objects: 3,
        size_bytes: 30,
        images: None,
    }
}

fn succeeded(stream: Option<StreamOutputs>) -> ReportKind {
    ReportKind::Succeeded { source: source(), renditions: vec![], poster: None, stream }
}

/// Publishes `Started` then `Succeeded` of run `run` and waits until the video is ready.
async fn finish(broker: &Broker, client: &vid_client::Client, op: &OperationId, video: &VideoId, stream: Option<StreamOutputs>) -> Video {
    broker.report(op, video, "run-1", ReportKind::Started).await;
    broker.report(op, video, "run-1", succeeded(stream)).await;
    video_until(client, video, "ready", |v| v.status == VideoStatus::Ready).await
}

/// A raw JSON request with the client's key: (status, body).
async fn raw(api: &TestApi, key: &str, method: reqwest::Method, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", api.url)).bearer_auth(key);
    if let Some(b) = body {
        req = req.header("Content-Type", "application/json").body(b.to_owned());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn upload_options_are_stored_copied_to_the_video_and_reach_the_transcode_job() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();

    // Defaults: ["public"], standard.
    let (op, video) = uploaded(&client, &upload_req(None, None)).await;
    let (upload, stored) = stored_options(&api, &video).await;
    assert_eq!(upload, (vec!["public".to_owned()], "standard".to_owned()));
    assert_eq!(stored, upload, "complete copies the upload's options to the video");
    assert_eq!(broker.job_of(&op).await.mp4_support, Mp4Support::Standard);
    let shown = client.get_video(&video).await.unwrap();
    assert_eq!((shown.mp4_support, shown.playback_ids.len()), (Mp4Support::Standard, 0), "no playback ID before ready");

    // Explicit: repeated policies collapse; mp4_support none reaches the job.
    let (op, video) =
        uploaded(&client, &upload_req(Some(vec![PlaybackPolicy::Public, PlaybackPolicy::Public]), Some(Mp4Support::None))).await;
    let (upload, stored) = stored_options(&api, &video).await;
    assert_eq!(upload, (vec!["public".to_owned()], "none".to_owned()));
    assert_eq!(stored, upload);
    assert_eq!(broker.job_of(&op).await.mp4_support, Mp4Support::None);
    assert_eq!(client.get_video(&video).await.unwrap().mp4_support, Mp4Support::None);

    // `[]`: stored as no policy.
    let (_, video) = uploaded(&client, &upload_req(Some(vec![]), Some(Mp4Support::Standard))).await;
    assert_eq!(stored_options(&api, &video).await.1, (Vec::<String>::new(), "standard".to_owned()));
}

#[tokio::test]
async fn a_redriven_job_keeps_the_videos_mp4_support() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let (op, video) = uploaded(&client, &upload_req(None, Some(Mp4Support::None))).await;
    assert_eq!(broker.job_of(&op).await.mp4_support, Mp4Support::None);
    // A pass "later" than the re-drive delay publishes the job again.
    let later = Utc::now() + chrono::Duration::seconds(api.state.settings.operations.redrive_after_seconds as i64 + 60);
    let mut conn = api.state.db.get().await.unwrap();
    let pass = vid_api::janitor::redrive(&api.state, &mut conn, later).await.unwrap();
    assert_eq!(pass.redriven, 1);
    let again = broker.job_of(&op).await;
    assert_eq!((again.attempt, again.mp4_support, &again.video_id), (2, Mp4Support::None, &video));
}

#[tokio::test]
async fn a_succeeded_report_with_a_stream_makes_one_playback_id_per_policy_once() {
    let api = TestApi::start(&[QUIET_JANITOR, BASE]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let tenant = api.tenant_id().await;

    let (op, video) = uploaded(&client, &upload_req(None, None)).await;
    let stream = stream_of(&tenant, &video);
    let ready = finish(&broker, &client, &op, &video, Some(stream.clone())).await;
    assert_eq!(ready.playback_ids.len(), 1, "{:?}", ready.playback_ids);
    let pb = &ready.playback_ids[0];
    assert_eq!(pb.policy, PlaybackPolicy::Public);
    assert!(pb.id.as_str().starts_with("pb_"));
    assert_eq!(pb.hls_url, format!("https://stream.example.test/v1/play/{}.m3u8", pb.id));
    assert_eq!(pb.dash_url, format!("https://stream.example.test/v1/play/{}.mpd", pb.id));
    assert_eq!(stored_stream(&api, &video).await, Some(serde_json::to_value(&stream).unwrap()), "videos.stream holds the report's stream");

    // A duplicate Succeeded (a redelivery) makes no second set. The reports
    // queue is consumed in order, so once a later report of another video is
    // applied, the duplicate has been too.
    broker.report(&op, &video, "run-1", succeeded(Some(stream.clone()))).await;
    let (op2, video2) = uploaded(&client, &upload_req(Some(vec![]), None)).await;
    finish(&broker, &client, &op2, &video2, Some(stream_of(&tenant, &video2))).await;
    assert_eq!(playback_rows(&api, &video).await, vec![(pb.id.to_string(), "public".to_owned())]);
    assert_eq!(client.get_video(&video).await.unwrap().playback_ids, ready.playback_ids);
    // `[]`: ready with a stream, and no playback ID.
    assert!(playback_rows(&api, &video2).await.is_empty());

    // GET /videos lists them too, with the same URLs.
    let page = client.list_videos(None).await.unwrap();
    let listed = page.data.iter().find(|v| v.id == video).unwrap();
    assert_eq!(listed.playback_ids, ready.playback_ids);
}

#[tokio::test]
async fn a_succeeded_report_without_a_stream_makes_no_playback_id() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let (op, video) = uploaded(&client, &upload_req(Some(vec![PlaybackPolicy::Public]), None)).await;
    let ready = finish(&broker, &client, &op, &video, None).await;
    assert!(ready.playback_ids.is_empty(), "{:?}", ready.playback_ids);
    assert!(playback_rows(&api, &video).await.is_empty());
    assert_eq!(stored_stream(&api, &video).await, None);
}

#[tokio::test]
async fn playback_ids_are_added_listed_oldest_first_and_deleted_per_video_and_tenant() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let tenant = api.tenant_id().await;

    // On a processing video: allowed (it serves once ready).
    let (op, video) = uploaded(&client, &upload_req(Some(vec![]), None)).await;
    let first = client.create_playback_id(&video, PlaybackPolicy::Public).await.unwrap();
    assert_eq!(first.policy, PlaybackPolicy::Public);
    assert_eq!(first.hls_url, format!("http://127.0.0.1:8090/play/{}.m3u8", first.id), "the default playback_base_url");
    let second = client.create_playback_id(&video, PlaybackPolicy::Public).await.unwrap();
    assert_ne!(first.id, second.id);
    let shown = client.get_video(&video).await.unwrap();
    assert_eq!(shown.status, VideoStatus::Processing);
    assert_eq!(shown.playback_ids, vec![first.clone(), second.clone()], "oldest first");

    // Ready: the default set is not added (the upload asked for none); the added ones stay.
    let ready = finish(&broker, &client, &op, &video, Some(stream_of(&tenant, &video))).await;
    assert_eq!(ready.playback_ids, vec![first.clone(), second.clone()]);

    // Another video's id, and an unknown one: 404 not_found.
    let (_, other_video) = uploaded(&client, &upload_req(Some(vec![]), None)).await;
    let theirs = client.create_playback_id(&other_video, PlaybackPolicy::Public).await.unwrap();
    let err = client.delete_playback_id(&video, &theirs.id).await.unwrap_err();
    assert_eq!(problem_code(&err), "not_found");
    let err = client.delete_playback_id(&video, &PlaybackId::generate()).await.unwrap_err();
    assert_eq!(problem_code(&err), "not_found");
    let (status, body) = raw(&api, &api.key, reqwest::Method::DELETE, &format!("/videos/{video}/playback-ids/vid_nope"), None).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")), "a malformed id");
    assert_eq!(client.get_video(&other_video).await.unwrap().playback_ids, vec![theirs.clone()]);

    // Another tenant sees none of it.
    let stranger = api.other_tenant().await;
    assert_eq!(problem_code(&stranger.create_playback_id(&video, PlaybackPolicy::Public).await.unwrap_err()), "not_found");
    assert_eq!(problem_code(&stranger.delete_playback_id(&video, &first.id).await.unwrap_err()), "not_found");
    assert_eq!(playback_rows(&api, &video).await.len(), 2);

    // Delete: 204, gone from the video; a second delete is 404.
    client.delete_playback_id(&video, &first.id).await.unwrap();
    assert_eq!(client.get_video(&video).await.unwrap().playback_ids, vec![second.clone()]);
    assert_eq!(problem_code(&client.delete_playback_id(&video, &first.id).await.unwrap_err()), "not_found");
    let (status, _) = raw(&api, &api.key, reqwest::Method::DELETE, &format!("/videos/{video}/playback-ids/{}", second.id), None).await;
    assert_eq!(status, 204);
    assert!(client.get_video(&video).await.unwrap().playback_ids.is_empty());

    // An unknown video: 404.
    let err = client.create_playback_id(&VideoId::generate(), PlaybackPolicy::Public).await.unwrap_err();
    assert_eq!(problem_code(&err), "not_found");
}

#[tokio::test]
async fn signed_is_accepted_without_a_signing_key_and_bad_values_are_400() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let client = api.client();

    // Issue 20: `signed` is served; the tenant has no signing key yet (it may come later).
    let (_, signed_video) = uploaded(&client, &upload_req(Some(vec![PlaybackPolicy::Public, PlaybackPolicy::Signed]), None)).await;
    let (upload, stored) = stored_options(&api, &signed_video).await;
    assert_eq!(upload.0, vec!["public".to_owned(), "signed".to_owned()]);
    assert_eq!(stored.0, upload.0);

    let (_, video) = uploaded(&client, &upload_req(None, None)).await;
    let created = client.create_playback_id(&video, PlaybackPolicy::Signed).await.unwrap();
    assert_eq!(created.policy, PlaybackPolicy::Signed);
    assert_eq!(playback_rows(&api, &video).await, vec![(created.id.to_string(), "signed".to_owned())]);
    assert_eq!(client.get_video(&video).await.unwrap().playback_ids, vec![created]);

    let upload = |extra: &str| format!(r#"{{"size_bytes": 100, "content_type": "video/mp4"{extra}}}"#);
    for body in [
        upload(r#", "playback_policy": ["private"]"#),
        upload(r#", "playback_policy": "public""#),
        upload(r#", "playback_policy": [null]"#),
        upload(r#", "mp4_support": "capped-1080p""#),
        upload(r#", "mp4_support": null, "playback_policy": [1]"#),
    ] {
        let (status, problem) = raw(&api, &api.key, reqwest::Method::POST, "/uploads", Some(&body)).await;
        assert_eq!((status, problem["code"].as_str()), (400, Some("invalid_json")), "{body}: {problem}");
    }
    let path = format!("/videos/{video}/playback-ids");
    for body in [r#"{"policy": "private"}"#, r#"{}"#, r#"{"policy": "public", "extra": 1}"#, ""] {
        let (status, problem) = raw(&api, &api.key, reqwest::Method::POST, &path, Some(body)).await;
        assert_eq!((status, problem["code"].as_str()), (400, Some("invalid_json")), "{body:?}: {problem}");
    }
    assert_eq!(playback_rows(&api, &video).await.len(), 1, "no bad body added one");
}

#[tokio::test]
async fn the_idempotency_key_compares_the_playback_options() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let client = api.client();
    let first = client.create_upload(&upload_req(None, None), Some("k-playback")).await.unwrap();
    let again = client.create_upload(&upload_req(None, None), Some("k-playback")).await.unwrap();
    assert_eq!(again.id, first.id, "the same body replays");
    for other in [upload_req(Some(vec![]), None), upload_req(None, Some(Mp4Support::None))] {
        let err = client.create_upload(&other, Some("k-playback")).await.unwrap_err();
        assert_eq!(problem_code(&err), "idempotency_key_reused", "{other:?}");
    }
}

#[tokio::test]
async fn a_late_success_after_a_customer_cancel_deletes_the_stream_objects() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let tenant = api.tenant_id().await;
    let (op, video) = uploaded(&client, &upload_req(None, None)).await;
    broker.report(&op, &video, "run-1", ReportKind::Started).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client.get_operation(&op).await.unwrap().status != vid_core::operation::OperationStatus::Running {
        assert!(tokio::time::Instant::now() < deadline, "never running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // What run-1 wrote: the stream, and a key beside it that is not the stream's.
    let stream = stream_of(&tenant, &video);
    let (s3, bucket) = (&api.state.s3, &api.state.settings.s3.bucket);
    let written = [stream.hls_master_key.clone(), stream.dash_manifest_key.clone(), format!("{}720p/seg-00001.m4s", stream.prefix)];
    let beside = format!("tenants/{tenant}/videos/{video}/streamless.txt");
    for key in written.iter().chain([&beside]) {
        s3.put_object().bucket(bucket).key(key).body(b"x".to_vec().into()).send().await.unwrap();
    }
    let listed = |prefix: String| async move {
        let out = s3.list_objects_v2().bucket(bucket).prefix(prefix).send().await.unwrap();
        out.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect::<Vec<_>>()
    };
    assert_eq!(listed(stream.prefix.clone()).await.len(), 3);

    client.cancel_operation(&op).await.unwrap();
    broker.report(&op, &video, "run-1", succeeded(Some(stream.clone()))).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = listed(stream.prefix.clone()).await;
        if left.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the late stream was not deleted: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(listed(beside.clone()).await, vec![beside.clone()], "only the stream prefix is deleted");
    let shown = client.get_video(&video).await.unwrap();
    assert_eq!(shown.status, VideoStatus::Cancelled);
    assert!(shown.playback_ids.is_empty(), "a cancelled video gets no playback ID");
    assert_eq!(stored_stream(&api, &video).await, None);
    s3.delete_object().bucket(bucket).key(&beside).send().await.unwrap();
}

/// Issue 20: `poster_time` is validated (a number ≥ 0), stored on the upload
/// and the video, and carried into the transcode job and its re-drive.
#[tokio::test]
async fn poster_time_is_validated_copied_to_the_video_and_reaches_the_transcode_job() {
    use vid_db::schema::{uploads, videos};
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let req = CreateUpload { poster_time: Some(serde_json::Number::from_f64(2.5).unwrap()), ..upload_req(None, None) };
    let (op, video) = uploaded(&client, &req).await;
    assert_eq!(broker.job_of(&op).await.poster_time, Some(2.5));
    let mut conn = api.state.db.get().await.unwrap();
    let stored: (Option<f64>, Option<f64>) = uploads::table
        .inner_join(videos::table.on(videos::upload_id.eq(uploads::id)))
        .filter(videos::id.eq(video.as_str()))
        .select((uploads::poster_time, videos::poster_time))
        .first(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, (Some(2.5), Some(2.5)));
    let later = Utc::now() + chrono::Duration::seconds(api.state.settings.operations.redrive_after_seconds as i64 + 60);
    assert_eq!(vid_api::janitor::redrive(&api.state, &mut conn, later).await.unwrap().redriven, 1);
    assert_eq!(broker.job_of(&op).await.poster_time, Some(2.5), "a re-drive keeps it");

    let (op, _) = uploaded(&client, &upload_req(None, None)).await;
    assert_eq!(broker.job_of(&op).await.poster_time, None, "absent: the transcoder's rule");
    for (body, status, code) in [
        (r#"{"size_bytes":100,"content_type":"video/mp4","poster_time":-0.5}"#, 422, "invalid_poster_time"),
        (r#"{"size_bytes":100,"content_type":"video/mp4","poster_time":"3"}"#, 400, "invalid_json"),
    ] {
        let (got, problem) = raw(&api, &api.key, reqwest::Method::POST, "/uploads", Some(body)).await;
        assert_eq!((got, problem["code"].as_str()), (status, Some(code)), "{body}: {problem}");
    }
}

/// Finding 6 of issue 19's review: a video with nothing to play takes no
/// playback ID. `failed` and `cancelled` answer `409 video_not_playable` with
/// the status; nothing is stored; `processing` still takes one.
#[tokio::test]
async fn a_failed_or_cancelled_video_takes_no_playback_id() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let client = api.client();
    let add = |video: VideoId| {
        let api = &api;
        async move { raw(api, &api.key, reqwest::Method::POST, &format!("/videos/{video}/playback-ids"), Some(r#"{"policy":"public"}"#)).await }
    };

    let (op, failed) = uploaded(&client, &upload_req(Some(vec![]), None)).await;
    broker.report(&op, &failed, "run-1", ReportKind::Started).await;
    let error = vid_core::Problem::new(422, "no_video_stream", "No video stream");
    broker.report(&op, &failed, "run-1", ReportKind::Failed { error, source: None }).await;
    video_until(&client, &failed, "failed", |v| v.status == VideoStatus::Failed).await;
    let (status, body) = add(failed.clone()).await;
    assert_eq!((status, body["code"].as_str(), body["video_status"].as_str()), (409, Some("video_not_playable"), Some("failed")), "{body}");
    assert!(playback_rows(&api, &failed).await.is_empty(), "a refused add stores nothing");

    let (op, cancelled) = uploaded(&client, &upload_req(Some(vec![]), None)).await;
    client.cancel_operation(&op).await.unwrap();
    video_until(&client, &cancelled, "cancelled", |v| v.status == VideoStatus::Cancelled).await;
    let (status, body) = add(cancelled.clone()).await;
    assert_eq!(
        (status, body["code"].as_str(), body["video_status"].as_str()),
        (409, Some("video_not_playable"), Some("cancelled")),
        "{body}"
    );
    assert!(playback_rows(&api, &cancelled).await.is_empty());

    let (_, processing) = uploaded(&client, &upload_req(Some(vec![]), None)).await;
    let (status, body) = add(processing.clone()).await;
    assert_eq!(status, 201, "a processing video takes one: {body}");
    assert_eq!(playback_rows(&api, &processing).await.len(), 1);
}
