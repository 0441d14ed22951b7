//! Harness for end-to-end tests: runs the real `api`, `playback`, `transcoder`
//! and `webhook-dispatcher` binaries (built by `cargo build --bins`) against the
//! local stack, each test with its own database and RabbitMQ prefix, and a
//! recording webhook receiver on loopback.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// The directory holding the built service binaries.
pub fn bin_dir() -> PathBuf {
    let root = vid_testkit::repo_root();
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target"));
    target.join("debug")
}

/// A loopback port nothing listens on now and that this process has not
/// handed out before. The port is released before a child binds it, so two
/// tests of one binary (they run in parallel) could otherwise be handed the
/// same port between the release and the child's bind: one test's api then
/// answered another's dispatcher health route (`{"status":"not found"}`).
fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !handed.contains(&port) {
            handed.push(port);
            return port;
        }
    }
}

/// One running platform: four child processes sharing a fresh database and prefix.
pub struct Stack {
    /// `http://127.0.0.1:<port>`
    pub api_url: String,
    /// The playback service: `http://127.0.0.1:<port>` (also the api's
    /// `playback_base_url`, so `hls_url`s point at it).
    pub playback_url: String,
    /// An API key of a fresh tenant.
    pub api_key: String,
    /// The database URL.
    pub database_url: String,
    env: Vec<(String, String)>,
    children: HashMap<&'static str, Child>,
    log_dir: PathBuf,
}

impl Stack {
    /// The environment of the four services (test profile, `database_url`,
    /// queue `prefix`, free loopback ports, `extra_env` last so it overrides),
    /// with logs in `log_dir`; nothing started yet.
    fn configure(database_url: String, prefix: String, log_dir: PathBuf, extra_env: &[(&str, &str)]) -> Stack {
        let port = free_port();
        let playback_port = free_port();
        let root = vid_testkit::repo_root();
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut env: Vec<(String, String)> = vid_testkit::stack_env().into_iter().collect();
        env.extend([
            ("VID_PROFILE".into(), "test".into()),
            ("VID_CONFIG_DIR".into(), root.join("config").display().to_string()),
            ("VID__DATABASE__URL".into(), database_url.clone()),
            ("VID__AMQP__PREFIX".into(), prefix.clone()),
            ("VID__API__LISTEN".into(), format!("127.0.0.1:{port}")),
            ("VID__TRANSCODER__HEALTH_LISTEN".into(), format!("127.0.0.1:{}", free_port())),
            ("VID__TRANSCODER__WORK_DIR".into(), std::env::temp_dir().join(format!("vid-{prefix}")).display().to_string()),
            ("VID__DISPATCHER__HEALTH_LISTEN".into(), format!("127.0.0.1:{}", free_port())),
            ("VID__INGEST_WORKER__HEALTH_LISTEN".into(), format!("127.0.0.1:{}", free_port())),
            ("VID__PLAYBACK__LISTEN".into(), format!("127.0.0.1:{playback_port}")),
            ("VID__API__PLAYBACK_BASE_URL".into(), format!("http://127.0.0.1:{playback_port}")),
        ]);
        for (k, v) in extra_env {
            env.push(((*k).into(), (*v).into()));
        }
        Stack {
            api_url: format!("http://127.0.0.1:{port}"),
            playback_url: format!("http://127.0.0.1:{playback_port}"),
            api_key: String::new(),
            database_url,
            env,
            children: HashMap::new(),
            log_dir,
        }
    }

    /// Starts the four services and creates a tenant. `extra_env` overrides settings
    /// (`VID__SECTION__KEY`).
    pub async fn start(extra_env: &[(&str, &str)]) -> Stack {
        let database_url = vid_testkit::fresh_database().await;
        let prefix = vid_testkit::unique_prefix();
        let log_dir = vid_testkit::repo_root().join(".local/test-logs").join(&prefix);
        let mut stack = Stack::configure(database_url, prefix, log_dir, extra_env);
        stack.api_key = stack.create_tenant("e2e");
        for name in ["api", "playback", "transcoder", "webhook-dispatcher", "ingest"] {
            stack.spawn(name);
        }
        stack.wait_healthy().await;
        stack
    }

