//! S3 transfers: the source download (streamed to the job's work dir), the
//! output uploads (PutObject, or multipart upload above
//! [`MULTIPART_THRESHOLD`], aborted on failure) and the deletes after a cancel.
//!
//! Invariants: S3 errors are transient (`StepError::Transient`) except a
//! missing source that was quarantined, which reports `malware_detected` again.

use std::path::Path;
use std::time::Instant;

use anyhow::anyhow;
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use tokio::io::AsyncWriteExt;
use vid_core::messages::TranscodeJob;
use vid_core::operation::Phase;

use super::context::Worker;
use super::reports::ProgressReporter;
use super::scanning::{malware_detected, too_large_to_scan};
use super::stop::StepError;

/// Objects larger than this are uploaded with S3 multipart upload.
pub const MULTIPART_THRESHOLD: u64 = 64 * 1024 * 1024;
/// Part size of multipart uploads.
pub const PART_SIZE: u64 = 16 * 1024 * 1024;

impl Worker {
    /// Downloads the job's source to `to` (progress 0–10 %). Errors: transient;
    /// `malware_detected` for a source already quarantined; `file_too_large_to_scan`
    /// when S3 says it is over the scanner's limit.
    pub(super) async fn download(&self, job: &TranscodeJob, to: &Path, progress: &ProgressReporter) -> Result<(), StepError> {
        let bucket = &self.settings.s3.bucket;
        let resp = match self.s3.get_object().bucket(bucket).key(&job.source_key).send().await {
            Ok(r) => r,
            Err(e) => {
                if e.as_service_error().is_some_and(|se| se.is_no_such_key()) {
                    // A redelivery after the source was quarantined (e.g. the Failed report
                    // could not be published): report the same outcome again.
                    if let Some(signature) = self.quarantined(job).await {
                        return Err(malware_detected(&signature));
                    }
                }
                return Err(StepError::Transient(anyhow!("GET s3://{bucket}/{}: {}", job.source_key, DisplayErrorContext(e))));
            }
        };
        let sc = &self.settings.scanner;
        if let Some(len) = resp.content_length().filter(|n| *n > 0).map(|n| n as u64) {
            if sc.enabled && len > sc.stream_max_length_bytes {
                return Err(too_large_to_scan(len, sc.stream_max_length_bytes, Instant::now()));
            }
        }
        let total = resp.content_length().filter(|n| *n > 0).map(|n| n as u64).unwrap_or(job.source_size_bytes).max(1);
        let mut body = resp.body;
        let mut file =
            tokio::fs::File::create(to).await.map_err(|e| StepError::Transient(anyhow!(e).context("creating the source file")))?;
        let mut got = 0u64;
        while let Some(chunk) = body.try_next().await.map_err(|e| StepError::Transient(anyhow!(e).context("reading the source from S3")))? {
            file.write_all(&chunk).await.map_err(|e| StepError::Transient(anyhow!(e).context("writing the source file")))?;
            got += chunk.len() as u64;
            progress.set(Phase::Downloading, 10.0 * (got as f64 / total as f64).min(1.0));
        }
        file.flush().await.map_err(|e| StepError::Transient(anyhow!(e)))?;
        tracing::info!(bytes = got, "source downloaded");
        Ok(())
    }

    /// Uploads a local file: PutObject, or multipart above [`MULTIPART_THRESHOLD`].
    pub(super) async fn upload(&self, path: &Path, key: &str, content_type: &str) -> Result<(), StepError> {
        upload_file(&self.s3, &self.settings.s3.bucket, path, key, content_type).await.map_err(StepError::Transient)
    }

    /// Deletes `keys` (after the customer's cancel, never after a cancel
    /// naming one run); failures are logged. S3 DeleteObject per key.
    pub(super) async fn delete_outputs(&self, keys: &[String]) {
        for key in keys {
            match self.s3.delete_object().bucket(&self.settings.s3.bucket).key(key).send().await {
                Ok(_) => tracing::info!(key, "cancelled: output deleted"),
                Err(e) => tracing::warn!(key, error = %DisplayErrorContext(e), "cancelled: could not delete an output"),
            }
        }
    }
}

/// Uploads `path` to `s3://bucket/key`, streaming from disk: PutObject up to
/// [`MULTIPART_THRESHOLD`], multipart upload in [`PART_SIZE`] parts above
/// (aborted on failure).
pub async fn upload_file(s3: &aws_sdk_s3::Client, bucket: &str, path: &Path, key: &str, content_type: &str) -> anyhow::Result<()> {
    let size = tokio::fs::metadata(path).await?.len();
    if size <= MULTIPART_THRESHOLD {
        let body = ByteStream::from_path(path).await?;
        s3.put_object()
            .bucket(bucket)
            .key(key)
            .content_type(content_type)
            .content_length(size as i64)
            .body(body)
            .send()
            .await
            .map_err(|e| anyhow!("PUT s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
        return Ok(());
    }
    let mp = s3
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .content_type(content_type)
        .send()
        .await
        .map_err(|e| anyhow!("CreateMultipartUpload s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
    let upload_id = mp.upload_id().ok_or_else(|| anyhow!("no upload id"))?.to_owned();
    let result: anyhow::Result<()> = async {
        let mut parts = Vec::new();
        let mut offset = 0u64;
        let mut n = 1i32;
        while offset < size {
            let len = PART_SIZE.min(size - offset);
            let body = ByteStream::read_from().path(path).offset(offset).length(Length::Exact(len)).build().await?;
            let part = s3
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .part_number(n)
                .content_length(len as i64)
                .body(body)
                .send()
                .await
                .map_err(|e| anyhow!("UploadPart {n} of s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
            parts.push(CompletedPart::builder().part_number(n).set_e_tag(part.e_tag().map(str::to_owned)).build());
            offset += len;
            n += 1;
        }
        s3.complete_multipart_upload()
            .bucket(bucket)
            .key(key)
            .upload_id(&upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map_err(|e| anyhow!("CompleteMultipartUpload s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = s3.abort_multipart_upload().bucket(bucket).key(key).upload_id(&upload_id).send().await;
    }
    result
}
