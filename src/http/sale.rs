//! The sale's handlers (a voucher read, a purchase, an order): parse, make
//! one service call, shape the answer. Each one's `#[utoipa::path]` is its
//! entry in `/openapi.json` (see `openapi`); the admin's are in `admin`.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::cache::{cacheable, Tag};
use super::error::{ApiError, ErrorBody};
use super::extract::{header_text, Caller, MaybeJson, OrderIdPath, User, VoucherIdPath};
use super::queue::QUEUE_TICKET;
use super::responses::{BadRequest, NotFound, OrderNotFound, TooLarge, Unauthorized, Unavailable};
use super::state::AppState;
use crate::domain::{OrderStatus, SaleMode, Voucher};
use crate::events::body::OrderBody;
use crate::seckill::{Purchase, PurchaseError, Refusal, WaitingRoom};

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
    /// Most units one order may take.
    #[schema(minimum = 1, maximum = 100)]
    max_units_per_user: i32,
    /// The voucher's waiting room; null when it has none.
    waiting_room: Option<WaitingRoom>,
}

impl From<Voucher> for VoucherBody {
    fn from(v: Voucher) -> Self {
        let terms = v.terms;
        Self {
            id: v.id.get(),
            title: terms.title,
            stock: v.level.stock,
            begin_time: terms.begin_time,
            end_time: terms.end_time,
            sale_mode: terms.sale_mode,
            price_cents: terms.price_cents,
            pay_within_seconds: terms.pay_within_seconds,
            max_orders_per_user: terms.max_orders_per_user,
            max_units_per_user: terms.max_units_per_user,
            waiting_room: terms.admit_per_second.map(|rate| WaitingRoom {
                admit_per_second: i64::from(rate),
                proof_of_work_bits: i64::from(terms.queue_proof_bits),
            }),
        }
    }
}

#[utoipa::path(
    get, path = "/vouchers/{id}", tag = "sale",
    params(
        VoucherIdPath,
        ("If-None-Match" = Option<String>, Header, description = "An ETag of an earlier answer: 304 if it is still current"),
    ),
    responses(
        (status = 200, description = "The voucher; cacheable for a second (`Cache-Control`, `ETag`)", body = VoucherBody),
        (status = 304, description = "Not modified: the `If-None-Match` tag is current"),
        (status = 400, description = "bad_request: a malformed id", body = ErrorBody),
        NotFound, TooLarge, Unavailable,
    )
)]
pub async fn get_voucher(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let body = VoucherBody::from(state.seckill.voucher(id).await?);
    Ok(cacheable(&headers, &body, Tag::Whole))
}

/// The vouchers whose sale has not ended, and the server's clock.
#[derive(Serialize, ToSchema)]
pub struct VoucherList {
    /// The server's time when it answered: a page counts down to a sale's
    /// start on this clock, not on the browser's.
    #[schema(value_type = String, format = DateTime)]
    server_time: DateTime<Utc>,
    /// On sale first, then coming, each by its start; at most 200 (as
    /// rendered once per list: see [`Listing`](super::cache::Listing)).
    #[schema(value_type = Vec<VoucherBody>)]
    vouchers: Box<serde_json::value::RawValue>,
}

#[utoipa::path(
    get, path = "/vouchers", tag = "sale",
    params(
        ("If-None-Match" = Option<String>, Header, description = "An ETag of an earlier answer: 304 if its vouchers are still current"),
    ),
    responses(
        (status = 200, description = "The vouchers on sale and coming, at most a second stale; cacheable for a second (`Cache-Control`, a weak `ETag` of the vouchers)", body = VoucherList),
        (status = 304, description = "Not modified: the `If-None-Match` tag is current"),
        TooLarge, Unavailable,
    )
)]
pub async fn list_vouchers(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let listed = state.seckill.vouchers_on_offer().await?;
    let (vouchers, etag) = state
        .listing
        .rendered(&listed, |vouchers| {
            vouchers
                .iter()
                .cloned()
                .map(VoucherBody::from)
                .collect::<Vec<_>>()
        })
        .map_err(|error| {
            ApiError::Seckill(crate::seckill::SeckillError::internal(format!(
                "serializing the vouchers: {error}"
            )))
        })?;
    let body = VoucherList {
        server_time: Utc::now(),
        vouchers,
    };
    Ok(cacheable(&headers, &body, Tag::Weak(etag)))
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

/// What a purchase may ask: how many units (no body, or `{}`: one).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    /// Units to buy, all or none: 1 to the voucher's `max_units_per_user`
    /// (absent: one; `null` is refused, as any other non-number).
    #[serde(default = "one_unit")]
    #[schema(minimum = 1, maximum = 100, default = 1, example = 1)]
    quantity: i64,
}

