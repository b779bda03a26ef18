//! The API's handlers: parse, make one service call, shape the answer.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{rfc3339, Admin, AppJson, Caller, NoBody, OrderIdPath, User, VoucherIdPath};
use super::AppState;
use crate::seckill::{Order, Voucher, VoucherDraft};

/// Most tokens one `POST /admin/tokens` may mint.
pub const MAX_TOKENS_PER_CALL: usize = 10_000;
const DEFAULT_TOKEN_TTL_SECS: i64 = 86_400;
const MAX_TOKEN_TTL_SECS: i64 = 30 * 86_400;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVoucher {
    title: String,
    stock: i64,
    #[serde(deserialize_with = "rfc3339")]
    begin_time: DateTime<Utc>,
    #[serde(deserialize_with = "rfc3339")]
    end_time: DateTime<Utc>,
}

pub async fn create_voucher(
    State(state): State<AppState>,
    _: Admin,
    AppJson(body): AppJson<CreateVoucher>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = state
        .seckill
        .create_voucher(VoucherDraft {
            title: body.title,
            stock: body.stock,
            begin_time: body.begin_time,
            end_time: body.end_time,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

#[derive(Serialize)]
pub struct VoucherBody {
    id: i64,
    title: String,
    stock: i32,
    begin_time: DateTime<Utc>,
    end_time: DateTime<Utc>,
}

impl From<Voucher> for VoucherBody {
    fn from(v: Voucher) -> Self {
        Self {
            id: v.id,
            title: v.title,
            stock: v.stock,
            begin_time: v.begin_time,
            end_time: v.end_time,
        }
    }
}

pub async fn get_voucher(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<VoucherBody>, ApiError> {
    Ok(Json(state.seckill.voucher(id).await?.into()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    add: i64,
}

pub async fn restock(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
    AppJson(body): AppJson<Restock>,
) -> Result<Json<VoucherBody>, ApiError> {
    Ok(Json(state.seckill.restock(id, body.add).await?.into()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MintTokens {
    user_ids: Vec<i64>,
    #[serde(default)]
    ttl_seconds: Option<i64>,
}

pub async fn mint_tokens(
    State(state): State<AppState>,
    _: Admin,
    AppJson(body): AppJson<MintTokens>,
) -> Result<Json<Value>, ApiError> {
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
    let tokens: Vec<Value> = body
        .user_ids
        .iter()
        .map(|&user_id| json!({ "user_id": user_id, "token": state.tokens.sign(user_id, expires) }))
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

pub async fn seckill(
    State(state): State<AppState>,
    User(user_id): User,
    VoucherIdPath(voucher_id): VoucherIdPath,
    NoBody: NoBody,
) -> Result<Json<Value>, ApiError> {
    let order_id = state.seckill.purchase(user_id, voucher_id).await?;
    Ok(Json(json!({ "order_id": order_id.to_string() })))
}

#[derive(Serialize)]
pub struct OrderBody {
    order_id: String,
    user_id: i64,
    voucher_id: i64,
    created_at: DateTime<Utc>,
}

impl From<Order> for OrderBody {
    fn from(o: Order) -> Self {
        Self {
            order_id: o.id.to_string(),
            user_id: o.user_id,
            voucher_id: o.voucher_id,
            created_at: o.created_at,
        }
    }
}

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

pub async fn voucher_orders(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<Value>, ApiError> {
    let orders: Vec<Value> = state
        .seckill
        .orders_for_voucher(id)
        .await?
        .into_iter()
        .map(|(order_id, user_id)| json!({ "order_id": order_id.to_string(), "user_id": user_id }))
        .collect();
    Ok(Json(json!({ "orders": orders })))
}

pub async fn voucher_stats(
    State(state): State<AppState>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<Value>, ApiError> {
    let stats = state.seckill.stats(id).await?;
    Ok(Json(json!({
        "initial_stock": stats.initial_stock,
        "stock": stats.stock,
        "orders": stats.orders,
        "distinct_users": stats.distinct_users,
    })))
}
