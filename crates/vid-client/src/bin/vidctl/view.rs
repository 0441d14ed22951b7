//! How results look to people: aligned fields and tables, times, sizes, and
//! one view per resource. Everything here prints to stdout or returns text;
//! `--json` output never comes here (see [`crate::output`]).

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use vid_core::endpoint::{Endpoint, EndpointHealth, EndpointStatus};
use vid_core::event::{Event, EventData};
use vid_core::operation::{Operation, Phase};
use vid_core::playback::PlaybackIdView;
use vid_core::upload::UploadState;
use vid_core::video::Video;

/// Prints rows under headers, columns aligned; the last column is not padded.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        println!("(none)");
    }
}

/// Prints `key  value` lines, keys aligned.
pub(crate) fn fields(pairs: &[(&str, String)]) {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs {
        println!("{k:<w$}  {v}");
    }
}

pub(crate) fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

pub(crate) fn opt_time(t: &Option<DateTime<Utc>>) -> String {
    t.as_ref().map(time).unwrap_or_else(|| "-".into())
}

pub(crate) fn dash(s: Option<impl ToString>) -> String {
    s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
}

pub(crate) fn phase_str(p: Option<Phase>) -> String {
    p.and_then(|p| serde_json::to_value(p).ok()).and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

pub(crate) fn human_bytes(n: u64) -> String {
    indicatif::BinaryBytes(n).to_string()
}

/// `1-3, 5, 7-9`.
pub(crate) fn ranges(ns: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ns.len() {
        let start = ns[i];
        while i + 1 < ns.len() && ns[i + 1] == ns[i] + 1 {
            i += 1;
        }
        out.push(if ns[i] == start { start.to_string() } else { format!("{start}-{}", ns[i]) });
        i += 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

pub(crate) fn print_page_end(next: &Option<String>) {
    if let Some(c) = next {
        println!("more: --cursor {c}");
    }
}

pub(crate) fn operation_status_line(op: &Operation) -> String {
    let mut s = format!("{} {}%", op.status.as_str(), op.progress);
    let phase = phase_str(op.metadata.phase);
    if !phase.is_empty() && !op.status.is_terminal() {
        s.push_str(&format!(" ({phase})"));
    }
    s
}

pub(crate) fn print_operation(op: &Operation) {
    let mut f = vec![
        ("operation", op.id.to_string()),
        ("status", operation_status_line(op)),
        ("video", dash(op.metadata.video_id.as_ref())),
        ("created", time(&op.created_at)),
        ("updated", time(&op.updated_at)),
    ];
    if let Some(r) = &op.result {
        let list: Vec<String> = r.renditions.iter().map(|r| format!("{} {}x{}", r.name, r.width, r.height)).collect();
        f.push(("renditions", list.join(", ")));
    }
    if let Some(e) = &op.error {
        f.push(("error", format!("{}: {} (code {})", e.title, e.detail.as_deref().unwrap_or(""), e.code)));
    }
    fields(&f);
}

/// One row of the operations table.
pub(crate) fn operation_row(o: &Operation) -> Vec<String> {
    vec![
        o.id.to_string(),
        o.status.as_str().into(),
        format!("{}%", o.progress),
        phase_str(o.metadata.phase),
        dash(o.metadata.video_id.as_ref()),
        time(&o.created_at),
    ]
}

pub(crate) fn print_video(v: &Video) {
    let mut f = vec![
        ("video", v.id.to_string()),
        ("status", format!("{} (version {})", v.status.as_str(), v.version)),
        ("operation", v.operation_id.to_string()),
        ("filename", dash(v.filename.as_ref())),
        ("content type", v.content_type.clone()),
        ("created", time(&v.created_at)),
        ("updated", time(&v.updated_at)),
    ];
    if let Some(s) = &v.source {
        f.push((
            "source",
            format!(
                "{}x{} {} / {} , {}, {} s, {}",
                s.width,
                s.height,
                s.video_codec,
                s.audio_codec.as_deref().unwrap_or("no audio"),
                s.container,
                s.duration_seconds.map(|d| format!("{d:.1}")).unwrap_or_else(|| "?".into()),
                human_bytes(s.size_bytes)
            ),
        ));
    }
    if let Some(p) = &v.poster {
        f.push(("poster", format!("{}x{} {}", p.width, p.height, p.url.as_deref().unwrap_or(&p.storage_key))));
    }
    f.push(("mp4 support", v.mp4_support.as_str().into()));
    fields(&f);
    if !v.renditions.is_empty() {
        println!();
        print_renditions(v, true);
    }
    println!();
    print_playback_ids(&v.playback_ids);
}

/// The playback IDs table: id, policy, created, and the HLS and DASH URLs.
pub(crate) fn print_playback_ids(ids: &[PlaybackIdView]) {
    let rows: Vec<Vec<String>> = ids
        .iter()
        .map(|p| vec![p.id.to_string(), p.policy.as_str().into(), time(&p.created_at), p.hls_url.clone(), p.dash_url.clone()])
        .collect();
    table(&["PLAYBACK ID", "POLICY", "CREATED", "HLS", "DASH"], &rows);
}

/// One playback ID, as `vidctl playback-ids add` prints it.
pub(crate) fn print_playback_id(p: &PlaybackIdView) {
    fields(&[
        ("playback id", p.id.to_string()),
        ("policy", p.policy.as_str().into()),
        ("hls", p.hls_url.clone()),
        ("dash", p.dash_url.clone()),
        ("created", time(&p.created_at)),
    ]);
}

pub(crate) fn print_renditions(v: &Video, urls: bool) {
    let rows: Vec<Vec<String>> = v
        .renditions
        .iter()
        .map(|r| {
            let mut row =
                vec![r.name.clone(), format!("{}x{}", r.width, r.height), format!("{} kb/s", r.bitrate / 1000), human_bytes(r.size_bytes)];
            if urls {
                row.push(r.url.clone().unwrap_or_else(|| r.storage_key.clone()));
            }
            row
        })
        .collect();
    if urls {
        table(&["RENDITION", "SIZE", "BITRATE", "BYTES", "URL"], &rows);
    } else {
        table(&["RENDITION", "SIZE", "BITRATE", "BYTES"], &rows);
    }
}

pub(crate) fn print_upload(u: &UploadState) {
    let stored: u64 = u.parts.iter().map(|p| p.size_bytes).sum();
    fields(&[
        ("upload", u.id.to_string()),
        ("status", u.status.as_str().into()),
        ("size", format!("{} ({} bytes), {} parts of {}", human_bytes(u.size_bytes), u.size_bytes, u.part_count, human_bytes(u.part_size))),
        ("stored", format!("{} parts, {}", u.parts.len(), human_bytes(stored))),
        ("missing", ranges(&u.missing_parts)),
        ("content type", u.content_type.clone()),
        ("video", dash(u.video_id.as_ref())),
        ("operation", dash(u.operation_id.as_ref())),
        ("created", time(&u.created_at)),
        ("expires", time(&u.expires_at)),
    ]);
}

pub(crate) fn endpoint_status(e: &Endpoint) -> String {
    match e.status {
        EndpointStatus::Enabled => "enabled".into(),
        EndpointStatus::Disabled => format!("disabled ({})", e.disabled_reason.as_deref().unwrap_or("no reason")),
    }
}

pub(crate) fn event_types(e: &Endpoint) -> String {
    match &e.event_types {
        Some(ts) => ts.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(","),
        None => "all".into(),
    }
}

pub(crate) fn print_endpoint(e: &Endpoint) {
    fields(&[
        ("endpoint", e.id.to_string()),
        ("url", e.url.clone()),
        ("status", endpoint_status(e)),
        ("events", event_types(e)),
        ("signature", e.signature_format.as_str().into()),
        ("description", dash(e.description.as_ref())),
        ("disabled at", opt_time(&e.disabled_at)),
        ("created", time(&e.created_at)),
    ]);
}

/// `97 % of 100 (last: HTTP 200 at …)`, or `-` before any attempt.
pub(crate) fn health_line(h: &EndpointHealth) -> String {
    let Some(rate) = h.success_rate else { return "-".into() };
    let last = match (h.last_attempt_status, &h.last_attempt_error_class) {
        (Some(status), _) => format!("HTTP {status}"),
        (None, Some(class)) => class.clone(),
        (None, None) => "-".into(),
    };
    format!("{:.0} % of {} succeeded (last: {last} at {})", rate * 100.0, h.recent_deliveries, opt_time(&h.last_attempt_at))
}

pub(crate) fn event_subject(e: &Event) -> String {
    match &e.data {
        EventData::Video(d) => format!("video {} v{} (operation {})", d.video_id, d.version, d.operation_id),
        EventData::Endpoint(d) => format!("endpoint {}: {}", d.endpoint_id, d.reason),
    }
}

pub(crate) fn unix_time(secs: i64) -> String {
    Utc.timestamp_opt(secs, 0).single().map(|t| time(&t)).unwrap_or_else(|| secs.to_string())
}

pub(crate) fn vstr(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

pub(crate) fn delivery_row(d: &Value) -> Vec<String> {
    let last = d.get("attempts").and_then(Value::as_array).and_then(|a| a.last());
    let outcome = match last {
        Some(a) => match (a.get("response_status").and_then(Value::as_i64), a.get("error_class").and_then(Value::as_str)) {
            (Some(s), None) => format!("HTTP {s}"),
            (Some(s), Some(c)) => format!("HTTP {s} ({c})"),
            (None, Some(c)) => c.to_owned(),
            (None, None) => "-".into(),
        },
        None => "-".into(),
    };
    vec![
        vstr(d, "id"),
        vstr(d, "event_id"),
        vstr(d, "event_type"),
        vstr(d, "status"),
        vstr(d, "attempt_count"),
        outcome,
        vstr(d, "next_attempt_at"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_line_says_rate_count_and_last_outcome() {
        assert_eq!(health_line(&EndpointHealth::default()), "-", "nothing attempted yet");
        let at = Utc.with_ymd_and_hms(2026, 11, 30, 1, 2, 3).unwrap();
        let h = EndpointHealth {
            recent_deliveries: 8,
            recent_succeeded: 6,
            success_rate: Some(0.75),
            last_attempt_at: Some(at),
            last_attempt_status: None,
            last_attempt_error_class: Some("timeout".into()),
        };
        let line = health_line(&h);
        assert!(line.starts_with("75 % of 8 succeeded (last: timeout at "), "{line}");
        let line = health_line(&EndpointHealth { last_attempt_status: Some(503), last_attempt_error_class: Some("http".into()), ..h });
        assert!(line.contains("last: HTTP 503"), "{line}");
    }
}
