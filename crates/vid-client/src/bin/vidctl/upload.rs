//! `vidctl upload` and following an operation: progress bars, Ctrl-C (the
//! upload stays resumable; the command that resumes it is printed), and the
//! upload's report.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use vid_client::upload::{Progress, UploadOutcome, Uploader};
use vid_client::Client;
use vid_core::operation::{Operation, OperationStatus};
use vid_core::video::Video;
use vid_core::{OperationId, UploadId};

use crate::cli::UploadArgs;
use crate::exit::{finish_operation, Exit};
use crate::output::Output;
use crate::view::{dash, fields, human_bytes, operation_status_line, phase_str, print_renditions};

/// Progress shown on a bar (or, with no bar, retries as lines on stderr);
/// also remembers what the Ctrl-C message needs.
struct UploadProgress {
    bar: ProgressBar,
    visible: bool,
    upload_id: Mutex<Option<UploadId>>,
    stored_parts: AtomicU64,
    sent_bytes: AtomicU64,
}

impl Progress for UploadProgress {
    fn upload(&self, id: &UploadId, resumed: bool) {
        *self.upload_id.lock().unwrap() = Some(id.clone());
        if resumed {
            self.line(format!("resuming upload {id}"));
        }
    }
    fn start(&self, total: u64, already: u64) {
        self.bar.set_length(total);
        self.bar.set_position(already);
        self.bar.reset_eta();
    }
    fn advance(&self, n: u64) {
        self.sent_bytes.fetch_add(n, Ordering::Relaxed);
        self.bar.inc(n);
    }
    fn part_sent(&self, _part: u32) {
        self.stored_parts.fetch_add(1, Ordering::Relaxed);
    }
    fn retry(&self, part: u32, why: &str) {
        self.line(format!("part {part}: {why}"));
    }
    fn warning(&self, message: &str) {
        self.line(format!("warning: {message}"));
    }
}

impl UploadProgress {
    fn line(&self, s: String) {
        if self.visible {
            self.bar.println(s);
        } else {
            eprintln!("{s}");
        }
    }
}

/// Ctrl-C, or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command that resumes an upload of `file`: with `--api-url` when one
/// was given (the state is kept per API URL), shell-quoted.
pub(crate) fn resume_hint(api_url: Option<&str>, file: &Path) -> String {
    let mut hint = "vidctl".to_owned();
    if let Some(url) = api_url {
        hint.push_str(&format!(" --api-url {}", shell_quote(url)));
    }
    hint.push_str(&format!(" upload {}", shell_quote(&file.display().to_string())));
    hint
}
/// Uploads `args.file`, prints what was sent, and with `--wait` follows the
/// transcode; the exit status is that of the operation when waiting.
pub(crate) async fn upload(client: &Client, args: UploadArgs, out: Output, bars: bool, resume_hint: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let (outcome, sent) = send(client, &args, bars, resume_hint).await?;
    let secs = started.elapsed().as_secs_f64();
    let op = outcome.accepted.operation.clone();
    let video_id = op.metadata.video_id.clone();
    let mut report = json!({
        "upload_id": outcome.upload_id,
        "video_id": video_id,
        "operation_id": op.id,
        "resumed": outcome.resumed,
        "parts_sent": outcome.parts_sent,
        "parts_already_stored": outcome.parts_already_stored,
        "bytes_sent": sent,
        "seconds": secs,
        "operation": op,
    });
    out.human(|| print_sent(&args.file, &outcome, sent, secs));
    if !args.wait {
        out.show_with(
            || report,
            || {
                println!("status     {}", operation_status_line(&op));
                println!("follow it: vidctl operations wait {}", op.id);
            },
        );
        return Ok(());
    }
    let op = follow(client, &op.id, Duration::from_secs(args.timeout), bars).await?;
    report["operation"] = json!(op);
    let video = match (&op.status, &video_id) {
        (OperationStatus::Succeeded, Some(v)) => Some(client.get_video(v).await?),
        _ => None,
    };
    out.show_with(
        || {
            report["video"] = json!(video);
            report
        },
        || print_waited(&op, video.as_ref()),
    );
    finish_operation(&op)
}

