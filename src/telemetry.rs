//! Logging: one place that sets up tracing, JSON lines on stdout.

use tracing_subscriber::EnvFilter;

/// Installs the JSON log subscriber. `RUST_LOG` overrides the default
/// filter (`info`; `debug` adds a line per request).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(true)
        .with_span_list(false)
        .init();
}
