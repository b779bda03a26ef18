//! The lab's routes (mounted only with `SECKILL_LAB=1`): create a lab
//! voucher, buy it with a named strategy, optionally stalled, and read what
//! the rows say afterwards.

use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{Attempt, Lab, LabOrder, Stall, StallAt, Strategy, MAX_STALL};
use seckill::http::{
    voucher_id, Admin, ApiError, AppJson, AppState, RouteClass, User, VoucherIdPath,
};

/// The lab's routes, for [`seckill::startup::Mount`]: each handler reaches
/// `lab` and, for who is signed in, the service's state.
pub fn routes(lab: Lab) -> Router<AppState> {
    Router::new()
        .route("/lab", get(info))
        .route("/lab/{strategy}/seckill/{id}", post(purchase))
        .route("/admin/lab/vouchers", post(create_voucher))
        .route("/admin/lab/vouchers/{id}/stats", get(stats))
        .layer(Extension(lab))
}

/// The class of each of the lab's paths: its purchases are limited and shed
/// as the sale's, its admin routes as the admin's.
pub fn classes() -> Vec<(String, RouteClass)> {
    [
        ("/lab", RouteClass::Ops),
        ("/lab/{strategy}/seckill/{id}", RouteClass::Purchase),
        ("/admin/lab/vouchers", RouteClass::Admin),
        ("/admin/lab/vouchers/{id}/stats", RouteClass::Admin),
    ]
    .map(|(path, class)| (path.to_owned(), class))
    .into()
}

/// `GET /lab`: the strategies and the lease of the lab's locks.
async fn info(Extension(lab): Extension<Lab>) -> Result<Json<Value>, ApiError> {
    let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
    Ok(Json(json!({
        "strategies": names,
        "lease_ms": u64::try_from(lab.lease().as_millis()).unwrap_or(u64::MAX),
        "stall_at": [StallAt::Sale.name(), StallAt::Release.name(), StallAt::Crash.name()],
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateLabVoucher {
    stock: i64,
}

async fn create_voucher(
    Extension(lab): Extension<Lab>,
    _: Admin,
    AppJson(body): AppJson<CreateLabVoucher>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = lab.create_voucher(body.stock).await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

async fn stats(
    Extension(lab): Extension<Lab>,
    _: Admin,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Json<Value>, ApiError> {
    let id = id.get();
    let stats = lab.stats(id).await?;
    // Stats come from Postgres; the Redis stock is null while Redis is away.
    let redis_stock = lab.redis_stock(id).await.ok().flatten();
    Ok(Json(json!({
        "redis_stock": redis_stock,
        "initial_stock": stats.initial_stock,
        "stock": stats.stock,
        "orders": stats.orders,
        "distinct_users": stats.distinct_users,
        "foreign_releases": stats.foreign_releases,
    })))
}

/// `/lab/{strategy}/seckill/{voucher_id}`, parsed.
struct LabPath {
    strategy: Strategy,
    voucher_id: i64,
}

impl<S: Send + Sync> FromRequestParts<S> for LabPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path((strategy, voucher)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
        let strategy = Strategy::from_name(&strategy).ok_or_else(|| {
            ApiError::NotFound(format!("no lab strategy {strategy:?}; GET /lab lists them"))
        })?;
        Ok(Self {
            strategy,
            voucher_id: voucher_id(&voucher)?.get(),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StallQuery {
    /// How long to pause while holding the guard; none or 0: no pause.
    stall_ms: Option<u64>,
    /// Where: `sale` (the default) or `release`; or `crash` (the
    /// Redis-stock designs: the request dies after the Redis step).
    stall_at: Option<String>,
}

impl StallQuery {
    fn stall(&self) -> Result<Option<Stall>, ApiError> {
        let at = match self.stall_at.as_deref() {
            None => StallAt::Sale,
            Some(name) => StallAt::from_name(name).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "stall_at must be sale, release or crash, not {name:?}"
                ))
            })?,
        };
        if at == StallAt::Crash {
            return Ok(Some(Stall {
                at,
                duration: Duration::ZERO,
            }));
        }
        let duration = Duration::from_millis(self.stall_ms.unwrap_or(0));
        if duration > MAX_STALL {
            return Err(ApiError::BadRequest(format!(
                "stall_ms must be at most {}",
                MAX_STALL.as_millis()
            )));
        }
        Ok((!duration.is_zero()).then_some(Stall { at, duration }))
    }
}

async fn purchase(
    Extension(lab): Extension<Lab>,
    User(user_id): User,
    path: LabPath,
    query: Result<Query<StallQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let stall = query.stall()?;
    let order = lab
        .purchase(Attempt {
            strategy: path.strategy,
            user_id: user_id.get(),
            voucher_id: path.voucher_id,
            stall,
        })
        .await?;
    Ok(match order {
        LabOrder::Stored(id) => (StatusCode::OK, Json(json!({ "order_id": id.to_string() }))),
        LabOrder::Pending => (StatusCode::ACCEPTED, Json(json!({ "status": "pending" }))),
    })
}
