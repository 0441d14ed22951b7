//! Parallel, resumable uploads straight to storage (design §1).
//!
//! 1. `POST /uploads` gives one presigned UploadPart URL per part.
//! 2. Up to `parallel` parts are PUT at once, each read from the file at its
//!    offset, so memory stays within `parallel × part_size`.
//! 3. A failed part is retried with backoff; a part whose URL expired or was
//!    refused (S3 answers 403, Garage 400) is re-signed with `parts:sign` and
//!    sent again. Other parts are never re-sent.
//! 4. The upload id is kept in a state file (under the user's cache directory,
//!    keyed by the file's path, size and modification time). Running the same
//!    upload again asks `GET /uploads/{id}` which parts storage holds and sends
//!    only the rest.
//! 5. `POST /uploads/{id}/complete` (without a body: the server lists the parts).

use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use vid_core::upload::{CreateUpload, PartUrl, UploadStatus};
use vid_core::UploadId;

use crate::{Accepted, Client, ClientError};

/// What is remembered between runs of the same upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadStateFile {
    /// The API the upload was created on.
    pub api_url: String,
    /// The upload.
    pub upload_id: UploadId,
    /// File size when the upload was created.
    pub size_bytes: u64,
}

/// Progress callbacks, called from the upload task.
pub trait Progress: Send + Sync {
    /// The total bytes to send and how many are already in storage (resumed).
    fn start(&self, _total: u64, _already: u64) {}
    /// `n` more bytes reached storage.
    fn advance(&self, _n: u64) {}
    /// A part is being retried, and why.
    fn retry(&self, _part: u32, _why: &str) {}
}

/// No progress reporting.
pub struct NoProgress;
impl Progress for NoProgress {}

/// Uploads files through a [`Client`].
pub struct Uploader<'a> {
    client: &'a Client,
    parallel: usize,
    max_attempts: u32,
    state_dir: Option<PathBuf>,
    progress: Arc<dyn Progress>,
    stop_after_parts: Option<usize>,
}

impl<'a> Uploader<'a> {
    /// Defaults: 4 parts at once, 6 attempts per part, state under the user cache dir.
    pub fn new(client: &'a Client) -> Self {
        Self {
            client,
            parallel: 4,
            max_attempts: 6,
            state_dir: dirs::cache_dir().map(|d| d.join("vidctl/uploads")),
            progress: Arc::new(NoProgress),
            stop_after_parts: None,
        }
    }

    /// Parts sent at once (at least 1).
    pub fn parallel(mut self, n: usize) -> Self {
        self.parallel = n.max(1);
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

    fn state_path(&self, file: &Path, size: u64) -> Option<PathBuf> {
        let dir = self.state_dir.as_ref()?;
        let abs = std::fs::canonicalize(file).ok()?;
        let mtime = std::fs::metadata(file).ok()?.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
        let key = format!("{}|{}|{}|{}", self.client.base_url(), abs.display(), size, mtime);
        let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
        Some(dir.join(format!("{}.json", hex::encode(&digest.as_ref()[..12]))))
    }

    /// Uploads `file` (resuming a previous run of the same file if there was one)
    /// and completes it. `content_type` defaults to what the first bytes say.
    pub async fn upload_file(&self, file: &Path, content_type: Option<&str>) -> Result<Accepted, ClientError> {
        let size = tokio::fs::metadata(file).await?.len();
        let state_path = self.state_path(file, size);
        if let Some(existing) = self.resume_candidate(state_path.as_deref()).await? {
            return self.finish(file, size, existing, state_path.as_deref()).await;
        }
        let content_type = match content_type {
            Some(ct) => ct.to_owned(),
            None => {
                let mut head = vec![0u8; 64];
                let mut f = tokio::fs::File::open(file).await?;
                let n = f.read(&mut head).await?;
                crate::sniff::sniff_content_type(&head[..n]).unwrap_or("application/octet-stream").to_owned()
            }
        };
        let created = self
            .client
            .create_upload(
                &CreateUpload {
                    size_bytes: size,
                    content_type,
                    filename: file.file_name().map(|n| n.to_string_lossy().into_owned()),
                },
                None,
            )
            .await?;
        if let Some(path) = &state_path {
            let state = UploadStateFile { api_url: self.client.base_url().to_owned(), upload_id: created.id.clone(), size_bytes: size };
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, serde_json::to_vec(&state).expect("serialises"))?;
        }
        self.progress.start(size, 0);
        self.send_parts(file, &created.id, created.parts).await?;
        self.complete(&created.id, state_path.as_deref()).await
    }

