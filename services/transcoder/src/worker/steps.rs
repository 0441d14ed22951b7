//! A job's steps, in order: download → scan → the child (probe, transcode) →
//! upload. Every step can be stopped by a cancel or a shutdown ([`stoppable`]);
//! each maps to a whole-job progress range (see the module docs of
//! [`super`]).
//!
//! Invariants: nothing reaches the libav child before a clean scan verdict;
//! every key uploaded is recorded in `uploaded` before its upload starts (so
//! the customer's cancel deletes it; a cancel naming the run deletes nothing); the terminal report is returned, never sent here.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use tokio::sync::watch;
use vid_core::messages::{Mp4Support, ReportKind, StreamImages, StreamOutputs, TranscodeJob};
use vid_core::operation::Phase;
use vid_core::video::{Poster, Rendition};

use super::context::Worker;
use super::metrics::record_transcode_durations;
use super::reports::{ProgressReporter, Reports};
use super::scanning::too_large_to_scan;
use super::stop::{stoppable, StepError};
use crate::child::{self, ChildMessage, ChildOutcome, Stop};
use crate::media::manifest::{DASH_MPD, HLS_MASTER};
use crate::media::{MediaJob, MediaOutcome, Packaging};
use crate::workdir::JobDir;

impl Worker {
    /// Download → scan → child (probe, transcode) → upload. `Ok` (or
    /// `Err(StepError::Report)`) is the terminal report to send.
    pub(super) async fn steps(
        &self,
        job: &TranscodeJob,
        work: &JobDir,
        reports: &Reports,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
        uploaded: &mut Vec<String>,
    ) -> Result<ReportKind, StepError> {
        // 1. Download (unless it is too large to be scanned).
        progress.set(Phase::Downloading, 0.0);
        let sc = &self.settings.scanner;
        if sc.enabled && job.source_size_bytes > sc.stream_max_length_bytes {
            return Err(too_large_to_scan(job.source_size_bytes, sc.stream_max_length_bytes, Instant::now()));
        }
        let source_path = work.path().join("source");
        stoppable(stop, self.download(job, &source_path, progress)).await??;

        // 2. Scan: nothing below sees the file before a clean verdict.
        let scanned = self.scan_source(job, &source_path, progress, stop).await?;
        reports.send(ReportKind::Scanned { outcome: scanned }).await.map_err(StepError::Transient)?;

        // 3–4. Probe and transcode in the child.
        progress.set(Phase::Probing, 11.0);
        let t = &self.settings.transcoder;
        let packaging = Packaging {
            segment_seconds: t.segment_seconds,
            mp4: job.mp4_support != Mp4Support::None,
            poster_time: job.poster_time,
            storyboard: true,
        };
        let out_dir = work.path().join("out");
        let media_job = MediaJob { input: source_path, out_dir, limits: t.limits(), ladder: t.ladder.clone(), packaging };
        let outcome = self.run_child(job, work, &media_job, progress, stop).await?;

        // 5. Upload: the stream (manifests last), the renditions, tallest first, then the poster.
        let stream = self.upload_stream(job, &outcome, progress, stop, uploaded).await?;
        let (renditions, poster) = self.upload_outputs(job, &outcome, progress, stop, uploaded).await?;
        if let Some(s) = *stop.borrow() {
            return Err(StepError::Stopped(s));
        }
        Ok(ReportKind::Succeeded { source: outcome.source, renditions, poster, stream: Some(stream) })
    }

    /// Probes and transcodes `media_job` in a supervised child (progress
    /// 12–90 %). A permanent failure is `Err(StepError::Report(Failed{…}))`.
    async fn run_child(
        &self,
        job: &TranscodeJob,
        work: &JobDir,
        media_job: &MediaJob,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
    ) -> Result<MediaOutcome, StepError> {
        let t = &self.settings.transcoder;
        let spec =
            child::write_spec(work.path(), media_job).map_err(|e| StepError::Transient(anyhow!(e).context("writing the child spec")))?;
        let limits = child::Limits {
            stall_timeout: t.stall_timeout(),
            base_budget: Duration::from_secs(600).max(t.stall_timeout() * 2),
            budget_per_media_second: 20.0,
            assumed_duration_seconds: t.max_duration_seconds,
        };
        let spawned = Instant::now();
        let mut probed_at: Option<Instant> = None;
        let mut cmd = child::worker_command(&self.child_exe, &spec);
        cmd.env(child::CORRELATION_ID_ENV, job.operation_id.as_str());
        let outcome = child::supervise(cmd, limits, stop.clone(), |m| match m {
            ChildMessage::Probed { .. } => {
                probed_at = Some(Instant::now());
                progress.set(Phase::Transcoding, 12.0)
            }
            ChildMessage::Progress { fraction } => progress.set(Phase::Transcoding, 12.0 + 78.0 * fraction),
            _ => {}
        })
        .await;
        match outcome {
            ChildOutcome::Succeeded(o) => {
                record_transcode_durations(&o, probed_at.unwrap_or(spawned).elapsed());
                Ok(o)
            }
            ChildOutcome::Failed { error, source } => {
                tracing::info!(code = %error.code, detail = ?error.detail, "permanent failure");
                Err(StepError::Report(Box::new(ReportKind::Failed { error, source })))
            }
            ChildOutcome::Internal(m) => Err(StepError::Transient(anyhow!("worker child: {m}"))),
            ChildOutcome::Stopped(s) => Err(StepError::Stopped(s)),
        }
    }

