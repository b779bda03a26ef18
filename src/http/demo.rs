//! The demo's routes, served only by `serve --demo` (elsewhere `404`, as
//! any unknown route): a fresh user and token for the storefront's
//! sign-in button, and the demo payment provider, which signs a
//! notification with the payment secret as a provider would and hands the
//! signed bytes to the same `/payments/notify` handling.

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::Json;
use chrono::Utc;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{NoBody, OrderIdPath, User};
use super::lifecycle::{self, signature_header, PaymentReceipt};
use super::responses::{OrderNotFound, TooLarge, Unauthorized, Unavailable};
use super::state::AppState;
use crate::seckill::SeckillError;

/// How long a demo user's token lasts.
const DEMO_TOKEN_SECONDS: i64 = 86_400;
/// Demo users' ids are drawn from `[FIRST_DEMO_USER, 2^53)`: above any id a
/// load test mints, and exact as a JavaScript number.
const FIRST_DEMO_USER: i64 = 1 << 32;
const LAST_DEMO_USER: i64 = (1 << 53) - 1;

/// The service runs with `--demo`; else the route answers `404`, as an
/// unknown one, before anything else of the request is looked at (its
/// token, its id, its body).
pub struct Demo;

impl FromRequestParts<AppState> for Demo {
    type Rejection = ApiError;

    async fn from_request_parts(_: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if state.demo {
            Ok(Self)
        } else {
            Err(ApiError::NotFound("no such route".into()))
        }
    }
}

/// A fresh demo user.
#[derive(Serialize, ToSchema)]
pub struct DemoUser {
    #[schema(minimum = 4294967296_i64, maximum = 9007199254740991_i64)]
    user_id: i64,
    /// A signed user token, valid for a day: `Authorization: Bearer <token>`.
    token: String,
}

#[utoipa::path(
    post, path = "/demo/users", tag = "demo",
    responses(
        (status = 200, description = "A fresh user (a random id of 2^32 to 2^53 - 1: two demo users share one with a chance of one in 2^52) and a token for a day", body = DemoUser),
        (status = 400, description = "bad_request: a body", body = ErrorBody),
        (status = 404, description = "not_found: the service does not run with --demo", body = ErrorBody),
        TooLarge,
    )
)]
pub async fn new_user(
    State(state): State<AppState>,
    _: Demo,
    NoBody: NoBody,
) -> Result<Json<DemoUser>, ApiError> {
    let user_id = rand::random_range(FIRST_DEMO_USER..=LAST_DEMO_USER);
    let expires = Utc::now().timestamp() + DEMO_TOKEN_SECONDS;
    Ok(Json(DemoUser {
        user_id,
        token: state.auth.v1().sign(user_id, expires),
    }))
}

#[utoipa::path(
    post, path = "/demo/orders/{order_id}/pay", tag = "demo",
    params(OrderIdPath),
    security(("user" = [])),
    responses(
        (status = 200, description = "What /payments/notify answered the demo provider's signed notification: the voucher's price times the order's units, payment id demo-<order_id> (one payment per order, so paying again is the same delivery again)", body = PaymentReceipt),
        (status = 400, description = "bad_request: a malformed id, or a body", body = ErrorBody),
        Unauthorized,
        (status = 403, description = "forbidden: no payment secret is configured", body = ErrorBody),
        OrderNotFound,
        (status = 404, description = "not_found: no such order or another user's, or the service does not run with --demo", body = ErrorBody),
        (status = 409, description = "order_pending: an async order not stored yet (Retry-After is set)", body = ErrorBody),
        TooLarge, Unavailable,
    )
)]
pub async fn pay(
    State(state): State<AppState>,
    _: Demo,
    User(user_id): User,
    OrderIdPath(order_id): OrderIdPath,
    NoBody: NoBody,
) -> Result<Json<PaymentReceipt>, ApiError> {
    let order = state.seckill.order(order_id).await?;
    if order.user_id != user_id {
        // As GET /orders/{id}: another's order looks like none.
        return Err(ApiError::NotFound("order not found".into()));
    }
    let voucher = state.seckill.voucher(order.voucher_id).await?;
    let amount_cents = voucher
        .terms
        .price_cents
        .saturating_mul(i64::from(order.quantity));
    let body = serde_json::json!({
        "payment_id": format!("demo-{order_id}"),
        "order_id": order_id.to_string(),
        "amount_cents": amount_cents,
    })
    .to_string();
    let Some(secret) = state.payment_secret.as_deref() else {
        return Err(ApiError::Forbidden);
    };
    let mut headers = HeaderMap::new();
    let signature = HeaderValue::from_str(&signature_header(secret, body.as_bytes()))
        .map_err(|_| ApiError::Seckill(SeckillError::internal("a signature that is no header")))?;
    headers.insert(lifecycle::SIGNATURE_HEADER, signature);
    lifecycle::notify(State(state.clone()), headers, Body::from(body)).await
}
