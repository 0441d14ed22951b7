//! A small async client for clamd's `INSTREAM` command, plus the scan metrics.
//!
//! Protocol (clamd(8), "INSTREAM"): the client sends `zINSTREAM\0`, then the
//! data as chunks `<u32 big-endian length><bytes>`, then a zero-length chunk.
//! clamd answers one NUL-terminated line:
//!
//! - `stream: OK` → [`Verdict::Clean`];
//! - `stream: <Signature> FOUND` → [`Verdict::Infected`];
//! - `INSTREAM size limit exceeded. ERROR` (more than clamd's `StreamMaxLength`,
//!   after which clamd closes the connection) → [`ScanError::TooLarge`];
//! - anything else ending in `ERROR` → [`ScanError::Unavailable`].
//!
//! The data is read from any [`AsyncRead`] one chunk at a time, so the object
//! is never held whole in memory. The client stops on its own as soon as more
//! than `max_stream_bytes` were read (the same limit as clamd's
//! `StreamMaxLength`), without waiting for clamd to notice.
//!
//! Addresses: `host:port` (TCP) or `unix:/path/to/clamd.sock` (a path starting
//! with `/` also means a unix socket).

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Where clamd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `host:port`.
    Tcp(String),
    /// A unix socket path.
    Unix(PathBuf),
}