fn one_unit() -> i64 {
    1
}

#[utoipa::path(
    post, path = "/seckill/{voucher_id}", tag = "sale",
    request_body(content = Option<PurchaseBody>, description = "Optional: the units to buy (no body: one)"),
    params(
        ("voucher_id" = i64, Path, minimum = 1, description = "The voucher to buy units of"),
        ("X-Queue-Ticket" = Option<String>, Header, description = "With a waiting room: the admitted ticket of this user and voucher"),
    ),
    security(("user" = [])),
    operation_id = "seckill",
    responses(
        (status = 200, description = "The order is committed (sync sale)", body = Purchased),
        (status = 202, description = "Redis accepted the order; it is pending until written (async sale)", body = Accepted),
        (status = 400, description = "bad_request: a malformed id or body, a quantity outside 1 to the voucher's max_units_per_user, several Authorization headers", body = ErrorBody),
        (status = 401, description = "unauthorized: a missing, malformed, forged or expired token", body = ErrorBody),
        (status = 404, description = "not_found: no such voucher", body = ErrorBody),
        (status = 403, description = "not_admitted: the voucher has a waiting room and X-Queue-Ticket is missing, forged, another user's or voucher's, not admitted yet, or past admitted_until", body = ErrorBody),
        (status = 409, description = "not_started, ended, sold_out (no unit left), not_enough_stock (fewer units left than asked; with the units left as stock), already_purchased (with the user's order_id), or too_many_orders (the user has max_orders_per_user orders of this voucher)", body = ErrorBody),
        TooLarge,
        (status = 429, description = "purchase_in_progress: another request of this user for this voucher is in flight; rate_limited: the user or the client address is over its limit (Retry-After is set)", body = ErrorBody),
        (status = 503, description = "unavailable: Postgres or Redis cannot be reached, or an async sale is paused until reconciled; Retry-After is set", body = ErrorBody),
    )
)]
pub async fn purchase(
    State(state): State<AppState>,
    User(user_id): User,
    VoucherIdPath(voucher_id): VoucherIdPath,
    headers: HeaderMap,
    MaybeJson(body): MaybeJson<PurchaseBody>,
) -> Result<Response, ApiError> {
    let ticket = header_text(&headers, QUEUE_TICKET);
    let quantity = body.map(|body| body.quantity);
    let bought = state
        .seckill
        .purchase(user_id, voucher_id, quantity, ticket)
        .await;
    if let Err(PurchaseError::Refused(Refusal::AlreadyPurchased { .. })) = &bought {
        // A buyer who asks again for what it holds is told at once, unless
        // the instance is shedding: then, as any refusal, after the
        // refusals' delay (a bot asking again on every connection is
        // slowed; the answer costs a timer, not a core).
        state.shedder.hold_while_pressed().await;
    }
    Ok(match bought? {
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
    })
}

#[utoipa::path(
    get, path = "/orders/{order_id}", tag = "sale",
    params(OrderIdPath),
    security(("user" = []), ("admin" = [])),
    responses(
        (status = 200, description = "The order (a user sees only their own)", body = OrderBody),
        BadRequest, Unauthorized,
        OrderNotFound,
        TooLarge, Unavailable,
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
