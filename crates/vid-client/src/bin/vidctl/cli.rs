//! The command line: every subcommand, flag and value parser (clap).

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use vid_core::endpoint::SignatureFormat;
use vid_core::event::EventType;
use vid_core::messages::Mp4Support;
use vid_core::playback::{Audience, PlaybackPolicy};
use vid_core::{DeliveryId, EndpointId, EventId, OperationId, PlaybackId, SigningKeyId, UploadId, VideoId};

#[derive(Parser)]
#[command(name = "vidctl", version, about = "Upload videos and manage the video platform from the shell")]
pub(crate) struct Cli {
    /// API base URL [default: http://127.0.0.1:8080].
    #[arg(long, env = "VIDCTL_API_URL", global = true)]
    pub(crate) api_url: Option<String>,
    /// API key [default: the `.local/api-key` found in this directory or a parent].
    #[arg(long, env = "VIDCTL_API_KEY", global = true, hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Machine-readable JSON output (and no progress bars).
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Upload a video in parallel parts straight to storage (resumable), then complete it.
    Upload(UploadArgs),
    /// Long-running operations (transcodes).
    #[command(subcommand)]
    Operations(OperationCmd),
    /// Videos and their renditions.
    #[command(subcommand)]
    Videos(VideoCmd),
    /// A video's playback IDs (stable HLS and DASH URLs).
    #[command(subcommand)]
    PlaybackIds(PlaybackIdCmd),
    /// Uploads in progress.
    #[command(subcommand)]
    Uploads(UploadCmd),
    /// Webhook endpoints and their deliveries.
    #[command(subcommand)]
    Endpoints(EndpointCmd),
    /// Events (what webhooks announce).
    #[command(subcommand)]
    Events(EventCmd),
    /// Signing keys for signed playback IDs.
    #[command(subcommand)]
    SigningKeys(SigningKeyCmd),
    /// Playback tokens for signed playback IDs (offline: needs no API access).
    #[command(subcommand)]
    Playback(PlaybackCmd),
    /// Check a captured webhook's signature (needs no API access).
    Verify {
        /// The endpoint secret (`whsec_…`); repeat during a rotation.
        #[arg(long, required = true)]
        secret: Vec<String>,
        /// A header as received, `Name: value` (repeatable); a bare value is taken as `Webhook-Signature`.
        #[arg(long, required = true)]
        header: Vec<String>,
        /// The raw body, exactly as received.
        #[arg(long)]
        body_file: PathBuf,
        /// Accepted clock difference in seconds; 0 skips the timestamp check.
        #[arg(long, default_value_t = 300)]
        tolerance: u64,
    },
}

#[derive(Args)]
pub(crate) struct UploadArgs {
    /// The file.
    pub(crate) file: PathBuf,
    /// Follow the transcode until it ends.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Parts sent at once (memory use is about this × the part size).
    #[arg(long, default_value_t = 4)]
    pub(crate) parallel: usize,
    /// Media type [default: guessed from the file's first bytes].
    #[arg(long)]
    pub(crate) content_type: Option<String>,
    /// With --wait: give up waiting after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub(crate) timeout: u64,
    /// Testing aid: pause this long before sending each part.
    #[arg(long, hide = true)]
    pub(crate) part_delay_ms: Option<u64>,
    /// The playback ID the video gets when ready: public, signed, or none
    /// (no playback ID; add one later with `vidctl playback-ids add`)
    /// [default: the api's, public].
    #[arg(long, value_parser = parse_upload_policy)]
    pub(crate) playback_policy: Option<UploadPolicy>,
    /// standard (static MP4 renditions besides the stream) or none (the
    /// stream only) [default: the api's, standard].
    #[arg(long, value_parser = parse_mp4_support)]
    pub(crate) mp4_support: Option<Mp4Support>,
}

/// `vidctl upload --playback-policy`: one policy, or none at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UploadPolicy {
    /// One playback ID of this policy.
    One(PlaybackPolicy),
    /// No playback ID (`"playback_policy": []`).
    None,
}

