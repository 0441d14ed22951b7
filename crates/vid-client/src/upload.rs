//! Parallel, resumable uploads straight to storage (design §1).
//!
//! 1. `POST /uploads` gives one presigned UploadPart URL per part.
//! 2. Up to `parallel` parts are PUT at once, each read from the file at its
//!    offset, so memory stays within `parallel × part_size`.
//! 3. A failed part is retried with backoff. A part whose URL expired or was
//!    refused (S3 answers 403 `AccessDenied`, Garage 400 "expired"; either may
//!    say `SignatureDoesNotMatch`) is re-signed with `parts:sign` and sent
//!    again, at most [`Uploader::max_resigns`] times. A URL known to be about
//!    to expire is re-signed before it is used. Other parts are never re-sent.
//! 4. The upload id is kept in a state file (under the user's cache directory,
//!    keyed by the API URL and the file's path, size and modification time).
//!    Running the same upload again asks `GET /uploads/{id}` which parts
//!    storage holds and sends only the rest. While a run works on a file it
//!    holds an exclusive lock (`<state file>.lock`): a second run on the same
//!    file fails at once with [`ClientError::Busy`]. When the state cannot be
//!    saved, the upload goes on without it (see [`Progress::warning`]).
//! 5. `POST /uploads/{id}/complete` (without a body: the server lists the parts).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use vid_core::messages::Mp4Support;
use vid_core::playback::PlaybackPolicy;
use vid_core::upload::{CreateUpload, PartUrl, UploadStatus};
use vid_core::{Problem, UploadId};

use crate::client::{Accepted, Client, ClientError};

mod s3;
mod state;

pub use s3::url_refused;
use s3::{chain, s3_code, s3_summary, transient};
pub use state::{default_state_dir, UploadStateFile};
use state::{lock_state, read_state, write_state};

/// Progress callbacks, called from the upload task.
pub trait Progress: Send + Sync {
    /// The upload is known: created now, or found in the state file (`resumed`).
    fn upload(&self, _id: &UploadId, _resumed: bool) {}
    /// The total bytes to send and how many are already in storage (resumed).
    fn start(&self, _total: u64, _already: u64) {}
    /// This run starts working on a part (reading it, then sending it).
    fn part_start(&self, _part: u32) {}
    /// `n` more bytes reached storage.
    fn advance(&self, _n: u64) {}
    /// Storage accepted this part (in this run).
    fn part_sent(&self, _part: u32) {}
    /// A part is being retried or re-signed, and why.
    fn retry(&self, _part: u32, _why: &str) {}
    /// Something went wrong that does not stop the upload, e.g. its resume
    /// state cannot be saved.
    fn warning(&self, _message: &str) {}
}

/// No progress reporting.
pub struct NoProgress;
impl Progress for NoProgress {}

/// What an upload did.
#[derive(Debug, Clone)]
pub struct UploadOutcome {
    /// The upload.
    pub upload_id: UploadId,
    /// Whether an earlier run's upload was continued.
    pub resumed: bool,
    /// The parts sent by this run, in the order storage accepted them.
    pub parts_sent: Vec<u32>,
    /// The parts storage already held when this run started (resumed uploads).
    pub parts_already_stored: Vec<u32>,
    /// The transcode operation `complete` answered with.
    pub accepted: Accepted,
}

/// Uploads files through a [`Client`].
pub struct Uploader<'a> {
    client: &'a Client,
    parallel: usize,
    max_attempts: u32,
    max_resigns: u32,
    state_dir: Option<PathBuf>,
    progress: Arc<dyn Progress>,
    stop_after_parts: Option<usize>,
    delay_before_send: Option<Duration>,
    playback_policy: Option<Vec<PlaybackPolicy>>,
    mp4_support: Option<Mp4Support>,
}

/// A URL expiring sooner than this is re-signed before it is used.
const EXPIRY_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

