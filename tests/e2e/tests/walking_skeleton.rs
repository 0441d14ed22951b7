//! One real video through the whole system: upload in parallel parts straight
//! to storage, complete (202 + Location), transcode, video.ready webhook.

use std::time::Duration;

use vid_client::upload::Uploader;
use vid_core::endpoint::CreateEndpoint;
use vid_core::operation::OperationStatus;
use vid_e2e::{ffprobe, make_video, Receiver, Stack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_real_video_travels_the_whole_system() {
    let stack = Stack::start(&[]).await;
    let client = stack.client();
    let receiver = Receiver::start(200).await;
    let endpoint = client
        .create_endpoint(&CreateEndpoint { url: receiver.url(), description: None, event_types: None, signature_format: None })
        .await
        .expect("endpoint registers");
    assert!(endpoint.secret.starts_with("whsec_"));

    // ~12 MB of real H.264 → three 5 MiB parts, sent in parallel.
    let dir = tempdir();
    let source = dir.join("source.mp4");
    make_video(&source, 1280, 720, 6.0, "40M");
    let size = std::fs::metadata(&source).unwrap().len();
    assert!(size > 10 * 1024 * 1024, "source should need several parts, got {size} bytes");

    let accepted = Uploader::new(&client).parallel(3).state_dir(None).upload_file(&source, None).await.expect("upload completes");
    assert_eq!(accepted.location, format!("/operations/{}", accepted.operation.id));
    assert_eq!(accepted.operation.status, OperationStatus::Pending);

    let op = client.wait_operation(&accepted.operation.id, Duration::from_secs(240), |_| {}).await.expect("operation ends");
    assert_eq!(op.status, OperationStatus::Succeeded, "operation failed: {:?}; logs in {}", op.error, stack.log_dir().display());
    assert_eq!(op.progress, 100);
    let result = op.result.expect("result set on success");

    let video = client.get_video(&result.video_id).await.unwrap();
    let r720 = video.renditions.iter().find(|r| r.height == 720).expect("a 720p rendition");
    assert_eq!((r720.width, r720.height), (1280, 720));
    let url = r720.url.as_ref().expect("download URL");
    let bytes = client.http().get(url).send().await.unwrap().error_for_status().unwrap().bytes().await.unwrap();
    let out = dir.join("720p.mp4");
    std::fs::write(&out, &bytes).unwrap();
    let probe = ffprobe(&out);
    let streams = probe["streams"].as_array().unwrap();
    let v = streams.iter().find(|s| s["codec_type"] == "video").expect("video stream");
    assert_eq!(v["codec_name"], "h264");
    assert_eq!((v["width"].as_u64(), v["height"].as_u64()), (Some(1280), Some(720)));
    assert!(streams.iter().any(|s| s["codec_type"] == "audio" && s["codec_name"] == "aac"));

    // The webhook: Webhook-Id equals the body's id, and our own HMAC matches.
    let got = receiver
        .wait_for(Duration::from_secs(120), |r| {
            serde_json::from_slice::<serde_json::Value>(&r.body).map(|b| b["type"] == "video.ready").unwrap_or(false)
        })
        .await
        .expect("video.ready webhook arrives");
    let body: serde_json::Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(got.headers["webhook-id"], body["id"].as_str().unwrap());
    assert_eq!(got.headers["content-type"], "application/json");
    assert_eq!(body["data"]["video_id"], result.video_id.as_str());
    assert_eq!(body["data"]["operation_id"], op.id.as_str());
    assert!(body["data"]["version"].as_i64().unwrap() >= 2);
    let sig = &got.headers["webhook-signature"];
    let t = sig.split(',').find_map(|p| p.trim().strip_prefix("t=")).expect("t=");
    let v1 = sig.split(',').find_map(|p| p.trim().strip_prefix("v1=")).expect("v1=");
    let key_bytes = decode_b64(endpoint.secret.strip_prefix("whsec_").unwrap());
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key_bytes);
    let mut signed = format!("{t}.").into_bytes();
    signed.extend_from_slice(&got.body);
    assert_eq!(hex::encode(ring::hmac::sign(&key, &signed).as_ref()), v1, "HMAC over t.body with the decoded secret");
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vid-e2e-{}", vid_testkit::unique_prefix()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Standard base64 decoding, written out so the test does not share the SDK's code.
fn decode_b64(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        acc = (acc << 6) | A.iter().position(|a| *a == c).expect("base64") as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
