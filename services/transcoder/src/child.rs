//! Crash isolation: the libav work runs in a child process.
//!
//! The service re-executes its own binary as `transcoder work --spec <file>`
//! ([`worker_command`]). The child reads a [`MediaJob`] from the JSON file,
//! runs [`media::run`], and writes one JSON [`ChildMessage`] per line on
//! stdout: `probed`, then `progress` (at most every 250 ms, only when frames
//! were decoded since the last one), then exactly one of `succeeded`,
//! `failed` (permanent, bad media) or `error` (internal, worth a retry). libav
//! and tracing logs go to stderr, which the child inherits.
//!
//! The parent ([`supervise`]) reads those lines and owns every way the child
//! can end: a stop request (cancel, shutdown) kills it at once; no line for
//! the stall timeout kills it (`transcode_stalled`); a total time budget kills
//! it (`transcode_stalled`); death by a signal (SIGSEGV, SIGABRT, the OOM
//! killer's SIGKILL) or a panic becomes `transcode_crashed`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;
use vid_core::video::SourceMetadata;
use vid_core::Problem;

use crate::media::{self, MediaError, MediaEvent, MediaJob, MediaOutcome};
use crate::problems;

/// One line of the child's stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ChildMessage {
    /// The probe succeeded.
    Probed {
        /// What it read.
        source: SourceMetadata,
    },
    /// Transcode progress.
    Progress {
        /// 0.0–1.0.
        fraction: f64,
    },
    /// Every output file is written.
    Succeeded {
        /// The outputs.
        outcome: Box<MediaOutcome>,
    },
    /// The media is bad (permanent).
    Failed {
        /// Problem with a stable code.
        error: Problem,
        /// The probe, if it got that far.
        source: Option<SourceMetadata>,
    },
    /// Our side failed (transient).
    Error {
        /// What went wrong.
        message: String,
    },
}

/// The `transcoder work --spec <file>` entry point; returns the exit code.
///
/// Exit 0 after a terminal line (`succeeded`, `failed`, `error`); 2 when the
/// spec cannot be read.
pub fn child_main(spec: &Path) -> i32 {
    let job: MediaJob =
        match std::fs::read(spec).map_err(|e| e.to_string()).and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string())) {
            Ok(j) => j,
            Err(e) => {
                emit(&ChildMessage::Error { message: format!("cannot read the spec {}: {e}", spec.display()) });
                return 2;
            }
        };
    let mut last = Instant::now() - Duration::from_secs(1);
    let result = media::run(&job, &mut |ev| match ev {
        MediaEvent::Probed(source) => emit(&ChildMessage::Probed { source }),
        MediaEvent::Progress(fraction) => {
            if last.elapsed() >= Duration::from_millis(250) {
                last = Instant::now();
                emit(&ChildMessage::Progress { fraction });
            }
        }
    });
    emit(&match result {
        Ok(outcome) => ChildMessage::Succeeded { outcome: Box::new(outcome) },
        Err((MediaError::Permanent(error), source)) => ChildMessage::Failed { error, source },
        Err((MediaError::Internal(message), _)) => ChildMessage::Error { message },
    });
    0
}

fn emit(m: &ChildMessage) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, m);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// The environment variable through which the supervisor gives the child its
/// job's correlation id (the operation id), for the child's `work` log span.
pub const CORRELATION_ID_ENV: &str = "VID_CORRELATION_ID";

/// The command that runs `job_spec` in a child: this very binary, `work --spec <file>`.
pub fn worker_command(exe: &Path, spec: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("work").arg("--spec").arg(spec);
    cmd
}

/// Why the parent wants the child gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A cancel reached this run; [`CancelScope`] says which kind (it decides
    /// whether the run deletes the outputs it uploaded).
    Cancel(CancelScope),
    /// The service is shutting down; the job will be requeued.
    Shutdown,
}

