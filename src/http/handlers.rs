//! The API's handlers: parse, make one service call, shape the answer. Each
//! one's `#[utoipa::path]` is its entry in `/openapi.json` (see `openapi`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{rfc3339, Admin, AppJson, Caller, NoBody, OrderIdPath, User, VoucherIdPath};
use super::queue::QUEUE_TICKET;
use super::AppState;
use crate::seckill::{
    Order, OrderStatus, Purchase, SaleMode, Voucher, VoucherDraft, DEFAULT_MAX_ORDERS_PER_USER,
    DEFAULT_PAY_WITHIN_SECONDS,
};

/// Most tokens one `POST /admin/tokens` may mint.
pub const MAX_TOKENS_PER_CALL: usize = 10_000;
const DEFAULT_TOKEN_TTL_SECS: i64 = 86_400;
const MAX_TOKEN_TTL_SECS: i64 = 30 * 86_400;

/// A flash sale to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVoucher {
    /// 1 to 200 characters, no control characters.
    #[schema(min_length = 1, max_length = 200, example = "Half-price coffee")]
    title: String,
    /// Units on sale.
    #[schema(minimum = 0, maximum = 2147483647, example = 100)]
    stock: i64,
    /// Strict RFC 3339, years 0000 to 9999 in UTC.
    #[serde(deserialize_with = "rfc3339")]
    #[schema(value_type = String, format = DateTime, example = "2030-05-01T10:00:00Z")]
    begin_time: DateTime<Utc>,
    /// After `begin_time`, to the microsecond.
    #[serde(deserialize_with = "rfc3339")]
    #[schema(value_type = String, format = DateTime, example = "2030-05-01T11:00:00Z")]
    end_time: DateTime<Utc>,
    /// `sync` (the default): the order is committed to Postgres before
    /// the answer (200); `async`: Redis accepts it (202, `pending`) and the
    /// stream writers commit it.
    #[serde(default)]
    sale_mode: SaleMode,
    /// What one unit costs; a payment must bring exactly this (default 0).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 9007199254740991.0, example = 990)]
    price_cents: i64,
    /// How long a buyer has to pay, from the order's creation (default
    /// 900); an unpaid order then expires and its unit goes back on sale.
    #[serde(default = "default_pay_within")]
    #[schema(minimum = 1, maximum = 86400, example = 900)]
    pay_within_seconds: i64,
    /// Most orders one user may have of this voucher, live, cancelled and
    /// expired together (default 3): past it a purchase is
    /// `too_many_orders`, so nobody holds a unit away by buying and
    /// cancelling again and again.
    #[serde(default = "default_max_orders")]
    #[schema(minimum = 1, maximum = 1000, example = 3)]
    max_orders_per_user: i64,
    /// A waiting room in front of the sale: a purchase then needs an
    /// admitted `X-Queue-Ticket` (absent: no room).
    #[serde(default)]
    waiting_room: Option<WaitingRoom>,
}

/// A voucher's waiting room.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitingRoom {
    /// Places admitted per second, across all instances together.
    #[schema(minimum = 1, maximum = 100000, example = 50)]
    admit_per_second: i64,
    /// Proof of work a join asks for: zero bits of SHA-256 (0, the
    /// default: none). See `X-Queue-Proof`.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 32, example = 0)]
    proof_of_work_bits: i64,
}

fn default_pay_within() -> i64 {
    DEFAULT_PAY_WITHIN_SECONDS
}

fn default_max_orders() -> i64 {
    DEFAULT_MAX_ORDERS_PER_USER
}

/// A created voucher's id.
#[derive(Serialize, ToSchema)]
pub struct Created {
    id: i64,
}

