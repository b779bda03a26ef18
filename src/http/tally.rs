//! Every purchase answer counted per voucher at the edge (orders, refusals
//! by error code, latency), for the sale monitor's route (`monitor`).
//!
//! `/metrics` keeps the same answers, but its labels are a bounded set
//! without the voucher, so the per-voucher counts are kept here, in a
//! fixed window per voucher, for a bounded number of vouchers.

mod window;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::error::ErrorCode;
use super::extract::voucher_id;
use super::limit::RouteClass;
use crate::domain::VoucherId;
use window::{Outcome, Window};
pub(super) use window::{P99_SECONDS, SECONDS};

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

    /// `voucher`'s window, if it is watched (under the read lock only).
    fn watched(&self, voucher: VoucherId) -> Option<Arc<Mutex<Window>>> {
        self.windows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&voucher)
            .cloned()
    }

    /// Counts a purchase answer of `voucher`. A voucher not watched yet is
    /// watched from an answer that shows it is on sale (an order, or a
    /// refusal the sale made: sold out, not started, ...), never from one
    /// given before the sale was asked (no token, over a limit, shed, a
    /// purchase of the same already in flight): a flood of made-up ids
    /// would otherwise take the write lock and evict a real sale's window
    /// at each request.
    fn record(&self, voucher: VoucherId, outcome: Outcome, took: Duration) {
        let second = self.now();
        let window = match self.watched(voucher) {
            Some(window) => window,
            None if !names_a_sale(outcome) => return,
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
    pub(super) fn read(&self, voucher: VoucherId) -> window::Reading {
        self.watched(voucher)
            .map_or_else(Default::default, |window| {
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
pub async fn record<S: AsRef<Monitor>>(
    State(state): State<S>,
    request: Request,
    next: Next,
) -> Response {
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
        state.as_ref().record(voucher, outcome, started.elapsed());
    }
    response
}

/// Whether an answer shows its voucher is on sale: only the sale itself
/// gives it.
fn names_a_sale(outcome: Outcome) -> bool {
    use ErrorCode as C;
    matches!(
        outcome,
        Ok(())
            | Err(Some(
                C::NotStarted
                    | C::Ended
                    | C::SoldOut
                    | C::NotEnoughStock
                    | C::AlreadyPurchased
                    | C::TooManyOrders
                    | C::NotAdmitted
            ))
    )
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
    fn a_voucher_is_watched_from_an_answer_of_its_sale_not_from_a_refusal_at_the_door() {
        let monitor = Monitor::default();
        let took = Duration::from_millis(1);
        for door in [
            ErrorCode::Unauthorized,
            ErrorCode::RateLimited,
            ErrorCode::Unavailable,
        ] {
            monitor.record(v(7), Err(Some(door)), took);
        }
        monitor.record(v(7), Err(None), took);
        assert!(monitor.windows.read().unwrap().is_empty());
        monitor.record(v(7), Err(Some(ErrorCode::SoldOut)), took);
        monitor.record(v(7), Err(Some(ErrorCode::RateLimited)), took);
        let windows = monitor.windows.read().unwrap();
        assert_eq!(windows.keys().copied().collect::<Vec<_>>(), vec![v(7)]);
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