    fn command(&self, name: &str) -> Command {
        let path = bin_dir().join(name);
        assert!(path.exists(), "{} is missing: run `cargo build --bins` (make test does)", path.display());
        let mut cmd = Command::new(path);
        cmd.current_dir(vid_testkit::repo_root());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn create_tenant(&self, name: &str) -> String {
        let out = self.command("api").args(["create-tenant", "--name", name]).stderr(Stdio::inherit()).output().unwrap();
        assert!(out.status.success(), "create-tenant failed");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Starts (or restarts) one service; its output goes to `.local/test-logs/<prefix>/<name>.log`.
    pub fn spawn(&mut self, name: &'static str) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_dir.join(format!("{name}.log"))).unwrap();
        let child = self.command(name).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
        self.children.insert(name, child);
    }

    /// SIGKILLs one service.
    pub fn kill(&mut self, name: &str) {
        if let Some(mut c) = self.children.remove(name) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn wait_healthy(&self) {
        'services: for (name, url) in [("api", &self.api_url), ("playback", &self.playback_url)] {
            let client = vid_client::Client::new(url, &self.api_key);
            for _ in 0..150 {
                if client.raw(vid_client::HttpMethod::GET, "/healthz", None).await.is_ok() {
                    continue 'services;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{name} did not become healthy; see {}", self.log_dir.display());
        }
    }

    /// An SDK client for the tenant.
    pub fn client(&self) -> vid_client::Client {
        vid_client::Client::new(&self.api_url, &self.api_key)
    }

    /// Where the services' logs are.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for (_, mut c) in self.children.drain() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub struct Received {
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    /// The raw body bytes.
    pub body: Bytes,
}

/// A webhook receiver on 127.0.0.1 that records every request and answers `status`.
#[derive(Clone)]
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Everything received so far.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// The status it answers with (changeable while running).
    pub status: Arc<Mutex<u16>>,
}

impl Receiver {
    /// Starts a receiver answering `status`.
    pub async fn start(status: u16) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(Mutex::new(status));
        let (rec, st) = (received.clone(), status.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (rec, st) = (rec.clone(), st.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (rec, st) = (rec.clone(), st.clone());
                        async move {
                            let headers =
                                req.headers().iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            rec.lock().unwrap().push(Received { headers, body });
                            let code = *st.lock().unwrap();
                            Ok::<_, hyper::Error>(Response::builder().status(code).body(Full::new(Bytes::from_static(b"ok"))).unwrap())
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Receiver { addr, received, status }
    }

    /// `http://127.0.0.1:<port>/hook`
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Waits until a request satisfying `pred` arrives; returns it.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&Received) -> bool) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(r) = self.received.lock().unwrap().iter().find(|r| pred(r)).cloned() {
                return Some(r);
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `ffprobe -show_streams -show_format` as JSON (of a file or a URL).
pub use vid_testkit::stream::ffprobe;

/// Makes a real H.264/AAC MP4 with the ffmpeg CLI (test pattern + tone).
pub fn make_video(path: &Path, width: u32, height: u32, seconds: f32, video_bitrate: &str) {
    let status = Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size={width}x{height}:rate=25:duration={seconds}"))
        .args(["-f", "lavfi", "-i"])
        .arg(format!("sine=frequency=440:duration={seconds}"))
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-b:v", video_bitrate, "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest"])
        .arg(path)
        .status()
        .expect("ffmpeg runs");
    assert!(status.success(), "ffmpeg could not make {}", path.display());
}

// ---------------------------------------------------------------------------
// Helpers for the operations tests (issue 4).
// ---------------------------------------------------------------------------

impl Stack {
    /// The value a `VID__…` (or other) variable has for this stack's services, if set.
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The transcoder's local work directory (`<work_dir>/<operation id>/` exists while it holds a job).
    pub fn transcoder_work_dir(&self) -> PathBuf {
        PathBuf::from(self.env_value("VID__TRANSCODER__WORK_DIR").expect("set by Stack::start"))
    }

    /// Waits until the transcoder's `/readyz` answers 200 (it consumes the job queue).
    pub async fn wait_transcoder_ready(&self, timeout: Duration) {
        let addr = self.env_value("VID__TRANSCODER__HEALTH_LISTEN").expect("set by Stack::start").to_owned();
        let http = reqwest_client();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(r) = http.http().get(format!("http://{addr}/readyz")).send().await {
                if r.status().as_u16() == 200 {
                    return;
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "transcoder not ready; see {}", self.log_dir.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The tenant that owns `video_id`, read from the stack's database with `psql`.
    pub fn tenant_of_video(&self, video_id: &str) -> String {
        assert!(video_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "not an id: {video_id}");
        let out = Command::new("psql")
            .args([self.database_url.as_str(), "-Atc", &format!("SELECT tenant_id FROM videos WHERE id = '{video_id}'")])
            .output()
            .expect("psql runs");
        assert!(out.status.success(), "psql failed: {}", String::from_utf8_lossy(&out.stderr));
        let t = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(!t.is_empty(), "no video {video_id}");
        t
    }

    /// The storage prefix of a video's outputs: `tenants/<tenant>/videos/<video>/`.
    pub fn outputs_prefix(&self, video_id: &str) -> String {
        format!("tenants/{}/videos/{video_id}/", self.tenant_of_video(video_id))
    }
}

fn reqwest_client() -> vid_client::Client {
    vid_client::Client::new("http://127.0.0.1", "")
}

#[derive(serde::Deserialize)]
struct S3Only {
    s3: vid_infra::settings::S3Settings,
}

/// An S3 client for the media bucket of the local stack, and the bucket's name.
pub fn media_bucket() -> (aws_sdk_s3::Client, String) {
    let s: S3Only = vid_testkit::settings(&[]);
    (vid_infra::storage::client(&s.s3), s.s3.bucket.clone())
}

/// Every key in the media bucket under `prefix`.
pub async fn list_keys(prefix: &str) -> Vec<String> {
    let (s3, bucket) = media_bucket();
    let mut keys = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let resp = s3
            .list_objects_v2()
            .bucket(&bucket)
            .prefix(prefix)
            .set_continuation_token(token.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("listing s3://{bucket}/{prefix}: {}", aws_sdk_s3::error::DisplayErrorContext(e)));
        keys.extend(resp.contents().iter().filter_map(|o| o.key().map(str::to_owned)));
        match resp.next_continuation_token() {
            Some(t) if resp.is_truncated() == Some(true) => token = Some(t.to_owned()),
            _ => return keys,
        }
    }
}

/// Runs the ffmpeg CLI (`-hide_banner -loglevel error -y` + `args`); panics if it fails.
pub fn ffmpeg(args: &[&str]) {
    let status = Command::new("ffmpeg").args(["-hide_banner", "-loglevel", "error", "-y"]).args(args).status().expect("ffmpeg runs");
    assert!(status.success(), "ffmpeg {args:?} failed");
}

/// A fresh temporary directory for one test's clips.
pub fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("vid-e2e-{}", vid_testkit::unique_prefix()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ---------------------------------------------------------------------------
// Helpers for the chaos run (issue 11, `src/bin/chaos.rs`).
// ---------------------------------------------------------------------------

impl Stack {
    /// Like [`Stack::start`], but on an existing, already migrated database
    /// (`database_url`) instead of a fresh one on the shared server, with the
    /// services' logs in `log_dir`, and without waiting for the api (the
    /// caller polls `/healthz` with its own deadline). The chaos run uses it to put the platform
    /// on a private PostgreSQL and RabbitMQ (`VID__AMQP__URL` in `extra_env`)
    /// that it may restart.
    pub async fn start_on(database_url: String, log_dir: PathBuf, extra_env: &[(&str, &str)]) -> Stack {
        let mut stack = Stack::configure(database_url, vid_testkit::unique_prefix(), log_dir, extra_env);
        // With `VID__TELEMETRY__*` raised in `extra_env`, log lines precede the key on stdout.
        let out = stack.create_tenant("chaos");
        stack.api_key = out.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or_default().to_owned();
        for name in ["api", "transcoder", "webhook-dispatcher"] {
            stack.spawn(name);
        }
        stack
    }

    /// The process id of a running service started by this stack.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.get(name).map(Child::id)
    }

    /// `Some(status)` if the service exited by itself (it was not [`kill`](Stack::kill)ed).
    pub fn exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        self.children.get_mut(name).and_then(|c| c.try_wait().ok().flatten())
    }
}

// ---------------------------------------------------------------------------
// Helpers for the shutdown and scaling tests (issue 8: tests/shutdown.rs, tests/scaling.rs).
// ---------------------------------------------------------------------------

/// A free TCP port on 127.0.0.1 (bound, read, released).
pub fn free_local_port() -> u16 {
    free_port()
}

impl Stack {
    /// Starts one more replica of service `name` (`api`, `playback`,
    /// `transcoder` or `webhook-dispatcher`) on the stack's database and prefix, under the key
    /// `replica` (for [`Stack::pid`], [`Stack::kill`], [`Stack::terminate`];
    /// log in `<replica>.log`), with its own listen port (and work dir).
    /// Returns the replica's HTTP address: `http://127.0.0.1:<port>` of the
    /// api or the playback service, or of the worker's health server (`/healthz`, `/readyz`, `/metrics`).
    pub fn spawn_replica(&mut self, name: &'static str, replica: &'static str) -> String {
        let port = free_port();
        let overrides: Vec<(String, String)> = match name {
            "api" => vec![("VID__API__LISTEN".into(), format!("127.0.0.1:{port}"))],
            "transcoder" => vec![
                ("VID__TRANSCODER__HEALTH_LISTEN".into(), format!("127.0.0.1:{port}")),
                (
                    "VID__TRANSCODER__WORK_DIR".into(),
                    std::env::temp_dir().join(format!("vid-{}-{replica}", vid_testkit::unique_prefix())).display().to_string(),
                ),
            ],
            "webhook-dispatcher" => vec![("VID__DISPATCHER__HEALTH_LISTEN".into(), format!("127.0.0.1:{port}"))],
            "playback" => vec![("VID__PLAYBACK__LISTEN".into(), format!("127.0.0.1:{port}"))],
            other => panic!("no such service: {other}"),
        };
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_dir.join(format!("{replica}.log"))).unwrap();
        let mut cmd = self.command(name);
        cmd.envs(overrides).stdout(log.try_clone().unwrap()).stderr(log);
        self.children.insert(replica, cmd.spawn().unwrap());
        format!("http://127.0.0.1:{port}")
    }

    /// The HTTP address of the first transcoder's health server (`/metrics` too).
    pub fn transcoder_health_url(&self) -> String {
        format!("http://{}", self.env_value("VID__TRANSCODER__HEALTH_LISTEN").expect("set by Stack::start"))
    }

    /// Sends a real SIGTERM to a running service (`kill -TERM <pid>`).
    /// Panics if the service is not running.
    pub fn terminate(&self, name: &str) {
        let pid = self.pid(name).unwrap_or_else(|| panic!("{name} is not running"));
        let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill runs");
        assert!(status.success(), "kill -TERM {pid} failed");
    }

    /// Waits until the service exits by itself; its status, or `None` if it
    /// still runs after `timeout`.
    pub async fn wait_exit(&mut self, name: &str, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited(name) {
                return Some(status);
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Everything the service (or replica) `name` logged so far.
    pub fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

/// The value of one Prometheus sample in a `/metrics` page: the line whose
/// name is `name` and whose labels include every `labels` pair (any order,
/// other labels allowed); summed over all such lines; 0 when none.
pub fn metric_value(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.find('{') {
                Some(i) => (&series[..i], &series[i..]),
                None => (series, ""),
            };
            (n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}
