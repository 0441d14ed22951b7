//! The scanning phase: the downloaded source streamed to clamd
//! ([`crate::scan`]) before anything decodes it, with retries while clamd is
//! unavailable; an infected source is moved to the quarantine prefix.
//!
//! Invariants: fail closed: a source that was not scanned clean (infected,
//! too large to scan, scanner unavailable) is never handed to the child,
//! unless scanning is turned off (`scanner.enabled = false`, logged per job).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use aws_sdk_s3::error::DisplayErrorContext;
use tokio::sync::watch;
use vid_core::messages::{ReportKind, TranscodeJob};
use vid_core::operation::{Phase, ScanOutcome};

use super::context::Worker;
use super::reports::ProgressReporter;
use super::stop::{stoppable, StepError};
use crate::child::Stop;
use crate::problems;
use crate::scan::{self, ScanError, Verdict, METRICS};

impl Worker {
    /// The scanning phase: streams the downloaded source to clamd, retrying an
    /// unavailable scanner with backoff. `Ok` = the file may be decoded; a
    /// permanent outcome is `Err(StepError::Report(Failed{…}))`.
    ///
    /// It scans the local copy rather than a second S3 stream: one download,
    /// the verdict is about exactly the bytes the decoder will read (no
    /// window in which the object could change between scan and download),
    /// and a retry after a scanner outage does not fetch the object again.
    /// The file lives only in this job's private work dir, is never opened by
    /// libav before a clean verdict, and is removed when the job ends.
    pub(super) async fn scan_source(
        &self,
        job: &TranscodeJob,
        path: &Path,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
    ) -> Result<ScanOutcome, StepError> {
        let sc = &self.settings.scanner;
        if !sc.enabled {
            METRICS.record(scan::Outcome::Skipped, Duration::ZERO);
            tracing::warn!(scan_outcome = "skipped", "scanner.enabled = false: the source is NOT scanned for malware");
            return Ok(ScanOutcome::Skipped);
        }
        progress.set(Phase::Scanning, 10.0);
        let started = Instant::now();
        let size = tokio::fs::metadata(path).await.map_err(|e| StepError::Transient(anyhow!(e).context("reading the source size")))?.len();
        if size > sc.stream_max_length_bytes {
            return Err(too_large_to_scan(size, sc.stream_max_length_bytes, started));
        }
        let client = sc.client();
        let mut retries = 0u32;
        loop {
            let file = tokio::fs::File::open(path).await.map_err(|e| StepError::Transient(anyhow!(e).context("opening the source")))?;
            let total = size.max(1) as f64;
            let res = stoppable(stop, client.scan(file, |sent| progress.set(Phase::Scanning, 10.0 + sent as f64 / total))).await?;
            let scan_ms = started.elapsed().as_millis() as u64;
            match res {
                Ok(Verdict::Clean) => {
                    METRICS.record(scan::Outcome::Clean, started.elapsed());
                    tracing::info!(scan_outcome = "clean", scan_ms, bytes = size, retries, "source scanned: clean");
                    return Ok(ScanOutcome::Clean);
                }
                Ok(Verdict::Infected { signature }) => {
                    METRICS.record(scan::Outcome::Infected, started.elapsed());
                    tracing::warn!(scan_outcome = "infected", scan_ms, bytes = size, signature = %signature, "source infected: quarantining");
                    self.quarantine(job, &signature, size).await.map_err(StepError::Transient)?;
                    return Err(malware_detected(&signature));
                }
                Err(ScanError::TooLarge { by, .. }) => {
                    if by == "clamd" {
                        tracing::warn!(
                            limit = sc.stream_max_length_bytes,
                            "clamd refused a stream below scanner.stream_max_length_bytes: its StreamMaxLength is lower; align them"
                        );
                    }
                    return Err(too_large_to_scan(size, sc.stream_max_length_bytes, started));
                }
                Err(ScanError::Source(e)) => return Err(StepError::Transient(anyhow!(e).context("reading the source for the scan"))),
                Err(e @ ScanError::Unavailable { .. }) => {
                    METRICS.attempt_failed();
                    if retries >= sc.retry_attempts {
                        METRICS.record(scan::Outcome::Unavailable, started.elapsed());
                        tracing::error!(scan_outcome = "unavailable", scan_ms, retries, error = %e, "scanner unavailable: retry budget spent");
                        let problem = problems::problem(
                            problems::SCAN_UNAVAILABLE,
                            format!("the source could not be scanned ({} attempts); it was not processed. Try again later.", retries + 1),
                        );
                        return Err(StepError::Report(Box::new(ReportKind::Failed { error: problem, source: None })));
                    }
                    let wait = sc.backoff(retries);
                    retries += 1;
                    tracing::warn!(retry = retries, of = sc.retry_attempts, retry_in_ms = wait.as_millis() as u64, error = %e, "scanner unavailable; retrying");
                    stoppable(stop, tokio::time::sleep(wait)).await?;
                }
            }
        }
    }