#[utoipa::path(
    post,
    path = "/admin/vouchers",
    tag = "admin",
    request_body = CreateVoucher,
    security(("admin" = [])),
    responses(
        (status = 201, description = "Created", body = Created),
        (status = 400, description = "bad_request: a malformed body or field", body = ErrorBody),
        (status = 403, description = "forbidden: no admin token", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable: Postgres cannot be reached", body = ErrorBody),
    )
)]
pub async fn create_voucher(
    State(state): State<AppState>,
    _: Admin,
    AppJson(body): AppJson<CreateVoucher>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let id = state
        .seckill
        .create_voucher(VoucherDraft {
            title: body.title,
            stock: body.stock,
            begin_time: body.begin_time,
            end_time: body.end_time,
            sale_mode: body.sale_mode,
            price_cents: body.price_cents,
            pay_within_seconds: body.pay_within_seconds,
            max_orders_per_user: body.max_orders_per_user,
            admit_per_second: body.waiting_room.as_ref().map(|room| room.admit_per_second),
            queue_proof_bits: body
                .waiting_room
                .as_ref()
                .map_or(0, |room| room.proof_of_work_bits),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(Created { id })))
}

/// A voucher and its remaining stock.
#[derive(Serialize, ToSchema)]
pub struct VoucherBody {
    id: i64,
    title: String,
    /// Units left.
    #[schema(minimum = 0)]
    stock: i32,
    #[schema(value_type = String, format = DateTime)]
    begin_time: DateTime<Utc>,
    #[schema(value_type = String, format = DateTime)]
    end_time: DateTime<Utc>,
    sale_mode: SaleMode,
    #[schema(minimum = 0)]
    price_cents: i64,
    #[schema(minimum = 1, maximum = 86400)]
    pay_within_seconds: i32,
    #[schema(minimum = 1, maximum = 1000)]
    max_orders_per_user: i32,
    /// The voucher's waiting room; null when it has none.
    waiting_room: Option<WaitingRoom>,
}

impl From<Voucher> for VoucherBody {
    fn from(v: Voucher) -> Self {
        Self {
            id: v.id,
            title: v.title,
            stock: v.stock,
            begin_time: v.begin_time,
            end_time: v.end_time,
            sale_mode: v.sale_mode,
            price_cents: v.price_cents,
            pay_within_seconds: v.pay_within_seconds,
            max_orders_per_user: v.max_orders_per_user,
            waiting_room: v.admit_per_second.map(|rate| WaitingRoom {
                admit_per_second: i64::from(rate),
                proof_of_work_bits: i64::from(v.queue_proof_bits),
            }),
        }
    }
}

#[utoipa::path(
    get,
    path = "/vouchers/{id}",
    tag = "sale",
    params(("id" = i64, Path, minimum = 1, description = "The voucher id")),
    responses(
        (status = 200, description = "The voucher", body = VoucherBody),
        (status = 400, description = "bad_request: a malformed id", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    )
)]
pub async fn get_voucher(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<VoucherBody>, ApiError> {
    Ok(Json(state.seckill.voucher(id).await?.into()))
}

/// Units to add to a voucher.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    #[schema(minimum = 1, maximum = 2147483647, example = 10)]
    add: i64,
}

#[utoipa::path(
    post,
    path = "/admin/vouchers/{id}/stock",
    tag = "admin",
    params(("id" = i64, Path, minimum = 1, description = "The voucher id")),
    request_body = Restock,
    security(("admin" = [])),
    responses(
        (status = 200, description = "The voucher after the restock; the sale reopens on every instance", body = VoucherBody),
        (status = 400, description = "bad_request", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    )
)]
pub async fn restock(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
    AppJson(body): AppJson<Restock>,
) -> Result<Json<VoucherBody>, ApiError> {
    Ok(Json(state.seckill.restock(id, body.add).await?.into()))
}