impl Address {
    /// `unix:/path` or `/path` → unix socket; anything else → TCP `host:port`.
    pub fn parse(s: &str) -> Self {
        let s = s.trim();
        if let Some(p) = s.strip_prefix("unix:") {
            Self::Unix(PathBuf::from(p))
        } else if s.starts_with('/') {
            Self::Unix(PathBuf::from(s))
        } else {
            Self::Tcp(s.to_owned())
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// What clamd said about a clean or infected stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `stream: OK`.
    Clean,
    /// `stream: <signature> FOUND`.
    Infected {
        /// The signature name, e.g. `Vid.Test.EICAR-Body.UNOFFICIAL`.
        signature: String,
    },
}

/// Why a scan gave no verdict.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The stream is larger than the scanner accepts (detected by this client
    /// from `max_stream_bytes`, or by clamd's `INSTREAM size limit exceeded`).
    /// Permanent: retrying cannot help.
    #[error("the stream is larger than the scanner accepts ({limit} bytes; {by})")]
    TooLarge {
        /// The limit that applied (client side), or the configured one if clamd said so.
        limit: u64,
        /// `client` or `clamd`.
        by: &'static str,
    },
    /// clamd could not be reached, timed out, broke the connection, or answered
    /// an error. Transient: worth retrying.
    #[error("scanner unavailable at {address}: {reason}")]
    Unavailable {
        /// The address tried.
        address: String,
        /// What went wrong.
        reason: String,
    },
    /// Reading the data to scan failed (our side, not the scanner's).
    #[error("reading the data to scan: {0}")]
    Source(#[source] std::io::Error),
}

impl ScanError {
    /// Whether a retry could help.
    pub fn is_transient(&self) -> bool {
        !matches!(self, Self::TooLarge { .. })
    }
}

/// A clamd client. Cheap to clone; every call opens its own connection.
#[derive(Debug, Clone)]
pub struct Client {
    /// Where clamd listens.
    pub address: Address,
    /// Connecting may take this long.
    pub connect_timeout: Duration,
    /// Each write of a chunk (and each read while streaming) may take this long.
    pub io_timeout: Duration,
    /// After the last chunk, clamd has this long to answer (the scan itself).
    pub reply_timeout: Duration,
    /// Bytes per `INSTREAM` chunk.
    pub chunk_bytes: usize,
    /// clamd's `StreamMaxLength`: a stream longer than this is not sent.
    pub max_stream_bytes: u64,
}

trait Conn: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Conn for T {}

/// clamd's answers are short; anything longer is not clamd.
const MAX_REPLY: usize = 4096;

impl Client {
    fn unavailable(&self, reason: impl fmt::Display) -> ScanError {
        ScanError::Unavailable { address: self.address.to_string(), reason: reason.to_string() }
    }

    async fn connect(&self) -> Result<Box<dyn Conn>, ScanError> {
        let fut = async {
            Ok::<Box<dyn Conn>, std::io::Error>(match &self.address {
                Address::Tcp(a) => {
                    let s = tokio::net::TcpStream::connect(a.as_str()).await?;
                    s.set_nodelay(true)?;
                    Box::new(s)
                }
                Address::Unix(p) => Box::new(tokio::net::UnixStream::connect(p).await?),
            })
        };
        match tokio::time::timeout(self.connect_timeout, fut).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(self.unavailable(format!("connect: {e}"))),
            Err(_) => Err(self.unavailable(format!("connect timed out after {:?}", self.connect_timeout))),
        }
    }

    /// Reads one reply (up to NUL, newline or EOF) within `timeout`.
    async fn reply(&self, conn: &mut Box<dyn Conn>, timeout: Duration) -> Result<String, ScanError> {
        let fut = async {
            let mut out = Vec::with_capacity(64);
            let mut buf = [0u8; 256];
            loop {
                let n = conn.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                if let Some(end) = buf[..n].iter().position(|b| *b == 0 || *b == b'\n') {
                    out.extend_from_slice(&buf[..end]);
                    break;
                }
                out.extend_from_slice(&buf[..n]);
                if out.len() > MAX_REPLY {
                    return Err(std::io::Error::other("reply too long"));
                }
            }
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).trim().to_owned())
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(r)) if r.is_empty() => Err(self.unavailable("connection closed without a reply")),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.unavailable(format!("reading the reply: {e}"))),
            Err(_) => Err(self.unavailable(format!("no reply within {timeout:?}"))),
        }
    }

    async fn write(&self, conn: &mut Box<dyn Conn>, bytes: &[u8]) -> std::io::Result<()> {
        match tokio::time::timeout(self.io_timeout, conn.write_all(bytes)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "write timed out")),
        }
    }

    /// `zPING\0` → `PONG`.
    pub async fn ping(&self) -> Result<(), ScanError> {
        let mut conn = self.connect().await?;
        tokio::time::timeout(self.io_timeout, conn.write_all(b"zPING\0"))
            .await
            .map_err(|_| self.unavailable("write timed out"))?
            .map_err(|e| self.unavailable(format!("write: {e}")))?;
        match self.reply(&mut conn, self.io_timeout).await?.as_str() {
            "PONG" => Ok(()),
            other => Err(self.unavailable(format!("unexpected reply to PING: {other:?}"))),
        }
    }

    /// Streams everything `data` yields to clamd and returns its verdict.
    /// `progress` is called with the bytes sent so far after each chunk.
    pub async fn scan<R: AsyncRead + Unpin>(&self, mut data: R, mut progress: impl FnMut(u64)) -> Result<Verdict, ScanError> {
        let mut conn = self.connect().await?;
        let chunk = self.chunk_bytes.clamp(1024, 8 * 1024 * 1024);
        let mut buf = vec![0u8; 4 + chunk];
        let mut sent = 0u64;
        let streamed: Result<(), std::io::Error> = async {
            self.write(&mut conn, b"zINSTREAM\0").await?;
            loop {
                // Fill the chunk (short reads are fine, but fewer frames are cheaper).
                let mut n = 0;
                while n < chunk {
                    let r = data.read(&mut buf[4 + n..]).await.map_err(|e| std::io::Error::other(SourceError(e)))?;
                    if r == 0 {
                        break;
                    }
                    n += r;
                }
                if n == 0 {
                    break;
                }
                if sent + n as u64 > self.max_stream_bytes {
                    return Err(std::io::Error::other(TooLargeMarker));
                }
                buf[..4].copy_from_slice(&(n as u32).to_be_bytes());
                self.write(&mut conn, &buf[..4 + n]).await?;
                sent += n as u64;
                progress(sent);
            }
            self.write(&mut conn, &0u32.to_be_bytes()).await?;
            conn.flush().await
        }
        .await;
        if let Err(e) = streamed {
            if e.get_ref().is_some_and(|i| i.is::<TooLargeMarker>()) {
                return Err(ScanError::TooLarge { limit: self.max_stream_bytes, by: "client" });
            }
            if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<SourceError>()) {
                return Err(ScanError::Source(std::io::Error::new(inner.0.kind(), inner.0.to_string())));
            }
            // clamd may have answered (size limit) and closed while we were still writing.
            return match self.reply(&mut conn, Duration::from_secs(1)).await {
                Ok(r) if r.contains("size limit exceeded") => Err(ScanError::TooLarge { limit: self.max_stream_bytes, by: "clamd" }),
                _ => Err(self.unavailable(format!("sending the stream after {sent} bytes: {e}"))),
            };
        }
        let reply = self.reply(&mut conn, self.reply_timeout).await?;
        parse_reply(&reply).map_err(|r| match r {
            Reply::TooLarge => ScanError::TooLarge { limit: self.max_stream_bytes, by: "clamd" },
            Reply::Other(m) => self.unavailable(format!("clamd answered {m:?}")),
        })
    }
}

