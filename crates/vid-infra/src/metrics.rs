//! Prometheus metrics, one way for every service.
//!
//! Code records through the [`metrics`] facade macros
//! (`metrics::counter!("name", "label" => value).increment(1)`,
//! `metrics::histogram!(…).record(seconds)`, `metrics::gauge!(…).set(v)`);
//! [`install`] puts the Prometheus recorder of `metrics-exporter-prometheus`
//! behind them once per process, and [`render`] gives the text exposition
//! format (version 0.0.4) that each service serves on `GET /metrics`.
//!
//! Names follow the Prometheus conventions: base units (`_seconds`,
//! `_bytes`), `_total` for counters. Histograms named `*_seconds` get the
//! buckets of [`LATENCY_BUCKETS`]; transcode durations get
//! [`TRANSCODE_BUCKETS`].
//!
//! Metric names in use (keep this list true):
//! - `http_requests_total{method,route,status}`, `http_request_duration_seconds{method,route}`
//!   (api, `vid_api::metrics`; playback, `vid_playback::metrics`, e.g. `route="/play/{pb}.m3u8"`;
//!   `route` is the matched route pattern, `unmatched` if none)
//! - `playback_cache_lookups_total{cache,outcome}` (playback: `cache` `id|manifest`, outcome `hit|miss`)
//! - `amqp_messages_consumed_total{queue,outcome}` (every consumer; `queue` is the full queue
//!   name, e.g. `vid.transcode.jobs`, or the transcoder's control exchange `vid.control` for
//!   its server-named cancel queue; outcome `ack|requeue|reject`)
//! - `outbox_messages_published_total{exchange}` (api's outbox relay, counted after the commit)
//! - `jobs_redriven_total`, `operations_job_lost_total` (api janitor: transcode jobs published
//!   again for `pending` operations, and operations failed `job_lost`), gauge
//!   `oldest_pending_operation_age_seconds` (api janitor, each pass; 0 when none is pending)
//! - `transcode_duration_seconds{rendition}` (transcoder: wall-clock seconds of the single-decode
//!   transcode pass, recorded for each static MP4 rendition it produced; none with `mp4_support: none`), `transcode_jobs_total{outcome}`
//!   (`succeeded|failed|cancelled|shutdown|retry|malformed`)
//! - `webhook_delivery_attempts_total{outcome}`, `webhook_delivery_attempt_duration_seconds`,
//!   `webhook_retry_backlog`, `webhook_endpoints_disabled_total{reason}` (dispatcher)
//! - `webhook_deliveries_leased_total{by}` (dispatcher: deliveries leased for an attempt, `by`
//!   `fanin` when the fan-in's insert leased them, `claim` when a claim did; in a burst the
//!   claims carry nearly all, since the fan-in leases only for an endpoint with nothing older
//!   due; counted when leased, so a lease given back unsent at shutdown counts too),
//!   `webhook_claims_total{result}` (dispatcher's claim statements that returned, `result`
//!   `leased|empty`; a failed one is logged, not counted)
//! - `events_reconciled_total`, `webhook_deliveries_reconciled_total` (dispatcher's
//!   reconciliation: events found without their deliveries, and the deliveries it created; 0 on
//!   a healthy system), gauges `events_reconcile_last_success_timestamp_seconds` (Unix seconds
//!   of the last complete pass) and `events_reconcile_mark_lag_seconds` (now minus the
//!   high-water mark)
//! - `vid_transcoder_scans_total{outcome}`, `vid_transcoder_scan_attempt_failures_total`,
//!   `vid_transcoder_scan_duration_seconds` (transcoder's malware scan counters: its own
//!   atomics in `vid_transcoder::scan::METRICS`, appended to the same `/metrics` page)

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use metrics::{counter, gauge, histogram};

/// Buckets (seconds) for request and attempt latencies: 1 ms … 30 s.
pub const LATENCY_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
/// Buckets (seconds) for transcode durations: 100 ms … 1 h.
pub const TRANSCODE_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (idempotent: later calls,
/// e.g. from several tests in one process, reuse the first) and returns its
/// handle. Errors: none surfaced; if another recorder was installed first the
/// facade keeps that one and [`render`] shows only what reaches this one.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full("transcode_duration_seconds".into()), TRANSCODE_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS))
            .expect("bucket lists are non-empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// The current values in the Prometheus text exposition format
/// (`text/plain; version=0.0.4`). Installs the recorder if nobody did.
pub fn render() -> String {
    install().render()
}

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    #[test]
    fn recorded_values_appear_in_the_exposition() {
        super::install();
        super::counter!("vid_infra_selftest_total", "outcome" => "ok").increment(3);
        super::histogram!("vid_infra_selftest_seconds").record(0.004);
        let text = super::render();
        assert!(text.contains(r#"vid_infra_selftest_total{outcome="ok"} 3"#), "{text}");
        assert!(text.contains(r#"vid_infra_selftest_seconds_bucket{le="0.005"} 1"#), "{text}");
        assert!(text.contains(r#"vid_infra_selftest_seconds_bucket{le="0.0025"} 0"#), "{text}");
    }
}