/// Which kind of `CancelTranscode` stopped a run (issue 24's protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelScope {
    /// The customer's cancel (`run_id` absent): every run of the operation
    /// stops, and each deletes the outputs it uploaded.
    Operation,
    /// A cancel naming this run (`run_id: Some`, the api's "the latest
    /// Started wins"): only this run stops, and it deletes nothing, because
    /// every run of an operation writes the same keys: they may be the
    /// finished owner's outputs.
    Run,
}

/// Time limits of one child.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Kill after this long without a line on stdout.
    pub stall_timeout: Duration,
    /// Total budget before the probe is known.
    pub base_budget: Duration,
    /// Extra budget per second of (probed) media duration.
    pub budget_per_media_second: f64,
    /// Media duration assumed when the probe does not know it, seconds.
    pub assumed_duration_seconds: f64,
}

/// How a supervised child ended.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant, reason = "one value per job, moved once; boxing buys nothing")]
pub enum ChildOutcome {
    /// Outputs written.
    Succeeded(MediaOutcome),
    /// Permanent failure: bad media, crash, stall.
    Failed {
        /// With a stable code.
        error: Problem,
        /// The probe, if it got that far.
        source: Option<SourceMetadata>,
    },
    /// Transient failure (our side): retry the job.
    Internal(String),
    /// Killed on request.
    Stopped(Stop),
}

/// Runs `cmd` as a supervised child and returns how it ended.
///
/// `on_message` sees every `probed`/`progress` line. The child gets stdin
/// closed, stdout piped, stderr inherited, no core dumps, SIGKILL when this
/// process dies (`PR_SET_PDEATHSIG`), and is killed on drop. A `Stop` on
/// `stop` kills it immediately (the return follows within milliseconds).
///
/// The child ignores SIGTERM, SIGINT and SIGHUP: stopping is the parent's
/// decision. A stop signal sent to the whole process group or cgroup (Ctrl-C
/// in a terminal, `docker stop` of a shell entrypoint, systemd's
/// `KillMode=control-group`) therefore reaches only the parent, which lets
/// the job finish within its grace period or kills it and requeues the job,
/// instead of the child dying by the signal and the job being failed as
/// `transcode_crashed`.
pub async fn supervise(
    mut cmd: Command,
    limits: Limits,
    mut stop: watch::Receiver<Option<Stop>>,
    on_message: impl FnMut(&ChildMessage),
) -> ChildOutcome {
    isolate(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ChildOutcome::Internal(format!("cannot start the worker child: {e}")),
    };
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout is piped");
    let (killed, lines) = read_lines(stdout, pid, limits, &mut stop, on_message).await;
    if let Some(outcome) = killed {
        let _ = child.start_kill();
        let _ = child.wait().await;
        tracing::info!(pid, ?outcome, "worker child killed");
        return outcome;
    }

    // stdout closed: the child is exiting. Give it a moment, then make sure.
    let status = match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return ChildOutcome::Internal(format!("waiting for the worker child: {e}")),
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return ChildOutcome::Internal("the worker child closed stdout but did not exit".into());
        }
    };
    exited(pid, status, lines)
}

/// Stdin closed, stdout piped, stderr inherited, killed on drop; in the
/// child, before exec: SIGKILL when the parent dies (`PR_SET_PDEATHSIG`), no
/// core dumps, SIGTERM/SIGINT/SIGHUP ignored (see [`supervise`]).
fn isolate(cmd: &mut Command) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
    // SAFETY: only async-signal-safe calls (prctl, setrlimit, signal) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &zero);
            // Ignored dispositions survive exec (handlers do not).
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
}

/// What the child said on stdout before it closed it.
#[derive(Default)]
struct Said {
    /// Its terminal line (`succeeded`, `failed` or `error`), if any.
    terminal: Option<ChildMessage>,
    /// Its probe, if it got that far.
    source: Option<SourceMetadata>,
}