    /// Uploads every object of the stream to `<output_prefix>stream/<path>`
    /// in the order of [`crate::media::manifest::Manifests::objects`] (media
    /// before the playlists naming them, the master playlist last), with
    /// their content types. Progress 90–94 % by objects.
    async fn upload_stream(
        &self,
        job: &TranscodeJob,
        outcome: &MediaOutcome,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
        uploaded: &mut Vec<String>,
    ) -> Result<StreamOutputs, StepError> {
        let prefix = format!("{}stream/", job.output_prefix);
        let objects = &outcome.manifests.objects;
        let mut size_bytes = 0;
        for (i, (path, content_type)) in objects.iter().enumerate() {
            let local = outcome.transcoded.stream.dir.join(path);
            size_bytes += std::fs::metadata(&local).map_err(|e| StepError::Transient(anyhow!("stat {}: {e}", local.display())))?.len();
            let key = format!("{prefix}{path}");
            uploaded.push(key.clone());
            stoppable(stop, self.upload(&local, &key, content_type)).await??;
            progress.set(Phase::Uploading, 90.0 + 4.0 * (i + 1) as f64 / objects.len() as f64);
        }
        Ok(StreamOutputs {
            hls_master_key: format!("{prefix}{HLS_MASTER}"),
            dash_manifest_key: format!("{prefix}{DASH_MPD}"),
            prefix,
            segment_duration_ms: (outcome.transcoded.stream.segment_seconds * 1000.0).round() as u32,
            objects: objects.len() as u32,
            size_bytes,
            images: outcome.transcoded.stream.storyboard.as_ref().map(|s| StreamImages {
                interval_ms: s.interval_ms,
                tile_width: s.tile_width,
                tile_height: s.tile_height,
                frames_ms: s.frames_ms.clone(),
                frame_width: s.frame_width,
                frame_height: s.frame_height,
                duration_ms: s.duration_ms,
            }),
        })
    }

    /// Uploads the renditions, tallest first, to `<output_prefix>renditions/<name>.mp4`
    /// (progress 90–99 % by bytes), then the poster to `<output_prefix>poster.jpg`.
    async fn upload_outputs(
        &self,
        job: &TranscodeJob,
        outcome: &MediaOutcome,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
        uploaded: &mut Vec<String>,
    ) -> Result<(Vec<Rendition>, Option<Poster>), StepError> {
        progress.set(Phase::Uploading, 94.0);
        let total: u64 = outcome.transcoded.renditions.iter().map(|r| r.size_bytes).sum::<u64>().max(1);
        let mut done = 0u64;
        let mut renditions = Vec::new();
        for r in &outcome.transcoded.renditions {
            let key = format!("{}renditions/{}.mp4", job.output_prefix, r.name);
            uploaded.push(key.clone());
            stoppable(stop, self.upload(&r.path, &key, "video/mp4")).await??;
            done += r.size_bytes;
            progress.set(Phase::Uploading, 94.0 + 5.0 * done as f64 / total as f64);
            renditions.push(Rendition {
                name: r.name.clone(),
                width: r.width,
                height: r.height,
                bitrate: r.bitrate,
                size_bytes: r.size_bytes,
                content_type: "video/mp4".into(),
                storage_key: key,
                url: None,
                url_expires_at: None,
            });
        }
        let poster = match &outcome.transcoded.poster {
            Some(p) => {
                let key = format!("{}poster.jpg", job.output_prefix);
                uploaded.push(key.clone());
                stoppable(stop, self.upload(&p.path, &key, "image/jpeg")).await??;
                Some(Poster { width: p.width, height: p.height, storage_key: key, url: None })
            }
            None => None,
        };
        Ok((renditions, poster))
    }
}
