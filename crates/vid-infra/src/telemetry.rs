//! Tracing set-up shared by the services.
//!
//! - `json` (the production profile, `config/default.toml`): one JSON object
//!   per line: `timestamp`, `level`, `target`, the event's fields flattened
//!   (`message`, …), `span` (the current span's name and fields) and `spans`
//!   (every open span, outermost first). The ids that correlate services are
//!   span fields: `request_id` (api `request` span), `correlation_id` (the
//!   AMQP `x-correlation-id` header, an operation id for one upload's
//!   messages: api `amqp_message`, transcoder `job`/`work`, dispatcher), so
//!   `grep op_…` over every service's logs follows one upload.
//! - `pretty` (development, tests): compact human-readable lines.

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::settings::{LogFormat, TelemetrySettings};

/// Installs the global tracing subscriber writing to stdout: `RUST_LOG` if
/// set, else `settings.level`. Calling it twice is harmless (the second call
/// does nothing).
pub fn init(settings: &TelemetrySettings) {
    init_with_writer(settings, std::io::stdout);
}

/// [`init`] writing to stderr, for a process whose stdout carries something
/// else (the transcoder's `work` child speaks its protocol on stdout).
pub fn init_stderr(settings: &TelemetrySettings) {
    init_with_writer(settings, std::io::stderr);
}

/// [`init`] with any writer (e.g. `std::io::stderr`).
pub fn init_with_writer<W>(settings: &TelemetrySettings, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(true).with_writer(writer);
    let _ = match settings.format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).with_span_list(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}