/// Reads the child's lines until it closes stdout (`(None, said)`) or must be
/// killed: a stop request, no line for `limits.stall_timeout`, or the time
/// budget spent (`(Some(outcome), _)`). The budget is `base_budget` plus
/// `budget_per_media_second` × the probed duration (the assumed one until
/// the `probed` line).
async fn read_lines(
    stdout: tokio::process::ChildStdout,
    pid: Option<u32>,
    limits: Limits,
    stop: &mut watch::Receiver<Option<Stop>>,
    mut on_message: impl FnMut(&ChildMessage),
) -> (Option<ChildOutcome>, Said) {
    let mut lines = BufReader::new(stdout).lines();
    let started = tokio::time::Instant::now();
    let budget = |secs: f64| started + limits.base_budget + Duration::from_secs_f64(limits.budget_per_media_second * secs);
    let mut deadline = budget(limits.assumed_duration_seconds);
    let mut last_line = tokio::time::Instant::now();
    let mut said = Said::default();
    let mut stdout_open = true;
    let stalled = |detail: String, said: &Said| ChildOutcome::Failed {
        error: problems::problem(problems::TRANSCODE_STALLED, detail),
        source: said.source.clone(),
    };
    loop {
        if let Some(s) = *stop.borrow() {
            return (Some(ChildOutcome::Stopped(s)), said);
        }
        if !stdout_open {
            return (None, said);
        }
        let stall_at = last_line + limits.stall_timeout;
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    last_line = tokio::time::Instant::now();
                    match serde_json::from_str::<ChildMessage>(&line) {
                        Ok(m @ (ChildMessage::Probed { .. } | ChildMessage::Progress { .. })) => {
                            if let ChildMessage::Probed { source: s } = &m {
                                said.source = Some(s.clone());
                                deadline = budget(s.duration_seconds.unwrap_or(limits.assumed_duration_seconds).clamp(0.0, 1e7));
                            }
                            on_message(&m);
                        }
                        Ok(m) => said.terminal = Some(m),
                        Err(e) => tracing::warn!(pid, error = %e, line = %line.chars().take(200).collect::<String>(), "unexpected line from the worker child"),
                    }
                }
                Ok(None) | Err(_) => stdout_open = false,
            },
            _ = stop.changed() => {}
            _ = tokio::time::sleep_until(stall_at) => {
                return (Some(stalled(format!("no progress for {} s", limits.stall_timeout.as_secs()), &said)), said);
            }
            _ = tokio::time::sleep_until(deadline) => {
                let detail = format!("the transcode overran its budget of {} s", (deadline - started).as_secs());
                return (Some(stalled(detail, &said)), said);
            }
        }
    }
}

/// How a child that closed stdout and exited with `status` ended: a signal
/// or a panic (exit 101) is `transcode_crashed`, else its terminal line decides.
fn exited(pid: Option<u32>, status: std::process::ExitStatus, said: Said) -> ChildOutcome {
    use std::os::unix::process::ExitStatusExt;
    let Said { terminal, source } = said;
    if let Some(sig) = status.signal() {
        tracing::error!(pid, signal = sig, "worker child died by a signal");
        return ChildOutcome::Failed {
            error: problems::problem(
                problems::TRANSCODE_CRASHED,
                format!("the worker process died by signal {sig} ({})", signal_name(sig)),
            ),
            source,
        };
    }
    match terminal {
        Some(ChildMessage::Succeeded { outcome }) if status.success() => ChildOutcome::Succeeded(*outcome),
        Some(ChildMessage::Failed { error, source: s }) => ChildOutcome::Failed { error, source: s.or(source) },
        Some(ChildMessage::Error { message }) => ChildOutcome::Internal(message),
        _ if status.code() == Some(101) => {
            ChildOutcome::Failed { error: problems::problem(problems::TRANSCODE_CRASHED, "the worker process panicked"), source }
        }
        _ => ChildOutcome::Internal(format!("the worker child exited with {status} without a result")),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL, e.g. the OOM killer",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

/// Writes `job` to `<dir>/spec.json` and returns the path.
pub fn write_spec(dir: &Path, job: &MediaJob) -> std::io::Result<PathBuf> {
    let path = dir.join("spec.json");
    std::fs::write(&path, serde_json::to_vec(job).expect("spec serialises"))?;
    Ok(path)
}