#[utoipa::path(
    post,
    path = "/admin/vouchers/{id}/reconcile",
    tag = "admin",
    params(("id" = i64, Path, minimum = 1, description = "The voucher id (an async sale)")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "Redis's stock and buyers rebuilt from Postgres and the unwritten stream entries; the orders Postgres refused are listed", body = ReconcileBody),
        (status = 400, description = "bad_request: a malformed id, or a sync voucher", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable: Postgres or Redis cannot be reached, or a reconciliation started later took over (it reopens the sale; ask again for the result)", body = ErrorBody),
    )
)]
pub async fn reconcile(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
    NoBody: NoBody,
) -> Result<Json<ReconcileBody>, ApiError> {
    let done = state.seckill.reconcile(id).await?;
    Ok(Json(ReconcileBody {
        voucher_id: done.voucher_id,
        stock: done.stock,
        pending: done.pending,
        buyers: done.buyers,
        unstored: done
            .unstored
            .into_iter()
            .map(|u| UnstoredBody {
                order_id: u.order_id,
                reason: u.reason,
            })
            .collect(),
    }))
}

/// What a reconciliation found and set.
#[derive(Serialize, ToSchema)]
pub struct ReconcileBody {
    voucher_id: i64,
    /// The stock Redis sells from now: Postgres's, less the accepted
    /// orders still waiting to be written.
    stock: i64,
    /// Accepted orders not yet in Postgres.
    pending: usize,
    /// Users recorded as buyers (stored or pending).
    buyers: usize,
    /// Orders Redis accepted and Postgres refused, with the reason.
    unstored: Vec<UnstoredBody>,
}

/// An accepted order that Postgres refused.
#[derive(Serialize, ToSchema)]
pub struct UnstoredBody {
    order_id: String,
    /// `sold_out`, `already_purchased` or `id_taken`.
    reason: String,
}

/// Users to mint tokens for.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MintTokens {
    #[schema(min_items = 1, max_items = 10000, value_type = Vec<i64>)]
    user_ids: Vec<i64>,
    /// Lifetime of the tokens: 1 s to 30 days (default a day).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    ttl_seconds: Option<i64>,
}

/// A user's token.
#[derive(Serialize, ToSchema)]
pub struct UserToken {
    user_id: i64,
    token: String,
}

/// Tokens, in the order of the ids asked for.
#[derive(Serialize, ToSchema)]
pub struct Tokens {
    tokens: Vec<UserToken>,
}

#[utoipa::path(
    post,
    path = "/admin/tokens",
    tag = "admin",
    request_body = MintTokens,
    security(("admin" = [])),
    responses(
        (status = 200, description = "Signed user tokens", body = Tokens),
        (status = 400, description = "bad_request", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
    )
)]
pub async fn mint_tokens(
    State(state): State<AppState>,
    _: Admin,
    AppJson(body): AppJson<MintTokens>,
) -> Result<Json<Tokens>, ApiError> {
    if body.user_ids.is_empty() || body.user_ids.len() > MAX_TOKENS_PER_CALL {
        return Err(ApiError::BadRequest(format!(
            "user_ids must hold 1 to {MAX_TOKENS_PER_CALL} ids"
        )));
    }
    if let Some(bad) = body.user_ids.iter().find(|id| **id <= 0) {
        return Err(ApiError::BadRequest(format!(
            "user id {bad} is not positive"
        )));
    }
    let ttl = body.ttl_seconds.unwrap_or(DEFAULT_TOKEN_TTL_SECS);
    if !(1..=MAX_TOKEN_TTL_SECS).contains(&ttl) {
        return Err(ApiError::BadRequest(format!(
            "ttl_seconds must be between 1 and {MAX_TOKEN_TTL_SECS}"
        )));
    }
    let expires = Utc::now().timestamp() + ttl;
    let tokens = body
        .user_ids
        .iter()
        .map(|&user_id| UserToken {
            user_id,
            token: state.tokens.sign(user_id, expires),
        })
        .collect();
    Ok(Json(Tokens { tokens }))
}