#[derive(Debug)]
struct TooLargeMarker;
impl fmt::Display for TooLargeMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stream too large")
    }
}
impl std::error::Error for TooLargeMarker {}

#[derive(Debug)]
struct SourceError(std::io::Error);
impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
impl std::error::Error for SourceError {}

/// A reply that is not a verdict.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `INSTREAM size limit exceeded. ERROR`.
    TooLarge,
    /// Any other answer (errors, garbage).
    Other(String),
}

/// Parses clamd's answer to `INSTREAM`.
pub fn parse_reply(reply: &str) -> Result<Verdict, Reply> {
    let r = reply.trim_end_matches(['\0', '\n']).trim();
    if r.contains("size limit exceeded") {
        return Err(Reply::TooLarge);
    }
    // With `zIDSESSION` replies are prefixed by "<n>: "; we do not use sessions.
    let body = r.strip_prefix("stream:").map(str::trim);
    match body {
        Some("OK") => Ok(Verdict::Clean),
        Some(b) if b.ends_with(" FOUND") => {
            let sig = b.trim_end_matches(" FOUND").trim();
            if sig.is_empty() {
                Err(Reply::Other(r.to_owned()))
            } else {
                Ok(Verdict::Infected { signature: sig.to_owned() })
            }
        }
        _ => Err(Reply::Other(r.to_owned())),
    }
}

// ---------------------------------------------------------------- metrics --

/// How a scan of a job's source ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No signature matched.
    Clean,
    /// A signature matched: `malware_detected`.
    Infected,
    /// `scanner.enabled = false`.
    Skipped,
    /// Larger than `StreamMaxLength`: `file_too_large_to_scan`.
    TooLarge,
    /// Retry budget spent: `scan_unavailable`.
    Unavailable,
}

impl Outcome {
    const ALL: [Outcome; 5] = [Self::Clean, Self::Infected, Self::Skipped, Self::TooLarge, Self::Unavailable];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Clean => "clean",
            Self::Infected => "infected",
            Self::Skipped => "skipped",
            Self::TooLarge => "too_large",
            Self::Unavailable => "unavailable",
        }
    }
}

/// Upper bounds (seconds) of the scan-duration histogram buckets.
const BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0];

/// Process-wide scan counters, rendered by `/metrics` in Prometheus text format.
pub struct Metrics {
    by_outcome: [AtomicU64; 5],
    attempt_failures: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    duration_count: AtomicU64,
    duration_sum_micros: AtomicU64,
}

/// The transcoder's scan metrics.
pub static METRICS: Metrics = Metrics {
    by_outcome: [const { AtomicU64::new(0) }; 5],
    attempt_failures: AtomicU64::new(0),
    buckets: [const { AtomicU64::new(0) }; BUCKETS.len()],
    duration_count: AtomicU64::new(0),
    duration_sum_micros: AtomicU64::new(0),
};

