//! The sale monitor's side of the service: every purchase answer counted
//! per voucher at the edge (orders, refusals by error code, latency), and
//! the one admin route the monitor page reads each second,
//! `GET /admin/vouchers/{id}/monitor`, answered from memory (the voucher
//! and its stock as the crowd reads them, these counts) and the waiting
//! room's counter as the polls share it: no query of its own.
//!
//! `/metrics` keeps the same answers, but its labels are a bounded set
//! without the voucher, so the per-voucher counts are kept here, in a
//! fixed window per voucher, for a bounded number of vouchers.

mod window;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorCode};
use super::extract::{voucher_id, Admin, VoucherIdPath};
use super::limit::RouteClass;
use super::responses::{BadRequest, Forbidden, NotFound, TooLarge, Unavailable};
use super::state::AppState;
use crate::domain::{SaleMode, VoucherId};
use window::{Outcome, Window, P99_SECONDS, SECONDS};

/// Most vouchers watched at once; past it, the one idle longest makes room.
const MAX_VOUCHERS: usize = 1024;

/// Every watched voucher's window, on this instance.
pub struct Monitor {
    began: Instant,
    windows: RwLock<HashMap<VoucherId, Arc<Mutex<Window>>>>,
}

impl Default for Monitor {
    fn default() -> Self {
        Self {
            began: Instant::now(),
            windows: RwLock::new(HashMap::new()),
        }
    }
}

impl Monitor {
    fn now(&self) -> u64 {
        self.began.elapsed().as_secs()
    }

    /// Counts a purchase answer of `voucher`.
    fn record(&self, voucher: VoucherId, outcome: Outcome, took: Duration) {
        let second = self.now();
        let found = self
            .windows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&voucher)
            .cloned();
        let window = match found {
            Some(window) => window,
            None => {
                let mut windows = self.windows.write().unwrap_or_else(|p| p.into_inner());
                if windows.len() >= MAX_VOUCHERS && !windows.contains_key(&voucher) {
                    evict_idlest(&mut windows);
                }
                windows
                    .entry(voucher)
                    .or_insert_with(|| Arc::new(Mutex::new(Window::new())))
                    .clone()
            }
        };
        window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(second, outcome, took);
    }

    /// `voucher`'s counts as they stand now.
    fn read(&self, voucher: VoucherId) -> window::Reading {
        let window = self
            .windows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&voucher)
            .cloned();
        window.map_or_else(Default::default, |window| {
            window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .read(self.now())
        })
    }
}

fn evict_idlest(windows: &mut HashMap<VoucherId, Arc<Mutex<Window>>>) {
    let idlest = windows
        .iter()
        .min_by_key(|(_, window)| window.lock().unwrap_or_else(|p| p.into_inner()).last)
        .map(|(id, _)| *id);
    if let Some(id) = idlest {
        windows.remove(&id);
    }
}

/// The voucher a purchase path names (`/seckill/{id}`), if it is one.
fn purchased_voucher(path: &str) -> Option<VoucherId> {
    voucher_id(path.strip_prefix("/seckill/")?).ok()
}

/// Counts every answer to a purchase, refusals by the limits and the
/// shedder included: it runs outside them (inside the route table's
/// classification, which it reads).
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let voucher = (RouteClass::of_request(&request) == RouteClass::Purchase)
        .then(|| purchased_voucher(request.uri().path()))
        .flatten();
    let Some(voucher) = voucher else {
        return next.run(request).await;
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let outcome = if response.status().is_success() {
        Ok(())
    } else {
        Err(response.extensions().get::<ErrorCode>().copied())
    };
    // An unknown or malformed voucher is nobody's sale: not watched.
    if !matches!(
        outcome,
        Err(Some(ErrorCode::NotFound | ErrorCode::BadRequest))
    ) {
        state.monitor.record(voucher, outcome, started.elapsed());
    }
    response
}

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
    get, path = "/admin/vouchers/{id}/monitor", tag = "admin",
    params(VoucherIdPath),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The sale now: stock, this instance's orders and refusals per second, purchase p99, the waiting room's counter (for the sale monitor, /shop/monitor, once a second; never cached)", body = MonitorBody),
        BadRequest, Forbidden, NotFound, TooLarge, Unavailable,
    )
)]
pub async fn monitor(
    State(state): State<AppState>,
    _: Admin,
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

    fn v(id: i64) -> VoucherId {
        VoucherId::new(id).unwrap()
    }

    #[test]
    fn only_a_purchase_path_names_a_voucher() {
        assert_eq!(purchased_voucher("/seckill/42"), Some(v(42)));
        assert_eq!(purchased_voucher("/seckill/0"), None);
        assert_eq!(purchased_voucher("/seckill/x"), None);
        assert_eq!(purchased_voucher("/lab/naive/seckill/42"), None);
    }

    #[test]
    fn the_codes_read_as_the_api_writes_them() {
        assert_eq!(code_word(Some(ErrorCode::SoldOut)), "sold_out");
        assert_eq!(code_word(Some(ErrorCode::RateLimited)), "rate_limited");
        assert_eq!(code_word(None), "other");
    }

    #[test]
    fn the_watched_vouchers_are_bounded() {
        let monitor = Monitor::default();
        for id in 1..=(MAX_VOUCHERS as i64 + 10) {
            monitor.record(v(id), Ok(()), Duration::from_millis(1));
        }
        assert_eq!(monitor.windows.read().unwrap().len(), MAX_VOUCHERS);
    }
}
