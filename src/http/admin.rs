//! The admin API's handlers: vouchers created and restocked, async sales
//! reconciled, user tokens minted, a voucher's orders and books. Each
//! one's `#[utoipa::path]` is its entry in `/openapi.json`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{AppJson, NoBody, VoucherIdPath};
use super::responses::NotFound;
use super::sale::VoucherBody;
use super::state::AppState;
use crate::auth::MAX_NUMERIC_SUBJECT;
use crate::domain::OrderStatus;
use crate::seckill::VoucherDraft;

/// Most tokens one `POST /admin/tokens` may mint.
pub const MAX_TOKENS_PER_CALL: usize = 10_000;
const DEFAULT_TOKEN_TTL_SECS: i64 = 86_400;
const MAX_TOKEN_TTL_SECS: i64 = 30 * 86_400;

/// A created voucher's id.
#[derive(Serialize, ToSchema)]
pub struct Created {
    id: i64,
}

#[utoipa::path(
    post, path = "/admin/vouchers",
    request_body = VoucherDraft,
    responses(
        (status = 201, description = "Created", body = Created),
        (status = 400, description = "bad_request: a malformed body or field", body = ErrorBody),
        (status = 503, description = "unavailable: Postgres cannot be reached", body = ErrorBody),
    )
)]
pub async fn create_voucher(
    State(state): State<AppState>,
    AppJson(draft): AppJson<VoucherDraft>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let id = state.seckill.create_voucher(draft).await?;
    Ok((StatusCode::CREATED, Json(Created { id: id.get() })))
}

/// Units to add to a voucher.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    #[schema(minimum = 1, maximum = 2147483647, example = 10)]
    add: i64,
}

#[utoipa::path(
    post, path = "/admin/vouchers/{id}/stock",
    params(VoucherIdPath),
    request_body = Restock,
    responses(
        (status = 200, description = "The voucher after the restock; the sale reopens on every instance", body = VoucherBody),
        NotFound,
    )
)]
pub async fn restock(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
    AppJson(body): AppJson<Restock>,
) -> Result<Json<VoucherBody>, ApiError> {
    Ok(Json(state.seckill.restock(id, body.add).await?.into()))
}

#[utoipa::path(
    post, path = "/admin/vouchers/{id}/reconcile",
    params(("id" = i64, Path, minimum = 1, description = "The voucher id (an async sale)")),
    responses(
        (status = 200, description = "Redis's stock and buyers rebuilt from Postgres and the unwritten stream entries; the orders Postgres refused are listed", body = ReconcileBody),
        (status = 400, description = "bad_request: a malformed id, or a sync voucher", body = ErrorBody),
        NotFound,
        (status = 503, description = "unavailable: Postgres or Redis cannot be reached, or a reconciliation started later took over (it reopens the sale; ask again for the result)", body = ErrorBody),
    )
)]
pub async fn reconcile(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
    NoBody: NoBody,
) -> Result<Json<ReconcileBody>, ApiError> {
    let done = state.seckill.reconcile(id).await?;
    Ok(Json(ReconcileBody {
        voucher_id: done.voucher_id.get(),
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

/// A user id as the body of `POST /admin/tokens` lists it: a positive
/// integer up to 2^53 - 1 (ids above are those of the shop's non-numeric
/// subjects; described only, the body holds `i64`s, checked in the
/// handler).
struct UserIdValue;

impl utoipa::PartialSchema for UserIdValue {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .maximum(Some(MAX_NUMERIC_SUBJECT))
            .into()
    }
}

impl ToSchema for UserIdValue {}

/// Users to mint tokens for.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MintTokens {
    #[schema(min_items = 1, max_items = 10000, value_type = Vec<UserIdValue>)]
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
    post, path = "/admin/tokens",
    request_body = MintTokens,
    responses(
        (status = 200, description = "Signed user tokens", body = Tokens),
    )
)]
pub async fn mint_tokens(
    State(state): State<AppState>,
    AppJson(body): AppJson<MintTokens>,
) -> Result<Json<Tokens>, ApiError> {
    if body.user_ids.is_empty() || body.user_ids.len() > MAX_TOKENS_PER_CALL {
        return Err(ApiError::BadRequest(format!(
            "user_ids must hold 1 to {MAX_TOKENS_PER_CALL} ids"
        )));
    }
    if let Some(bad) = body
        .user_ids
        .iter()
        .find(|id| !(1..=MAX_NUMERIC_SUBJECT).contains(*id))
    {
        // Above 2^53 - 1 are the ids drawn for the shop's non-numeric
        // subjects: a token of the service's own must not name one.
        return Err(ApiError::BadRequest(format!(
            "user id {bad} is not between 1 and {MAX_NUMERIC_SUBJECT}"
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
            token: state.auth.v1().sign(user_id, expires),
        })
        .collect();
    Ok(Json(Tokens { tokens }))
}

/// One order of a voucher.
#[derive(Serialize, ToSchema)]
pub struct OrderLine {
    #[schema(pattern = "^[1-9][0-9]{0,18}$")]
    order_id: String,
    user_id: i64,
    status: OrderStatus,
    /// Units it holds.
    #[schema(minimum = 1, maximum = 100)]
    quantity: i32,
}

/// Every order of a voucher, oldest first.
#[derive(Serialize, ToSchema)]
pub struct Orders {
    orders: Vec<OrderLine>,
}

#[utoipa::path(
    get, path = "/admin/vouchers/{id}/orders",
    params(VoucherIdPath),
    responses(
        (status = 200, description = "The voucher's orders", body = Orders),
        NotFound,
    )
)]
pub async fn voucher_orders(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<Orders>, ApiError> {
    let orders = state
        .seckill
        .orders_for_voucher(id)
        .await?
        .into_iter()
        .map(|line| OrderLine {
            order_id: line.id.to_string(),
            user_id: line.user_id.get(),
            status: line.status,
            quantity: line.quantity,
        })
        .collect();
    Ok(Json(Orders { orders }))
}

/// A voucher's books, one snapshot: `stock + units = initial_stock`
/// always (with one unit per order, `stock + pending + unpaid + paid`).
#[derive(Serialize, ToSchema)]
pub struct StatsBody {
    initial_stock: i32,
    /// Units still for sale (an async sale's pending orders taken off).
    stock: i64,
    /// Live orders: `unpaid` + `paid`.
    orders: i64,
    /// Units of the live orders (an async sale's pending ones too).
    units: i64,
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
    get, path = "/admin/vouchers/{id}/stats",
    params(VoucherIdPath),
    responses(
        (status = 200, description = "The voucher's books", body = StatsBody),
        NotFound,
    )
)]
pub async fn voucher_stats(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<StatsBody>, ApiError> {
    let stats = state.seckill.stats(id).await?;
    Ok(Json(StatsBody {
        initial_stock: stats.initial_stock,
        stock: stats.stock,
        orders: stats.unpaid + stats.paid,
        units: stats.units,
        distinct_users: stats.distinct_users,
        pending: stats.pending,
        unpaid: stats.unpaid,
        paid: stats.paid,
        cancelled: stats.cancelled,
        expired: stats.expired,
        max_orders_per_user: stats.max_orders_per_user,
    }))
}