impl UploadPolicy {
    /// The `playback_policy` member of `POST /uploads`.
    pub(crate) fn policies(self) -> Vec<PlaybackPolicy> {
        match self {
            UploadPolicy::One(p) => vec![p],
            UploadPolicy::None => Vec::new(),
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum PlaybackIdCmd {
    /// Add a playback ID to a video (it serves once the video is ready); prints its URLs.
    Add {
        video: VideoId,
        /// public, or signed (every URL then needs a token: `vidctl playback sign`).
        #[arg(long, value_parser = parse_policy, default_value = "public")]
        policy: PlaybackPolicy,
    },
    /// Delete one of a video's playback IDs: its URLs stop working.
    Delete { video: VideoId, playback_id: PlaybackId },
}

#[derive(Args)]
pub(crate) struct PageArgs {
    /// Continue after this cursor (printed at the end of the previous page).
    #[arg(long)]
    pub(crate) cursor: Option<String>,
    /// Follow every page.
    #[arg(long, conflicts_with = "cursor")]
    pub(crate) all: bool,
}

#[derive(Subcommand)]
pub(crate) enum OperationCmd {
    /// Show one operation.
    Get { id: OperationId },
    /// List operations, newest first.
    List {
        /// Only this status: pending, running, succeeded, failed, cancelled.
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Wait until an operation ends; exits 2 unless it succeeded.
    Wait {
        id: OperationId,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Cancel a pending or running operation.
    Cancel { id: OperationId },
}

#[derive(Subcommand)]
pub(crate) enum VideoCmd {
    /// Show one video with its renditions and download URLs.
    Get { id: VideoId },
    /// List videos, newest first.
    List {
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Subcommand)]
pub(crate) enum UploadCmd {
    /// Show an upload: status, parts in storage, parts missing.
    Get { id: UploadId },
    /// Abort an upload (storage drops its parts).
    Abort { id: UploadId },
}

#[derive(Subcommand)]
pub(crate) enum EndpointCmd {
    /// Register an endpoint; prints its signing secret once.
    Create {
        url: String,
        #[arg(long)]
        description: Option<String>,
        /// Only send this event type (repeatable) [default: every type].
        #[arg(long = "event-type", value_parser = parse_event_type)]
        event_types: Vec<EventType>,
        /// webhook-signature (default) or standard-webhooks.
        #[arg(long, value_parser = parse_format)]
        signature_format: Option<SignatureFormat>,
    },
    /// List endpoints.
    List,
    /// Show one endpoint.
    Get { id: EndpointId },
    /// Change an endpoint's URL, description, filter or signature format.
    Update {
        id: EndpointId,
        #[arg(long)]
        url: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// Remove the description.
        #[arg(long, conflicts_with = "description")]
        clear_description: bool,
        /// Only send this event type (repeatable; replaces the filter).
        #[arg(long = "event-type", value_parser = parse_event_type)]
        event_types: Vec<EventType>,
        /// Remove the filter: send every event type.
        #[arg(long, conflicts_with = "event_types")]
        all_event_types: bool,
        /// webhook-signature or standard-webhooks.
        #[arg(long, value_parser = parse_format)]
        signature_format: Option<SignatureFormat>,
    },
    /// Delete an endpoint.
    Delete { id: EndpointId },
    /// Give an endpoint a new secret (printed once); the old one signs too for a while.
    RotateSecret { id: EndpointId },
    /// Re-enable a disabled endpoint; its paused backlog is delivered.
    Enable { id: EndpointId },
    /// Recent deliveries to an endpoint, with their last attempt.
    Deliveries {
        id: EndpointId,
        /// pending, succeeded, failed or paused.
        #[arg(long)]
        status: Option<String>,
        /// e.g. video.ready.
        #[arg(long)]
        event_type: Option<String>,
        /// Page size, 1–100.
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Send a delivery once more.
    Retry { id: EndpointId, delivery_id: DeliveryId },
}

#[derive(Subcommand)]
pub(crate) enum EventCmd {
    /// Show one event exactly as it was sent.
    Get { id: EventId },
    /// List events, newest first.
    List {
        /// Only this type, e.g. `video.ready`.
        #[arg(long = "type")]
        type_: Option<String>,
        /// Only events recorded strictly after this instant: RFC 3339 with an
        /// offset, e.g. `2026-01-02T03:04:05Z` or `2026-01-02T04:04:05+01:00`.
        #[arg(long, value_parser = parse_rfc3339)]
        created_after: Option<DateTime<Utc>>,
        /// Only events recorded strictly before this instant (RFC 3339, like
        /// `--created-after`).
        #[arg(long, value_parser = parse_rfc3339)]
        created_before: Option<DateTime<Utc>>,
        #[command(flatten)]
        page: PageArgs,
    },
}

/// An RFC 3339 date-time with an offset (`2026-01-02T03:04:05Z`,
/// `2026-01-02T04:04:05.5+01:00`), as a UTC instant.
fn parse_rfc3339(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 date-time with an offset, such as 2026-01-02T03:04:05Z ({e})"))
}

fn parse_event_type(s: &str) -> Result<EventType, String> {
    EventType::parse(s).ok_or_else(|| format!("unknown event type; one of {}", EventType::ALL.map(|t| t.as_str()).join(", ")))
}

fn parse_policy(s: &str) -> Result<PlaybackPolicy, String> {
    PlaybackPolicy::parse(s).ok_or_else(|| "one of public, signed".to_owned())
}

fn parse_upload_policy(s: &str) -> Result<UploadPolicy, String> {
    match s {
        "none" => Ok(UploadPolicy::None),
        other => PlaybackPolicy::parse(other).map(UploadPolicy::One).ok_or_else(|| "one of public, signed, none".to_owned()),
    }
}

fn parse_mp4_support(s: &str) -> Result<Mp4Support, String> {
    Mp4Support::parse(s).ok_or_else(|| "one of standard, none".to_owned())
}

fn parse_format(s: &str) -> Result<SignatureFormat, String> {
    SignatureFormat::parse(s).ok_or_else(|| "one of webhook-signature, standard-webhooks".to_owned())
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use clap::Parser;
    use vid_core::EndpointId;

    use super::*;

    #[test]
    fn endpoints_update_can_clear_the_description_and_the_filter() {
        let id = EndpointId::generate().to_string();
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["vidctl", "endpoints", "update", id.as_str()].iter().chain(extra)).map(|cli| match cli.command {
                Command::Endpoints(EndpointCmd::Update { clear_description, all_event_types, .. }) => (clear_description, all_event_types),
                _ => panic!("not endpoints update"),
            })
        };
        assert_eq!(parse(&["--clear-description", "--all-event-types"]).unwrap(), (true, true));
        assert_eq!(parse(&["--url", "https://a.example/"]).unwrap(), (false, false));
        assert!(parse(&["--clear-description", "--description", "x"]).is_err());
        assert!(parse(&["--all-event-types", "--event-type", "video.ready"]).is_err());
    }

    #[test]
    fn upload_takes_a_playback_policy_or_none_and_mp4_support() {
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["vidctl", "upload", "a.mp4"].iter().chain(extra)).map(|cli| match cli.command {
                Command::Upload(a) => (a.playback_policy.map(UploadPolicy::policies), a.mp4_support),
                _ => panic!("not upload"),
            })
        };
        assert_eq!(parse(&[]).unwrap(), (None, None));
        assert_eq!(parse(&["--playback-policy", "public"]).unwrap(), (Some(vec![PlaybackPolicy::Public]), None));
        assert_eq!(parse(&["--playback-policy", "signed"]).unwrap(), (Some(vec![PlaybackPolicy::Signed]), None));
        assert_eq!(parse(&["--playback-policy", "none", "--mp4-support", "none"]).unwrap(), (Some(vec![]), Some(Mp4Support::None)));
        assert_eq!(parse(&["--mp4-support", "standard"]).unwrap(), (None, Some(Mp4Support::Standard)));
        assert!(parse(&["--playback-policy", "private"]).is_err());
        assert!(parse(&["--mp4-support", "capped-1080p"]).is_err());
    }

    #[test]
    fn playback_ids_add_defaults_to_public() {
        let video = vid_core::VideoId::generate().to_string();
        let cli = Cli::try_parse_from(["vidctl", "playback-ids", "add", video.as_str()]).unwrap();
        assert!(matches!(cli.command, Command::PlaybackIds(PlaybackIdCmd::Add { policy: PlaybackPolicy::Public, .. })));
        let pb = vid_core::PlaybackId::generate().to_string();
        let cli = Cli::try_parse_from(["vidctl", "playback-ids", "delete", video.as_str(), pb.as_str()]).unwrap();
        assert!(matches!(cli.command, Command::PlaybackIds(PlaybackIdCmd::Delete { .. })));
        assert!(Cli::try_parse_from(["vidctl", "playback-ids", "add", video.as_str(), "--policy", "none"]).is_err());
    }

    #[test]
    fn events_list_takes_rfc3339_time_bounds() {
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["vidctl", "events", "list"].iter().chain(extra)).map(|cli| match cli.command {
                Command::Events(EventCmd::List { created_after, created_before, .. }) => (created_after, created_before),
                _ => panic!("not events list"),
            })
        };
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(parse(&[]).unwrap(), (None, None));
        assert_eq!(parse(&["--created-after", "2026-01-02T03:04:05Z"]).unwrap(), (Some(at), None));
        assert_eq!(parse(&["--created-before", "2026-01-02T04:04:05+01:00"]).unwrap(), (None, Some(at)));
        for bad in ["yesterday", "2026-01-02", "2026-01-02T03:04:05", "1767323045"] {
            assert!(parse(&["--created-after", bad]).is_err(), "{bad}");
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum SigningKeyCmd {
    /// Create an RSA key pair; prints its id and private key (shown this once).
    Create {
        /// Write the private key (PEM) to this new file (mode 0600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List signing keys, newest first.
    List {
        #[command(flatten)]
        page: PageArgs,
    },
    /// Delete a signing key: tokens signed with it stop working at once.
    Delete { id: SigningKeyId },
}

#[derive(Subcommand)]
pub(crate) enum PlaybackCmd {
    /// Print a playback token (RS256 JWT) for a signed playback ID; append it as `?token=…`.
    Sign {
        /// The signing key's private key (PEM), as `signing-keys create` gave it.
        #[arg(long)]
        key_file: PathBuf,
        /// The signing key's id (`sk_…`): the token's `kid`.
        #[arg(long)]
        key_id: SigningKeyId,
        /// The signed playback ID (`pb_…`): the token's `sub`.
        #[arg(long)]
        playback_id: PlaybackId,
        /// v (video: manifests and segments), t (thumbnail), s (storyboard) or g (poster).
        #[arg(long, value_parser = parse_audience, default_value = "v")]
        audience: Audience,
        /// Lifetime: seconds, or a number with s, m, h or d (`90s`, `15m`, `1h`, `7d`).
        #[arg(long, value_parser = parse_duration, default_value = "1h")]
        expires_in: Duration,
    },
}

fn parse_audience(s: &str) -> Result<Audience, String> {
    Audience::from_claim(s).ok_or_else(|| "one of v, t, s, g".to_owned())
}

/// `3600`, `90s`, `15m`, `1h`, `7d`; at least one second.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{s}`: a number of seconds, or with s, m, h or d"))?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .filter(|&n| n > 0)
    .ok_or_else(|| format!("`{s}`: a positive number of seconds, or with s, m, h or d"))?;
    Ok(Duration::from_secs(secs))
}