/// A committed order's id, as a decimal string (it exceeds 2^53).
#[derive(Serialize, ToSchema)]
pub struct Purchased {
    #[schema(pattern = "^[1-9][0-9]{0,18}$", example = "669711463081050113")]
    order_id: String,
}

/// An async sale's order that Redis accepted; `GET /orders/{id}` says
/// `pending` until it is in Postgres, then `unpaid` (or later).
#[derive(Serialize, ToSchema)]
pub struct Accepted {
    #[schema(pattern = "^[1-9][0-9]{0,18}$", example = "669711463081050113")]
    order_id: String,
    status: OrderStatus,
}

#[utoipa::path(
    post,
    path = "/seckill/{voucher_id}",
    tag = "sale",
    params(
        ("voucher_id" = i64, Path, minimum = 1, description = "The voucher to buy one unit of"),
        ("X-Queue-Ticket" = Option<String>, Header, description = "With a waiting room: the admitted ticket of this user and voucher"),
    ),
    security(("user" = [])),
    responses(
        (status = 200, description = "The order is committed (sync sale)", body = Purchased),
        (status = 202, description = "Redis accepted the order; it is pending until written (async sale)", body = Accepted),
        (status = 400, description = "bad_request: a malformed id, a body, several Authorization headers", body = ErrorBody),
        (status = 401, description = "unauthorized: a missing, malformed, forged or expired token", body = ErrorBody),
        (status = 404, description = "not_found: no such voucher", body = ErrorBody),
        (status = 403, description = "not_admitted: the voucher has a waiting room and X-Queue-Ticket is missing, forged, another user's or voucher's, not admitted yet, or past admitted_until", body = ErrorBody),
        (status = 409, description = "not_started, ended, sold_out, already_purchased (with the user's order_id), or too_many_orders (the user has max_orders_per_user orders of this voucher)", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 429, description = "purchase_in_progress: another request of this user for this voucher is in flight; rate_limited: the user or the client address is over its limit (Retry-After is set)", body = ErrorBody),
        (status = 503, description = "unavailable: Postgres or Redis cannot be reached, or an async sale is paused until reconciled; Retry-After is set", body = ErrorBody),
    )
)]
pub async fn seckill(
    State(state): State<AppState>,
    User(user_id): User,
    VoucherIdPath(voucher_id): VoucherIdPath,
    headers: HeaderMap,
    NoBody: NoBody,
) -> Result<Response, ApiError> {
    let ticket = headers
        .get(QUEUE_TICKET)
        .and_then(|value| value.to_str().ok());
    Ok(
        match state.seckill.purchase(user_id, voucher_id, ticket).await? {
            Purchase::Stored(order_id) => Json(Purchased {
                order_id: order_id.to_string(),
            })
            .into_response(),
            Purchase::Pending(order_id) => (
                StatusCode::ACCEPTED,
                Json(Accepted {
                    order_id: order_id.to_string(),
                    status: OrderStatus::Pending,
                }),
            )
                .into_response(),
        },
    )
}

/// An order.
#[derive(Serialize, ToSchema)]
pub struct OrderBody {
    #[schema(pattern = "^[1-9][0-9]{0,18}$")]
    order_id: String,
    user_id: i64,
    voucher_id: i64,
    #[schema(value_type = String, format = DateTime)]
    created_at: DateTime<Utc>,
    /// `pending` (async: accepted, not yet stored), `unpaid`, `paid`,
    /// `cancelled` or `expired`.
    status: OrderStatus,
    /// The payment deadline; null while `pending`.
    #[schema(value_type = Option<String>, format = DateTime)]
    pay_by: Option<DateTime<Utc>>,
    /// When it was paid; null until then.
    #[schema(value_type = Option<String>, format = DateTime)]
    paid_at: Option<DateTime<Utc>>,
}

impl From<Order> for OrderBody {
    fn from(o: Order) -> Self {
        Self {
            order_id: o.id.to_string(),
            user_id: o.user_id,
            voucher_id: o.voucher_id,
            created_at: o.created_at,
            status: o.status,
            pay_by: o.pay_by,
            paid_at: o.paid_at,
        }
    }
}