/// Sends the file's parts on a progress bar (hidden without `bars`); answers
/// what the SDK did and the bytes sent by this run. Ctrl-C ends the process
/// with 130 after saying how to resume.
async fn send(client: &Client, args: &UploadArgs, bars: bool, resume_hint: &str) -> anyhow::Result<(UploadOutcome, u64)> {
    let bar = if bars { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} uploading [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let progress = Arc::new(UploadProgress {
        bar: bar.clone(),
        visible: bars,
        upload_id: Mutex::new(None),
        stored_parts: AtomicU64::new(0),
        sent_bytes: AtomicU64::new(0),
    });
    let uploader = Uploader::new(client)
        .parallel(args.parallel)
        .progress(progress.clone())
        .delay_before_send(args.part_delay_ms.map(Duration::from_millis))
        .playback_policy(args.playback_policy.map(|p| p.policies()))
        .mp4_support(args.mp4_support);
    tokio::select! {
        r = uploader.upload(&args.file, args.content_type.as_deref()) => {
            bar.finish_and_clear();
            Ok((r?, progress.sent_bytes.load(Ordering::Relaxed)))
        }
        _ = interrupted() => {
            bar.abandon();
            let id = progress.upload_id.lock().unwrap().clone();
            match id {
                Some(id) => eprintln!(
                    "\ninterrupted: upload {id} keeps the parts already sent ({} in this run).\nRun the same command again to resume; only the missing parts are sent:\n  {resume_hint}",
                    progress.stored_parts.load(Ordering::Relaxed),
                ),
                None => eprintln!("\ninterrupted before the upload was created; nothing to resume"),
            }
            Err(Exit(130).into())
        }
    }
}

/// `uploaded <file> (… sent in … s, …/s; n parts sent…)` and the ids.
fn print_sent(file: &Path, outcome: &UploadOutcome, sent: u64, secs: f64) {
    let op = &outcome.accepted.operation;
    let rate = if secs > 0.0 { sent as f64 / secs } else { 0.0 };
    println!(
        "uploaded {} ({} sent in {secs:.1} s, {}/s; {} parts sent{})",
        file.display(),
        human_bytes(sent),
        human_bytes(rate as u64),
        outcome.parts_sent.len(),
        if outcome.resumed { format!(", {} already stored", outcome.parts_already_stored.len()) } else { String::new() }
    );
    fields(&[("upload", outcome.upload_id.to_string()), ("video", dash(op.metadata.video_id.as_ref())), ("operation", op.id.to_string())]);
}

/// The ended operation and its renditions (from the video when it is ready).
fn print_waited(op: &Operation, video: Option<&Video>) {
    println!("status     {}", operation_status_line(op));
    if let Some(v) = video {
        print_renditions(v, false);
    } else if let Some(r) = &op.result {
        for r in &r.renditions {
            println!("  {} {}x{}", r.name, r.width, r.height);
        }
    }
}

/// Follows an operation on a bar (status, progress, phase) until it ends; Ctrl-C stops waiting.
pub(crate) async fn follow(client: &Client, id: &OperationId, timeout: Duration, bars: bool) -> anyhow::Result<Operation> {
    let bar = if bars { ProgressBar::new(100) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {bar:40} {pos:>3}% {msg}").expect("valid template"));
    bar.set_prefix("transcode");
    bar.enable_steady_tick(Duration::from_millis(200));
    let r = tokio::select! {
        r = client.wait_operation(id, timeout, |o| {
            bar.set_position(o.progress as u64);
            let phase = phase_str(o.metadata.phase);
            bar.set_message(if phase.is_empty() { o.status.as_str().to_owned() } else { format!("{} · {phase}", o.status.as_str()) });
        }) => r,
        _ = interrupted() => {
            bar.abandon();
            eprintln!("\nstopped waiting; the operation goes on. Follow it again with:\n  vidctl operations wait {id}");
            return Err(Exit(130).into());
        }
    };
    bar.finish_and_clear();
    Ok(r?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resume_hint_keeps_the_api_url_and_quotes() {
        assert_eq!(resume_hint(None, Path::new("movie.mp4")), "vidctl upload movie.mp4");
        assert_eq!(
            resume_hint(Some("http://10.0.0.5:8080"), Path::new("my movie's.mp4")),
            r"vidctl --api-url http://10.0.0.5:8080 upload 'my movie'\''s.mp4'"
        );
        assert_eq!(resume_hint(Some("http://h/a?b=1&c"), Path::new("m")), "vidctl --api-url 'http://h/a?b=1&c' upload m");
    }
}
