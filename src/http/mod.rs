//! HTTP: routes, middleware and the shared state of the handlers. The only
//! module that knows axum; it calls the `seckill` service and nothing below.

mod admin;
mod cache;
mod demo;
mod error;
mod events;
mod extract;
mod lifecycle;
pub mod limit;
mod monitor;
pub mod openapi;
pub mod ops;
mod queue;
mod responses;
mod routes;
mod sale;
mod screen;
pub mod serve;
pub mod shed;
mod shop;
pub mod starting;
mod state;
mod tally;

use std::any::Any;

use axum::extract::{MatchedPath, Request};
use axum::http::Response;
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

pub use error::ApiError;
pub use extract::{voucher_id, Admin, AdminToken, AppJson, User, VoucherIdPath};
pub use lifecycle::signature_header;
pub use limit::{Limits, RouteClass};
pub use state::{AppParts, AppState};
pub use tally::Monitor;

use screen::REQUEST_ID;

use crate::seckill::SeckillError;

/// The whole API as a router (`routes.rs` declares it), with `mounted`'s
/// routes beside the service's own (a crate built on the service, like the
/// lab, brings them, with each path's class) behind the same middleware; a
/// request body that takes longer than
/// `body_timeout` to arrive, counted from its headers, fails.
pub fn router(
    state: AppState,
    body_timeout: std::time::Duration,
    mounted: Option<routes::Mounted>,
) -> Router {
    let routes::Table {
        router: api,
        admin,
        classes,
    } = routes::table(state.public_metrics, mounted);
    let admin = admin.route_layer(middleware::from_extractor_with_state::<extract::Admin, _>(
        state.clone(),
    ));
    let api = api
        .merge(admin)
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state.clone());

    let trace = TraceLayer::new_for_http()
        .make_span_with(|request: &Request| {
            let route = request
                .extensions()
                .get::<MatchedPath>()
                .map_or("unmatched", MatchedPath::as_str);
            let request_id = request
                .headers()
                .get(&REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let method = ops::method_label(request.method());
            tracing::info_span!("request", method, route, request_id)
        })
        .on_request(())
        .on_response(DefaultOnResponse::new().level(Level::DEBUG));

    // Innermost first. The user's limit refuses before a route does any
    // work; the shedder, when the instance is saturated, before anything
    // but the address's limit, which refuses before anything at all (its
    // refusals are counted in seckill_rate_limited_total, and by the sale
    // monitor's count of purchase answers, only); outermost,
    // the route table classifies the request for all three.
    api.layer(middleware::from_fn(screen::screen))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limit::limit_user::<AppState>,
        ))
        .layer(middleware::from_fn(ops::track))
        .layer(
            ServiceBuilder::new()
                .layer(middleware::from_fn(screen::sanitize_request_id))
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(trace)
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                .layer(CatchPanicLayer::custom(panic_response))
                .layer(middleware::from_fn_with_state(
                    body_timeout,
                    screen::body_deadline,
                )),
        )
        .layer(middleware::from_fn_with_state(
            state.clone(),
            shed::shed::<AppState>,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limit::limit_address::<AppState>,
        ))
        // Outside the limits, so that the sale monitor counts their
        // refusals of purchases too.
        .layer(middleware::from_fn_with_state(
            state,
            tally::record::<AppState>,
        ))
        .layer(middleware::from_fn_with_state(classes, routes::classify))
}

/// `/metrics` alone, for its own address (`SECKILL_METRICS_ADDR`).
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(ops::metrics))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// A panicking handler answers an opaque 500 in the app's error shape.
fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<axum::body::Body> {
    let cause = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    ApiError::Seckill(SeckillError::internal(format!("handler panicked: {cause}"))).into_response()
}

/// A request head of one header, `name: value`, for the modules' tests.
#[cfg(test)]
fn one_header(name: impl axum::http::header::IntoHeaderName, value: &str) -> axum::http::HeaderMap {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(name, axum::http::HeaderValue::from_str(value).unwrap());
    headers
}