#[utoipa::path(
    get,
    path = "/orders/{order_id}",
    tag = "sale",
    params(("order_id" = String, Path, pattern = "^[1-9][0-9]{0,18}$", description = "The order id, in decimal")),
    security(("user" = []), ("admin" = [])),
    responses(
        (status = 200, description = "The order (a user sees only their own)", body = OrderBody),
        (status = 400, description = "bad_request", body = ErrorBody),
        (status = 401, description = "unauthorized", body = ErrorBody),
        (status = 404, description = "not_found: no such order, or another user's", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    )
)]
pub async fn get_order(
    State(state): State<AppState>,
    caller: Caller,
    OrderIdPath(order_id): OrderIdPath,
) -> Result<Json<OrderBody>, ApiError> {
    let order = state.seckill.order(order_id).await?;
    match caller {
        Caller::User(user_id) if user_id != order.user_id => {
            // Someone else's order looks like no order at all: ids are
            // guessable, their existence is not to be confirmed.
            Err(ApiError::NotFound("order not found".into()))
        }
        _ => Ok(Json(order.into())),
    }
}

/// One order of a voucher.
#[derive(Serialize, ToSchema)]
pub struct OrderLine {
    #[schema(pattern = "^[1-9][0-9]{0,18}$")]
    order_id: String,
    user_id: i64,
    status: OrderStatus,
}

/// Every order of a voucher, oldest first.
#[derive(Serialize, ToSchema)]
pub struct Orders {
    orders: Vec<OrderLine>,
}

#[utoipa::path(
    get,
    path = "/admin/vouchers/{id}/orders",
    tag = "admin",
    params(("id" = i64, Path, minimum = 1, description = "The voucher id")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The voucher's orders", body = Orders),
        (status = 400, description = "bad_request", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    )
)]
pub async fn voucher_orders(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<Orders>, ApiError> {
    let orders = state
        .seckill
        .orders_for_voucher(id)
        .await?
        .into_iter()
        .map(|line| OrderLine {
            order_id: line.id.to_string(),
            user_id: line.user_id,
            status: line.status,
        })
        .collect();
    Ok(Json(Orders { orders }))
}

/// A voucher's books, one snapshot: `stock + pending + unpaid + paid =
/// initial_stock` always.
#[derive(Serialize, ToSchema)]
pub struct StatsBody {
    initial_stock: i32,
    /// Units still for sale (an async sale's pending orders taken off).
    stock: i64,
    /// Live orders: `unpaid` + `paid`.
    orders: i64,
    /// The users of the live orders.
    distinct_users: i64,
    /// Async: accepted by Redis, not yet stored.
    pending: i64,
    unpaid: i64,
    paid: i64,
    cancelled: i64,
    expired: i64,
    /// The voucher's bound on orders per user (live, cancelled, expired).
    max_orders_per_user: i32,
}

#[utoipa::path(
    get,
    path = "/admin/vouchers/{id}/stats",
    tag = "admin",
    params(("id" = i64, Path, minimum = 1, description = "The voucher id")),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The voucher's books", body = StatsBody),
        (status = 400, description = "bad_request", body = ErrorBody),
        (status = 403, description = "forbidden", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "payload_too_large", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    )
)]
pub async fn voucher_stats(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<StatsBody>, ApiError> {
    let stats = state.seckill.stats(id).await?;
    Ok(Json(StatsBody {
        initial_stock: stats.initial_stock,
        stock: stats.stock,
        orders: stats.unpaid + stats.paid,
        distinct_users: stats.distinct_users,
        pending: stats.pending,
        unpaid: stats.unpaid,
        paid: stats.paid,
        cancelled: stats.cancelled,
        expired: stats.expired,
        max_orders_per_user: stats.max_orders_per_user,
    }))
}