    /// Moves an infected source out of reach: copy to the quarantine key
    /// (with the signature as metadata), then delete the source. With an
    /// empty `quarantine_prefix`, or above the CopyObject limit, only deletes.
    async fn quarantine(&self, job: &TranscodeJob, signature: &str, size: u64) -> anyhow::Result<()> {
        let bucket = &self.settings.s3.bucket;
        let prefix = &self.settings.scanner.quarantine_prefix;
        if !prefix.is_empty() && size <= COPY_OBJECT_MAX {
            let dest = quarantine_key(prefix, job);
            self.s3
                .copy_object()
                .bucket(bucket)
                .copy_source(format!("{bucket}/{}", encode_key(&job.source_key)))
                .key(&dest)
                .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                .content_type("application/octet-stream")
                .metadata("signature", signature)
                .metadata("operation-id", job.operation_id.as_str())
                .metadata("source-key", &job.source_key)
                .send()
                .await
                .map_err(|e| anyhow!("CopyObject s3://{bucket}/{} → {dest}: {}", job.source_key, DisplayErrorContext(e)))?;
            tracing::info!(to = %dest, "infected source copied to quarantine");
        }
        self.s3
            .delete_object()
            .bucket(bucket)
            .key(&job.source_key)
            .send()
            .await
            .map_err(|e| anyhow!("DELETE s3://{bucket}/{}: {}", job.source_key, DisplayErrorContext(e)))?;
        tracing::info!(key = %job.source_key, "infected source removed from its upload key");
        Ok(())
    }

    /// The signature recorded on this job's quarantined copy, if there is one.
    pub(super) async fn quarantined(&self, job: &TranscodeJob) -> Option<String> {
        let prefix = &self.settings.scanner.quarantine_prefix;
        if prefix.is_empty() {
            return None;
        }
        let head = self.s3.head_object().bucket(&self.settings.s3.bucket).key(quarantine_key(prefix, job)).send().await.ok()?;
        let meta = head.metadata()?;
        (meta.get("operation-id").map(String::as_str) == Some(job.operation_id.as_str()))
            .then(|| meta.get("signature").cloned().unwrap_or_else(|| "unknown".into()))
    }
}

/// CopyObject copies at most 5 GiB (larger needs multipart copy); clamd's
/// `StreamMaxLength` is below 4 GiB, so an infected source always fits.
const COPY_OBJECT_MAX: u64 = 5 * 1024 * 1024 * 1024;

/// `<prefix><tenant>/<source key without "tenants/<tenant>/">`, e.g.
/// `quarantine/ten_…/uploads/upl_…/source`. Nothing in the api stores or
/// presigns keys under the prefix, so no download URL can reach them.
pub fn quarantine_key(prefix: &str, job: &TranscodeJob) -> String {
    let own = format!("tenants/{}/", job.tenant_id);
    let rest = job.source_key.strip_prefix(own.as_str()).unwrap_or(&job.source_key);
    format!("{prefix}{}/{rest}", job.tenant_id)
}

/// Percent-encodes a key for `x-amz-copy-source` (keeps `/` and unreserved characters).
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn malware_detected(signature: &str) -> StepError {
    let error = problems::problem(problems::MALWARE_DETECTED, format!("signature: {signature}"));
    StepError::Report(Box::new(ReportKind::Failed { error, source: None }))
}

/// Fail closed: a source clamd would refuse (over its `StreamMaxLength`) is
/// never processed unscanned.
pub(super) fn too_large_to_scan(size: u64, limit: u64, started: Instant) -> StepError {
    METRICS.record(scan::Outcome::TooLarge, started.elapsed());
    tracing::warn!(scan_outcome = "too_large", bytes = size, limit, "source larger than the scanner accepts: not processed");
    let error = problems::problem(
        problems::FILE_TOO_LARGE_TO_SCAN,
        format!("the source is {size} bytes; at most {limit} bytes can be scanned for malware, and unscanned files are not processed"),
    );
    StepError::Report(Box::new(ReportKind::Failed { error, source: None }))
}
