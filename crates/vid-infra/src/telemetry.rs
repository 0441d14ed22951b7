//! Tracing set-up shared by the services.

use tracing_subscriber::EnvFilter;

use crate::settings::{LogFormat, TelemetrySettings};

/// Installs the global tracing subscriber: `RUST_LOG` if set, else `settings.level`.
/// Calling it twice is harmless (the second call does nothing).
pub fn init(settings: &TelemetrySettings) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(true);
    let _ = match settings.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}
