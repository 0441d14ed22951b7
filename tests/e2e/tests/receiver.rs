//! The real dispatcher delivering to the real reference receiver
//! (examples/webhook-receiver): every event verified, queued and applied once.

use std::process::{Command, Stdio};
use std::time::Duration;

use vid_client::upload::Uploader;
use vid_core::endpoint::CreateEndpoint;
use vid_core::operation::OperationStatus;
use vid_e2e::{bin_dir, make_video, Stack};

struct Killed(std::process::Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dispatcher_delivers_to_the_reference_receiver_which_applies_each_event_once() {
    let stack = Stack::start(&[]).await;
    let client = stack.client();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = client
        .create_endpoint(&CreateEndpoint {
            url: format!("http://127.0.0.1:{port}/webhooks"),
            description: Some("reference receiver".into()),
            event_types: None,
            signature_format: None,
        })
        .await
        .unwrap();

    let unique = vid_testkit::unique_prefix();
    let server = vid_testkit::postgres_server_url();
    let receiver = Command::new(bin_dir().join("webhook-receiver"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--database-url", &format!("{server}/receivertest_{unique}")])
        .args(["--queue", &format!("receivertest.{unique}.events")])
        .env("RECEIVER_SECRETS", &endpoint.secret)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stack.log_dir().join("webhook-receiver.log")).unwrap())
        .spawn()
        .expect("webhook-receiver runs (cargo build --bins)");
    let _receiver = Killed(receiver);
    let state_url = format!("http://127.0.0.1:{port}/events");
    let http = client.http().clone();
    // It creates its database and runs its migrations first: allow a loaded machine a minute.
    let mut up = false;
    for _ in 0..600 {
        if http.get(format!("http://127.0.0.1:{port}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the webhook-receiver did not come up within 60 s; log in {}", stack.log_dir().display());

    let dir = std::env::temp_dir().join(format!("vid-e2e-{unique}"));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("clip.mp4");
    make_video(&source, 640, 360, 2.0, "1M");
    let accepted = Uploader::new(&client).state_dir(None).upload_file(&source, None).await.unwrap();
    let op = client.wait_operation(&accepted.operation.id, Duration::from_secs(180), |_| {}).await.unwrap();
    assert_eq!(op.status, OperationStatus::Succeeded, "{:?}; logs in {}", op.error, stack.log_dir().display());
    let video_id = op.result.unwrap().video_id.to_string();

    // The receiver's own view: the video is ready, each event applied exactly once.
    let mut state = serde_json::Value::Null;
    for _ in 0..1200 {
        state = http.get(&state_url).send().await.unwrap().json().await.unwrap();
        let ready = state["videos"].as_array().unwrap().iter().any(|v| v["video_id"] == video_id.as_str() && v["status"] == "ready");
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let video = state["videos"].as_array().unwrap().iter().find(|v| v["video_id"] == video_id.as_str()).cloned();
    let video = video.unwrap_or_else(|| panic!("receiver never saw {video_id}: {state}"));
    assert_eq!(video["status"], "ready");
    let effects: Vec<&serde_json::Value> =
        state["effects"].as_array().unwrap().iter().filter(|e| e["video_id"] == video_id.as_str()).collect();
    let types: Vec<&str> = effects.iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(types.iter().filter(|t| **t == "video.ready").count(), 1, "{types:?}");
    assert_eq!(types.iter().filter(|t| **t == "video.processing").count(), 1, "{types:?}");
    // Every event the api recorded for this video reached the receiver.
    let events = client.list_events(&vid_client::EventFilter::default()).await.unwrap().data;
    for e in events.iter().filter(|e| serde_json::to_value(&e.data).unwrap()["video_id"] == video_id.as_str()) {
        assert!(
            effects.iter().any(|x| x["event_id"] == e.id.as_str()),
            "event {} ({}) was not applied by the receiver",
            e.id,
            e.type_.as_str()
        );
    }
    assert_eq!(video["version"], effects.iter().map(|e| e["version"].as_i64().unwrap()).max().unwrap());
}