    async fn resume_candidate(&self, state_path: Option<&Path>) -> Result<Option<UploadId>, ClientError> {
        let Some(path) = state_path else { return Ok(None) };
        let Ok(bytes) = std::fs::read(path) else { return Ok(None) };
        let Ok(state) = serde_json::from_slice::<UploadStateFile>(&bytes) else { return Ok(None) };
        match self.client.get_upload(&state.upload_id).await {
            Ok(u) if matches!(u.status, UploadStatus::Created | UploadStatus::Completing | UploadStatus::Completed) => Ok(Some(u.id)),
            _ => {
                let _ = std::fs::remove_file(path);
                Ok(None)
            }
        }
    }

    async fn finish(&self, file: &Path, size: u64, id: UploadId, state_path: Option<&Path>) -> Result<Accepted, ClientError> {
        let state = self.client.get_upload(&id).await?;
        if state.status == UploadStatus::Created && !state.missing_parts.is_empty() {
            let already: u64 = state.parts.iter().map(|p| p.size_bytes).sum();
            self.progress.start(size, already);
            let signed = self.client.sign_parts(&id, &state.missing_parts).await?;
            self.send_parts(file, &id, signed.parts).await?;
        } else {
            self.progress.start(size, size);
        }
        self.complete(&id, state_path).await
    }

    async fn complete(&self, id: &UploadId, state_path: Option<&Path>) -> Result<Accepted, ClientError> {
        let accepted = self.client.complete_upload(id, None).await?;
        if let Some(p) = state_path {
            let _ = std::fs::remove_file(p);
        }
        Ok(accepted)
    }

    async fn send_parts(&self, file: &Path, id: &UploadId, parts: Vec<PartUrl>) -> Result<(), ClientError> {
        let limit = self.stop_after_parts.unwrap_or(usize::MAX);
        let total = parts.len();
        let mut sent = 0usize;
        let mut stream = futures::stream::iter(parts.into_iter().take(limit))
            .map(|part| self.send_part(file, id, part))
            .buffer_unordered(self.parallel);
        while let Some(result) = stream.next().await {
            result?;
            sent += 1;
        }
        if sent < total {
            return Err(ClientError::Io(std::io::Error::other(format!("stopped after {sent} of {total} parts as asked"))));
        }
        Ok(())
    }

    async fn send_part(&self, file: &Path, id: &UploadId, mut part: PartUrl) -> Result<(), ClientError> {
        let mut buf = vec![0u8; part.length as usize];
        {
            let mut f = tokio::fs::File::open(file).await?;
            f.seek(SeekFrom::Start(part.offset)).await?;
            f.read_exact(&mut buf).await?;
        }
        let body = bytes::Bytes::from(buf);
        let mut delay = Duration::from_millis(300);
        for attempt in 1..=self.max_attempts {
            let result = self.client.http().put(&part.url).body(body.clone()).send().await;
            match result {
                Ok(resp) if resp.status().is_success() => {
                    self.progress.advance(part.length);
                    return Ok(());
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    let refused = status == 403 || (status == 400 && (text.contains("xpired") || text.contains("AccessDenied")));
                    if attempt == self.max_attempts {
                        return Err(ClientError::Storage { part_number: part.part_number, status, body: text.chars().take(300).collect() });
                    }
                    if refused {
                        self.progress.retry(part.part_number, "URL expired or refused; re-signing");
                        let mut fresh = self.client.sign_parts(id, &[part.part_number]).await?.parts;
                        if let Some(p) = fresh.pop() {
                            part = p;
                        }
                        continue;
                    }
                    self.progress.retry(part.part_number, &format!("storage answered {status}"));
                }
                Err(e) => {
                    if attempt == self.max_attempts {
                        return Err(e.into());
                    }
                    self.progress.retry(part.part_number, &format!("network error: {e}"));
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        unreachable!("the loop returns on its last attempt")
    }
}