impl<'a> Uploader<'a> {
    /// Defaults: 4 parts at once, 6 attempts and 2 re-signs per part, state under the user cache dir.
    pub fn new(client: &'a Client) -> Self {
        Self {
            client,
            parallel: 4,
            max_attempts: 6,
            max_resigns: 2,
            state_dir: default_state_dir(),
            progress: Arc::new(NoProgress),
            stop_after_parts: None,
            delay_before_send: None,
            playback_policy: None,
            mp4_support: None,
        }
    }

    /// `POST /uploads`' `playback_policy`: the playback IDs the video gets
    /// when it is ready, one per policy. `None` (the default) sends nothing:
    /// the api's default, `["public"]`; `Some(vec![])`: no playback ID. Used
    /// when the upload is created, not when an earlier run's upload is resumed.
    pub fn playback_policy(mut self, policies: Option<Vec<PlaybackPolicy>>) -> Self {
        self.playback_policy = policies;
        self
    }

    /// `POST /uploads`' `mp4_support`: `None` (the default) sends nothing (the
    /// api's default, `standard`); `Some(Mp4Support::None)` asks for the
    /// adaptive stream only. Used when the upload is created, like
    /// [`playback_policy`](Self::playback_policy).
    pub fn mp4_support(mut self, mp4: Option<Mp4Support>) -> Self {
        self.mp4_support = mp4;
        self
    }

    /// Parts sent at once (at least 1).
    pub fn parallel(mut self, n: usize) -> Self {
        self.parallel = n.max(1);
        self
    }

    /// Attempts per part for network errors and storage errors other than refusals (at least 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// How often one part may be re-signed after storage refused its URL.
    pub fn max_resigns(mut self, n: u32) -> Self {
        self.max_resigns = n;
        self
    }