impl Metrics {
    /// Counts one finished scan (all attempts included in `took`).
    pub fn record(&self, outcome: Outcome, took: Duration) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.by_outcome[i].fetch_add(1, Ordering::Relaxed);
        if outcome == Outcome::Skipped {
            return;
        }
        let secs = took.as_secs_f64();
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            if secs <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.duration_count.fetch_add(1, Ordering::Relaxed);
        self.duration_sum_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts one failed attempt to reach the scanner (retried or not).
    pub fn attempt_failed(&self) {
        self.attempt_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Scans recorded with `outcome` so far.
    pub fn count(&self, outcome: Outcome) -> u64 {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.by_outcome[i].load(Ordering::Relaxed)
    }

    /// Prometheus text exposition format (0.0.4).
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str("# HELP vid_transcoder_scans_total Source scans by outcome.\n# TYPE vid_transcoder_scans_total counter\n");
        for (o, c) in Outcome::ALL.iter().zip(&self.by_outcome) {
            s.push_str(&format!("vid_transcoder_scans_total{{outcome=\"{}\"}} {}\n", o.as_str(), c.load(Ordering::Relaxed)));
        }
        s.push_str("# HELP vid_transcoder_scan_attempt_failures_total Attempts that could not reach or use the scanner.\n");
        s.push_str("# TYPE vid_transcoder_scan_attempt_failures_total counter\n");
        s.push_str(&format!("vid_transcoder_scan_attempt_failures_total {}\n", self.attempt_failures.load(Ordering::Relaxed)));
        s.push_str("# HELP vid_transcoder_scan_duration_seconds Time to a scan outcome, retries included (skipped scans excluded).\n");
        s.push_str("# TYPE vid_transcoder_scan_duration_seconds histogram\n");
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            s.push_str(&format!("vid_transcoder_scan_duration_seconds_bucket{{le=\"{le}\"}} {}\n", b.load(Ordering::Relaxed)));
        }
        let count = self.duration_count.load(Ordering::Relaxed);
        s.push_str(&format!("vid_transcoder_scan_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n"));
        s.push_str(&format!(
            "vid_transcoder_scan_duration_seconds_sum {}\n",
            self.duration_sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        ));
        s.push_str(&format!("vid_transcoder_scan_duration_seconds_count {count}\n"));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        assert_eq!(parse_reply("stream: OK"), Ok(Verdict::Clean));
        assert_eq!(parse_reply("stream: OK\0"), Ok(Verdict::Clean));
        assert_eq!(parse_reply("stream: Eicar-Test-Signature FOUND"), Ok(Verdict::Infected { signature: "Eicar-Test-Signature".into() }));
        assert_eq!(parse_reply("INSTREAM size limit exceeded. ERROR"), Err(Reply::TooLarge));
        assert!(matches!(parse_reply("stream: Can't allocate memory ERROR"), Err(Reply::Other(_))));
        assert!(matches!(parse_reply("UNKNOWN COMMAND"), Err(Reply::Other(_))));
        assert!(matches!(parse_reply("stream:  FOUND"), Err(Reply::Other(_))));
    }

    #[test]
    fn addresses_parse() {
        assert_eq!(Address::parse("127.0.0.1:3310"), Address::Tcp("127.0.0.1:3310".into()));
        assert_eq!(Address::parse("unix:/run/clamd.sock"), Address::Unix("/run/clamd.sock".into()));
        assert_eq!(Address::parse("/run/clamd.sock"), Address::Unix("/run/clamd.sock".into()));
    }

    #[test]
    fn metrics_render_as_prometheus_text() {
        let m = Metrics {
            by_outcome: [const { AtomicU64::new(0) }; 5],
            attempt_failures: AtomicU64::new(0),
            buckets: [const { AtomicU64::new(0) }; BUCKETS.len()],
            duration_count: AtomicU64::new(0),
            duration_sum_micros: AtomicU64::new(0),
        };
        m.record(Outcome::Clean, Duration::from_millis(300));
        m.record(Outcome::Skipped, Duration::ZERO);
        let t = m.render();
        assert!(t.contains("vid_transcoder_scans_total{outcome=\"clean\"} 1\n"), "{t}");
        assert!(t.contains("vid_transcoder_scans_total{outcome=\"skipped\"} 1\n"), "{t}");
        assert!(t.contains("vid_transcoder_scan_duration_seconds_bucket{le=\"0.25\"} 0\n"), "{t}");
        assert!(t.contains("vid_transcoder_scan_duration_seconds_bucket{le=\"0.5\"} 1\n"), "{t}");
        assert!(t.contains("vid_transcoder_scan_duration_seconds_count 1\n"), "{t}");
    }
}
