//! The sale monitor's one admin route, `GET /admin/vouchers/{id}/monitor`,
//! which the monitor page (`/shop/monitor`) reads once a second: answered
//! from memory (the voucher and its stock as the crowd reads them, the
//! purchase answers `tally` counts) and the waiting room's counter as the
//! polls share it, with no query of its own.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorCode};
use super::extract::VoucherIdPath;
use super::responses::NotFound;
use super::state::AppState;
use super::tally::{P99_SECONDS, SECONDS};
use crate::domain::SaleMode;

/// A voucher's sale as the monitor shows it, read once a second.
#[derive(Serialize, ToSchema)]
pub struct MonitorBody {
    voucher_id: i64,
    title: String,
    /// This instance's clock when it answered.
    #[schema(value_type = String, format = DateTime)]
    server_time: DateTime<Utc>,
    #[schema(value_type = String, format = DateTime)]
    begin_time: DateTime<Utc>,
    #[schema(value_type = String, format = DateTime)]
    end_time: DateTime<Utc>,
    sale_mode: SaleMode,
    initial_stock: i32,
    /// Units left, as the crowd reads them (at most a second stale).
    stock: i32,
    /// Units taken: `initial_stock - stock` (live orders, with their
    /// units).
    sold: i64,
    /// Purchases this instance answered with an order in the last
    /// complete second.
    orders_per_second: u64,
    /// Purchases this instance refused in the last complete second, by
    /// error code (`other` for an answer without one).
    refusals_per_second: BTreeMap<String, u64>,
    /// The 99th percentile of this instance's purchase answers' latency
    /// over the last `p99_window_seconds`, in milliseconds (within 19 %);
    /// null without answers.
    purchase_p99_ms: Option<f64>,
    /// Purchase answers the p99 was read from.
    purchases_in_window: u64,
    p99_window_seconds: u64,
    /// The waiting room's counter; null when the voucher has none.
    waiting_room: Option<RoomBody>,
}

/// A waiting room's counter.
#[derive(Serialize, ToSchema)]
pub struct RoomBody {
    /// Places up to this one are admitted.
    serving: i64,
    /// Places handed out so far.
    placed: i64,
    /// Places handed out, not admitted yet.
    waiting: i64,
    admit_per_second: i32,
}

/// An error code as the API writes it.
fn code_word(code: Option<ErrorCode>) -> String {
    code.and_then(|code| match serde_json::to_value(code) {
        Ok(serde_json::Value::String(word)) => Some(word),
        _ => None,
    })
    .unwrap_or_else(|| "other".to_owned())
}

#[utoipa::path(
    get, path = "/admin/vouchers/{id}/monitor",
    params(VoucherIdPath),
    responses(
        (status = 200, description = "The sale now: stock, this instance's orders and refusals per second, purchase p99, the waiting room's counter (for the sale monitor, /shop/monitor, once a second; never cached)", body = MonitorBody),
        NotFound,
    )
)]
pub async fn monitor(
    State(state): State<AppState>,
    VoucherIdPath(id): VoucherIdPath,
) -> Result<Response, ApiError> {
    let voucher = state.seckill.voucher(id).await?;
    let room = state.seckill.room_counter(id).await?;
    let reading = state.monitor.read(id);
    let terms = voucher.terms;
    let body = MonitorBody {
        voucher_id: id.get(),
        title: terms.title,
        server_time: Utc::now(),
        begin_time: terms.begin_time,
        end_time: terms.end_time,
        sale_mode: terms.sale_mode,
        initial_stock: voucher.level.initial_stock,
        stock: voucher.level.stock,
        sold: i64::from(voucher.level.initial_stock) - i64::from(voucher.level.stock),
        orders_per_second: reading.orders_per_second,
        refusals_per_second: reading
            .refusals_per_second
            .into_iter()
            .map(|(code, count)| (code_word(code), count))
            .collect(),
        purchase_p99_ms: reading.p99_ms.map(|ms| (ms * 100.0).round() / 100.0),
        purchases_in_window: reading.answers,
        p99_window_seconds: P99_SECONDS.min(SECONDS as u64),
        waiting_room: room.map(|room| RoomBody {
            serving: room.serving,
            placed: room.placed,
            waiting: room.waiting,
            admit_per_second: room.admit_per_second,
        }),
    };
    Ok(([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_read_as_the_api_writes_them() {
        assert_eq!(code_word(Some(ErrorCode::SoldOut)), "sold_out");
        assert_eq!(code_word(Some(ErrorCode::RateLimited)), "rate_limited");
        assert_eq!(code_word(None), "other");
    }
}