    /// Where state files live; `None` disables resuming.
    pub fn state_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.state_dir = dir;
        self
    }

    /// Progress reporting.
    pub fn progress(mut self, p: Arc<dyn Progress>) -> Self {
        self.progress = p;
        self
    }

    /// Stops (with an error) after this many parts were sent in this run —
    /// lets tests and demos interrupt an upload at a known point.
    pub fn stop_after_parts(mut self, n: Option<usize>) -> Self {
        self.stop_after_parts = n;
        self
    }

    /// Waits this long before the first PUT of each part, after its URL was
    /// checked — lets tests make URLs expire, and throttles demos.
    pub fn delay_before_send(mut self, d: Option<Duration>) -> Self {
        self.delay_before_send = d;
        self
    }

    /// The state file an upload of `file` uses (whether or not it exists).
    pub fn state_path(&self, file: &Path) -> Option<PathBuf> {
        let dir = self.state_dir.as_ref()?;
        let meta = std::fs::metadata(file).ok()?;
        let abs = std::fs::canonicalize(file).ok()?;
        let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
        let key = format!("{}|{}|{}|{}", self.client.base_url(), abs.display(), meta.len(), mtime);
        let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
        Some(dir.join(format!("{}.json", hex::encode(&digest.as_ref()[..12]))))
    }

    /// Uploads `file` (resuming a previous run of the same file if there was one)
    /// and completes it. `content_type` defaults to what the first bytes say.
    pub async fn upload_file(&self, file: &Path, content_type: Option<&str>) -> Result<Accepted, ClientError> {
        self.upload(file, content_type).await.map(|o| o.accepted)
    }

    /// Like [`upload_file`](Self::upload_file), reporting what was sent.
    ///
    /// Errors: [`ClientError::File`] when `path` cannot be read or is not a
    /// regular file; [`ClientError::Busy`] when another process is uploading
    /// the same file; [`ClientError::ContentTypeMismatch`] when `content_type`
    /// differs from that of the unfinished upload it would resume.
    pub async fn upload(&self, path: &Path, content_type: Option<&str>) -> Result<UploadOutcome, ClientError> {
        let file_error = |error| ClientError::File { path: path.to_owned(), error };
        let file = std::fs::File::open(path).map_err(file_error)?;
        let meta = file.metadata().map_err(file_error)?;
        if !meta.is_file() {
            return Err(file_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
        }
        let size = meta.len();
        let file = Arc::new(file);
        let mut state_path = self.state_path(path);
        // Held until this run ends: a second run on the same file fails at once.
        let _lock = match &state_path {
            Some(p) => match lock_state(p) {
                Ok(lock) => Some(lock),
                Err(std::fs::TryLockError::WouldBlock) => {
                    let upload_id = read_state(p).map(|s| s.upload_id);
                    return Err(ClientError::Busy { upload_id });
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    self.warn_no_state(p, &e);
                    state_path = None;
                    None
                }
            },
            None => None,
        };
        if let Some(existing) = self.resume_candidate(state_path.as_deref(), size, content_type).await? {
            self.progress.upload(&existing, true);
            return self.resume(&file, size, existing, state_path.as_deref()).await;
        }
        let content_type = match content_type {
            Some(ct) => ct.to_owned(),
            None => {
                let head = read_at(&file, 0, size.min(64) as usize).await?;
                crate::sniff::sniff_content_type(&head).unwrap_or("application/octet-stream").to_owned()
            }
        };
        let created = self
            .client
            .create_upload(
                &CreateUpload {
                    size_bytes: size,
                    content_type,
                    filename: path.file_name().map(|n| n.to_string_lossy().into_owned()),
                    playback_policy: self.playback_policy.clone(),
                    mp4_support: self.mp4_support,
                    ..Default::default()
                },
                None,
            )
            .await?;
        self.progress.upload(&created.id, false);
        if let Some(p) = &state_path {
            let state = UploadStateFile { api_url: self.client.base_url().to_owned(), upload_id: created.id.clone(), size_bytes: size };
            if let Err(e) = write_state(p, &state) {
                self.warn_no_state(p, &e);
                state_path = None;
            }
        }
        self.progress.start(size, 0);
        let parts_sent = self.send_parts(&file, &created.id, created.parts).await?;
        let accepted = self.complete(&created.id, state_path.as_deref()).await?;
        Ok(UploadOutcome { upload_id: created.id, resumed: false, parts_sent, parts_already_stored: Vec::new(), accepted })
    }

    fn warn_no_state(&self, path: &Path, e: &std::io::Error) {
        let dir = path.parent().unwrap_or(path);
        self.progress.warning(&format!("cannot save resume state in {}: {e}; this upload cannot be resumed", dir.display()));
    }

    async fn resume_candidate(
        &self,
        state_path: Option<&Path>,
        size: u64,
        content_type: Option<&str>,
    ) -> Result<Option<UploadId>, ClientError> {
        let Some(path) = state_path else { return Ok(None) };
        let Ok(bytes) = std::fs::read(path) else { return Ok(None) };
        let state = match serde_json::from_slice::<UploadStateFile>(&bytes) {
            Ok(s) if s.size_bytes == size && s.api_url == self.client.base_url() => s,
            _ => {
                let _ = std::fs::remove_file(path);
                return Ok(None);
            }
        };
        match self.client.get_upload(&state.upload_id).await {
            Ok(u) if matches!(u.status, UploadStatus::Created | UploadStatus::Completing | UploadStatus::Completed) => {
                if let Some(ct) = content_type.filter(|ct| !ct.trim().eq_ignore_ascii_case(&u.content_type)) {
                    return Err(ClientError::ContentTypeMismatch { upload_id: u.id, started: u.content_type, requested: ct.to_owned() });
                }
                Ok(Some(u.id))
            }
            // Aborted, expired or gone: start afresh.
            Ok(_) | Err(ClientError::Api(Problem { status: 404 | 410, .. })) => {
                let _ = std::fs::remove_file(path);
                Ok(None)
            }
            // Anything else (unreachable, a refused key, a server error): say
            // so and keep the state rather than create a second upload.
            Err(e) => Err(e),
        }
    }

    async fn resume(
        &self,
        file: &Arc<std::fs::File>,
        size: u64,
        id: UploadId,
        state_path: Option<&Path>,
    ) -> Result<UploadOutcome, ClientError> {
        let state = self.client.get_upload(&id).await?;
        let already: Vec<u32> = state.parts.iter().map(|p| p.part_number).collect();
        let mut parts_sent = Vec::new();
        if state.status == UploadStatus::Created && !state.missing_parts.is_empty() {
            let stored: u64 = state.parts.iter().map(|p| p.size_bytes).sum();
            self.progress.start(size, stored);
            let signed = self.client.sign_parts(&id, &state.missing_parts).await?;
            parts_sent = self.send_parts(file, &id, signed.parts).await?;
        } else {
            self.progress.start(size, size);
        }
        let accepted = self.complete(&id, state_path).await?;
        Ok(UploadOutcome { upload_id: id, resumed: true, parts_sent, parts_already_stored: already, accepted })
    }

    async fn complete(&self, id: &UploadId, state_path: Option<&Path>) -> Result<Accepted, ClientError> {
        // `complete` is idempotent: a call lost on the way is simply repeated.
        let mut delay = Duration::from_millis(500);
        let mut attempt = 1;
        let accepted = loop {
            match self.client.complete_upload(id, None).await {
                Ok(a) => break a,
                Err(e) if attempt < 3 && transient(&e) => {
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => return Err(e),
            }
        };
        if let Some(p) = state_path {
            let _ = std::fs::remove_file(p);
        }
        Ok(accepted)
    }

    async fn send_parts(&self, file: &Arc<std::fs::File>, id: &UploadId, parts: Vec<PartUrl>) -> Result<Vec<u32>, ClientError> {
        let limit = self.stop_after_parts.unwrap_or(usize::MAX);
        let total = parts.len();
        let mut sent = Vec::with_capacity(total);
        let mut stream =
            futures::stream::iter(parts.into_iter().take(limit)).map(|part| self.send_part(file, id, part)).buffer_unordered(self.parallel);
        while let Some(result) = stream.next().await {
            let n = result?;
            self.progress.part_sent(n);
            sent.push(n);
        }
        if sent.len() < total {
            return Err(ClientError::Io(std::io::Error::other(format!("stopped after {} of {total} parts as asked", sent.len()))));
        }
        Ok(sent)
    }

    async fn resign(&self, id: &UploadId, part: u32) -> Result<PartUrl, ClientError> {
        let mut fresh = self.client.sign_parts(id, &[part]).await?.parts;
        fresh
            .pop()
            .filter(|p| p.part_number == part)
            .ok_or_else(|| ClientError::Unexpected { status: 200, body: format!("parts:sign did not answer with part {part}") })
    }

    /// Sends one part; answers its number once storage accepted it.
    async fn send_part(&self, file: &Arc<std::fs::File>, id: &UploadId, mut part: PartUrl) -> Result<u32, ClientError> {
        let n = part.part_number;
        self.progress.part_start(n);
        if part.expires_at - chrono::Utc::now() < EXPIRY_MARGIN {
            self.progress.retry(n, "URL about to expire; re-signing before sending");
            part = self.resign(id, n).await?;
        }
        // The only copy of the part's bytes: `Bytes` clones share it.
        let body = bytes::Bytes::from(read_at(file, part.offset, part.length as usize).await?);
        if let Some(d) = self.delay_before_send {
            tokio::time::sleep(d).await;
        }
        let mut delay = Duration::from_millis(300);
        let (mut attempts, mut resigns) = (0u32, 0u32);
        loop {
            // Errors lose the URL: a presigned URL is a credential.
            let sent = self.client.http().put(&part.url).body(body.clone()).send().await.map_err(reqwest::Error::without_url);
            let failure = match sent {
                Ok(resp) if resp.status().is_success() => {
                    self.progress.advance(part.length);
                    return Ok(n);
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    let expired = part.expires_at <= chrono::Utc::now() && matches!(status, 400 | 403);
                    if (expired || url_refused(status, &text)) && resigns < self.max_resigns {
                        resigns += 1;
                        self.progress.retry(n, &format!("storage refused the URL (HTTP {status}: {}); re-signing", s3_code(&text)));
                        match self.resign(id, n).await {
                            Ok(p) => {
                                part = p;
                                continue;
                            }
                            Err(e) if transient(&e) => format!("re-signing failed: {e}"),
                            Err(e) => return Err(e),
                        }
                    } else {
                        attempts += 1;
                        let fatal = expired || url_refused(status, &text) || (status == 404 && text.contains("NoSuchUpload"));
                        if fatal || attempts >= self.max_attempts {
                            return Err(ClientError::Storage { part_number: n, status, body: s3_summary(&text) });
                        }
                        format!("storage answered HTTP {status} {}", s3_code(&text))
                    }
                }
                // Storage may answer an expired URL before reading the body and
                // close the connection (Garage does): the client then sees a
                // send error, not the status. An expired URL is re-signed.
                Err(e) if part.expires_at <= chrono::Utc::now() && resigns < self.max_resigns => {
                    resigns += 1;
                    self.progress.retry(n, &format!("storage refused the expired URL ({}); re-signing", chain(&e)));
                    match self.resign(id, n).await {
                        Ok(p) => {
                            part = p;
                            continue;
                        }
                        Err(e) if transient(&e) => format!("re-signing failed: {e}"),
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => {
                    attempts += 1;
                    if attempts >= self.max_attempts {
                        return Err(e.into());
                    }
                    format!("network error: {}", chain(&e))
                }
            };
            self.progress.retry(n, &format!("{failure}; retrying in {delay:?}"));
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }
}

/// Reads `len` bytes at `offset` on the blocking pool (positional read: the
/// parts of one file are read concurrently without sharing a cursor).
async fn read_at(file: &Arc<std::fs::File>, offset: u64, len: usize) -> Result<Vec<u8>, ClientError> {
    let file = file.clone();
    let buf = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        read_exact_at(&file, &mut buf, offset)?;
        Ok(buf)
    })
    .await
    .map_err(|e| std::io::Error::other(format!("reading the file: {e}")))??;
    Ok(buf)
}

#[cfg(unix)]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storage failure, after the last attempt, does not show the presigned URL.
    #[tokio::test]
    async fn storage_errors_do_not_show_the_presigned_url() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let client = Client::new(&format!("http://{closed}"), "vidk_test");
        let path = std::env::temp_dir().join(format!("vid-client-no-url-{}", std::process::id()));
        std::fs::write(&path, b"0123456789").unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let part = PartUrl {
            part_number: 1,
            offset: 0,
            length: 10,
            url: format!("http://{closed}/vid-media/tenants/t/source?partNumber=1&X-Amz-Signature=s3cr3t"),
            expires_at: chrono::Utc::now() + chrono::TimeDelta::hours(1),
        };
        let id = UploadId::generate();
        let err = Uploader::new(&client).max_attempts(1).send_part(&file, &id, part).await.unwrap_err();
        std::fs::remove_file(path).unwrap();
        let mut text = format!("{err} {err:?}");
        let mut src = std::error::Error::source(&err);
        while let Some(s) = src {
            text.push_str(&format!(": {s} {s:?}"));
            src = s.source();
        }
        assert!(!text.contains("s3cr3t") && !text.contains("vid-media"), "{text}");
    }

    #[tokio::test]
    async fn reads_parts_at_their_offsets() {
        let path = std::env::temp_dir().join(format!("vid-client-read-at-{}", std::process::id()));
        std::fs::write(&path, (0..=255u8).collect::<Vec<_>>()).unwrap();
        let f = Arc::new(std::fs::File::open(&path).unwrap());
        assert_eq!(read_at(&f, 10, 3).await.unwrap(), vec![10, 11, 12]);
        assert!(read_at(&f, 250, 10).await.is_err());
        std::fs::remove_file(path).unwrap();
    }
}
