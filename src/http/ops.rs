//! Operations endpoints: liveness, readiness and Prometheus metrics, and
//! the middleware that counts requests.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::error::ApiError;
use super::state::AppState;

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Purchases per group commit (both writers: `seckill_sale_batch_size`,
/// `seckill_async_batch_size`).
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// The process-wide Prometheus recorder (the `metrics` facade allows one
/// per process; every app built in it shares this).
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .expect("the bucket list is not empty")
                .set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS)
                .expect("the bucket list is not empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            register_counters();
            handle
        })
        .clone()
}

fn register_counters() {
    use crate::seckill::metric as m;
    for name in m::EVENT_COUNTERS {
        metrics::counter!(*name).absolute(0);
    }
    for outcome in m::PAYMENT_OUTCOMES {
        metrics::counter!(m::PAYMENTS, "outcome" => outcome).absolute(0);
    }
    for reason in m::UNSTORED_REASONS {
        metrics::counter!(m::ASYNC_UNSTORED, "reason" => reason).absolute(0);
    }
    super::limit::register_metrics();
    super::shed::register_metrics();
    for kind in m::QUEUE_REQUEST_KINDS {
        metrics::counter!(m::QUEUE_REQUESTS, "kind" => kind).absolute(0);
    }
    metrics::gauge!(m::QUEUE_WAITING).set(0.0);
    metrics::gauge!(m::ASYNC_IN_FLIGHT).set(0.0);
    // Histograms show up once registered, with empty buckets.
    for name in m::HISTOGRAMS {
        drop(metrics::histogram!(*name));
    }
}

#[utoipa::path(
    get, path = "/healthz", tag = "ops",
    responses((status = 200, description = "The process runs"))
)]
pub async fn healthz() -> StatusCode {
    StatusCode::OK
}

#[utoipa::path(
    get, path = "/readyz", tag = "ops",
    responses(
        (status = 200, description = "Postgres and Redis take writes (and a majority of lock nodes, with RedLock)"),
        (status = 503, description = "unavailable: a dependency cannot take writes now", body = super::error::ErrorBody),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Result<StatusCode, ApiError> {
    state.seckill.ready().await?;
    if !state.auth.ready() {
        return Err(ApiError::from(crate::auth::AuthError::Unavailable {
            dependency: "the identity provider's JWK Set",
            detail: "not loaded yet".into(),
        }));
    }
    Ok(StatusCode::OK)
}

#[utoipa::path(
    get, path = "/metrics", tag = "ops",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain; version=0.0.4", body = String),
        (status = 404, description = "not_found: served on SECKILL_METRICS_ADDR instead", body = super::error::ErrorBody),
    )
)]
pub async fn metrics(State(state): State<AppState>) -> Response {
    let arrived = Instant::now();
    // While the instance sheds, scrapes that queue behind a render (a
    // flood) are served a page up to a second old: a render a second, not
    // one per request. One scraper asking in turn always gets a fresh one.
    let stale_ok = if state.shedder.pressed() {
        PAGE_STALE_WHILE_PRESSED
    } else {
        Duration::ZERO
    };
    let text = state
        .metrics_page
        .text(arrived, stale_ok, || render(&state))
        .await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// How old a page may be served while the instance sheds.
const PAGE_STALE_WHILE_PRESSED: Duration = Duration::from_secs(1);

/// Every series, with the pools' and the limits' gauges read now.
fn render(state: &AppState) -> String {
    let usage = state.seckill.pool_usage();
    metrics::gauge!("seckill_pool_connections", "pool" => "postgres", "state" => "open")
        .set(f64::from(usage.postgres_size));
    metrics::gauge!("seckill_pool_connections", "pool" => "postgres", "state" => "idle")
        .set(f64::from(usage.postgres_idle));
    metrics::gauge!("seckill_pool_connections", "pool" => "redis", "state" => "open")
        .set(f64::from(usage.redis_open));
    metrics::gauge!("seckill_pool_connections", "pool" => "postgres_other", "state" => "open")
        .set(f64::from(usage.other_size));
    metrics::gauge!("seckill_pool_connections", "pool" => "postgres_other", "state" => "idle")
        .set(f64::from(usage.other_idle));
    let (addresses, users) = state.limits.keys();
    metrics::gauge!("seckill_rate_limit_keys", "limit" => "address").set(addresses as f64);
    metrics::gauge!("seckill_rate_limit_keys", "limit" => "user").set(users as f64);
    state.metrics.render()
}

/// A method as a label: the standard ones by name, anything else `other`,
/// so that no client can add a series (a method may be any token).
pub fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    KNOWN
        .iter()
        .find(|known| *known == method)
        .map_or("other", |known| known.as_str())
}

/// Counts every request by route, method and status, and times it. Every
/// label comes from a bounded set: matched routes, known methods, status
/// codes.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("http_requests_total", "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!("http_request_duration_seconds", "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}
