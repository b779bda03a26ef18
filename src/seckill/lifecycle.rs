//! The order lifecycle after the grab: a payment in time pays an order, a
//! cancel or the deadline closes it and its unit goes back on sale, once.
//!
//! Postgres decides every transition (`store::lifecycle`: one conditional
//! change of an `unpaid` order, the unit returned in the same
//! transaction). This module tells the rest of the sale what came back:
//! the returning instance writes the sold-out flag "open" at the voucher's
//! new epoch (every instance reads it within its trust time, or reads the
//! new epoch from Postgres within its voucher cache's), and for async
//! sales the relay gives each unit back to Redis's stock and buyers from
//! the `stock_returns` outbox, idempotent by order id.
//!
//! Two background tasks run in every instance, sharing the work through
//! Postgres row locks (`SKIP LOCKED`) rather than dividing it: the expiry
//! sweep, and the relay of async returns.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::error::{OrderError, OrderRefusal, Result, SeckillError};
use super::metric;
use super::workers::InstanceTasks;
use super::Seckill;
use crate::domain::OrderId;
use crate::domain::Payment;
use crate::domain::UserId;
use crate::domain::{Order, OrderStatus, SaleMode, VoucherId};
use crate::store::{Closed, PaymentOutcome, StockReturn};

/// Most orders one expiry statement closes (all of one voucher).
const EXPIRE_BATCH: i64 = 5_000;
/// Pause of the expiry sweep when nothing was due: bounds how late an
/// order expires while the service runs.
const EXPIRE_POLL: Duration = Duration::from_millis(200);
/// Most queued returns one relay round takes.
const RELAY_BATCH: i64 = 2_000;
/// How long a relay's claim on queued returns lasts: a relay that died
/// leaves them to another after this.
const RELAY_LEASE_MS: i64 = 2_000;
/// Pause of the relay when nothing was queued (a return made on this
/// instance wakes it at once; this finds those of instances that died).
const RELAY_POLL: Duration = Duration::from_millis(250);
/// Pause after a failed round of either task.
const BACKOFF: Duration = Duration::from_millis(500);
/// Longest a closing waits for Redis to hear that a sync sale's units came
/// back before it goes on (see `Seckill::units_returned`).
const TELL_WAIT: Duration = Duration::from_millis(250);

/// What a payment notification came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentAnswer {
    pub order_id: OrderId,
    pub status: OrderStatus,
    /// The order could not take this payment: the money goes back.
    pub refund: bool,
}

impl Seckill {
    /// Cancels an `unpaid` order of `user` (`None`: an admin, any order).
    /// A cancelled order is cancelled again without change.
    pub async fn cancel(
        &self,
        order_id: OrderId,
        user: Option<UserId>,
    ) -> Result<Order, OrderError> {
        let order = self.order(order_id).await?;
        if user.is_some_and(|user| user != order.user_id) {
            // Someone else's order looks like none: its existence is not
            // to be confirmed.
            return Err(SeckillError::NotFound("order").into());
        }
        let store = &self.inner.store;
        let mut order = order;
        loop {
            let now = self.inner.clock.now();
            if order.status == OrderStatus::Unpaid {
                if let Some(closed) = store.cancel_order(order_id, now).await? {
                    metrics::counter!(metric::CANCELS).increment(1);
                    self.units_returned(&[closed]).await;
                } else if let Some(closed) = store.expire_order(order_id, now).await? {
                    // Its deadline passed before the cancel: it expires, as
                    // the sweep would have made it.
                    self.expired(&[closed], now).await;
                }
            }
            let was = order.status;
            order = self.order(order_id).await?;
            // An async order the writer stored between the two reads: it
            // is unpaid now, and cancelled as such (once: it stays stored).
            if !(was == OrderStatus::Pending && order.status == OrderStatus::Unpaid) {
                return cancelled(order);
            }
        }
    }

    /// Records a payment provider's notification (its signature checked
    /// by the caller) and pays the order if it is `unpaid` and in time.
    pub async fn pay(&self, payment: Payment) -> Result<PaymentAnswer, OrderError> {
        let order_id = payment.order_id;
        let now = self.inner.clock.now();
        match self.inner.store.pay(&payment, now).await? {
            PaymentOutcome::Recorded {
                status,
                refund,
                expired,
            } => {
                if let Some(closed) = expired {
                    self.expired(&[closed], now).await;
                }
                let outcome = match (status, refund) {
                    (OrderStatus::Paid, false) => metric::PAID,
                    _ => metric::REFUND,
                };
                metrics::counter!(metric::PAYMENTS, "outcome" => outcome).increment(1);
                Ok(PaymentAnswer {
                    order_id,
                    status,
                    refund,
                })
            }
            PaymentOutcome::UnknownOrder => {
                match self.inner.async_sales.pending(payment.order_id).await? {
                    Some(_) => Err(OrderRefusal::Pending.into()),
                    None => Err(SeckillError::NotFound("order").into()),
                }
            }
            PaymentOutcome::WrongAmount { price_cents } => Err(SeckillError::Invalid(format!(
                "amount_cents must be what the order costs (the voucher's price times its quantity), {price_cents}"
            ))
            .into()),
            PaymentOutcome::Reused => Err(OrderRefusal::PaymentConflict.into()),
        }
    }

    /// Starts the expiry sweep and the relay of async returns among the
    /// instance's background tasks; both stop with them.
    pub(super) fn start_lifecycle(&self, background: &InstanceTasks) {
        let InstanceTasks { tasks, stop } = background;
        tasks.spawn(self.clone().sweep(stop.clone()));
        tasks.spawn(self.clone().relay(stop.clone()));
    }

    /// Expires every unpaid order past its deadline, a voucher's batch at
    /// a time, then waits a moment and looks again.
    async fn sweep(self, stop: CancellationToken) {
        repeat(&stop, None, || async {
            let now = self.inner.clock.now();
            match self.inner.store.expire_due(now, EXPIRE_BATCH).await {
                Ok(closed) if closed.is_empty() => EXPIRE_POLL,
                Ok(closed) => {
                    self.expired(&closed, now).await;
                    Duration::ZERO
                }
                Err(error) => {
                    tracing::warn!(%error, "expiring unpaid orders failed; retrying");
                    BACKOFF
                }
            }
        })
        .await;
    }

    /// Gives queued async returns to Redis, then forgets them.
    async fn relay(self, stop: CancellationToken) {
        repeat(&stop, Some(&self.inner.returns_queued), || async {
            match self.relay_round().await {
                Ok(true) => Duration::ZERO,
                Ok(false) => RELAY_POLL,
                Err(error) => {
                    tracing::warn!(%error, "giving units back to async sales failed; retrying");
                    BACKOFF
                }
            }
        })
        .await;
    }

    /// One round of the relay; whether it took a full batch (more may
    /// wait).
    async fn relay_round(&self) -> Result<bool> {
        let store = &self.inner.store;
        let claimed = store
            .claim_stock_returns(RELAY_BATCH, RELAY_LEASE_MS)
            .await?;
        let full = i64::try_from(claimed.len()).unwrap_or(i64::MAX) >= RELAY_BATCH;
        let mut by_voucher: BTreeMap<VoucherId, Vec<StockReturn>> = BTreeMap::new();
        for r in claimed {
            by_voucher.entry(r.voucher_id).or_default().push(r);
        }
        let mut given = Vec::new();
        let mut failure = None;
        for (voucher_id, returns) in by_voucher {
            match self.inner.async_sales.give_back(voucher_id, &returns).await {
                Ok(true) => given.extend(returns.iter().map(|r| r.order_id)),
                // Paused: the reconciliation counts them, or they wait for
                // the sale to reopen; claimed until the lease ends.
                Ok(false) => {}
                Err(error) => failure = Some(error),
            }
        }
        if !given.is_empty() {
            store.forget_stock_returns(given).await?;
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(full),
        }
    }

    /// Books orders the deadline closed (metrics: how many, how late).
    async fn expired(&self, closed: &[Closed], now: chrono::DateTime<chrono::Utc>) {
        metrics::counter!(metric::EXPIRATIONS).increment(closed.len() as u64);
        for order in closed {
            let late = (now - order.pay_by).to_std().unwrap_or_default();
            metrics::histogram!(metric::EXPIRY_LATENESS_SECONDS).record(late.as_secs_f64());
        }
        self.units_returned(closed).await;
    }

    /// Tells the sale that units came back: this instance forgets the
    /// closed orders' holders and the vouchers it cached, the sold-out
    /// flags open at each voucher's new epoch, and an async sale's Redis
    /// gets the units and forgets the buyers at once (so that a buyer who
    /// cancels and buys again is not told of the cancelled order), the
    /// relay of the returns queued in Postgres woken behind it (a return
    /// counts once: `lua/async_return.lua`). A sync sale's flags are
    /// waited for at most [`TELL_WAIT`], the rest going on among the
    /// background tasks: Postgres has decided, this instance reads the new
    /// epoch from it, and a cancel's buyer (or the sweep's next voucher)
    /// does not wait out a frozen Redis's deadline. An async sale's buyers
    /// are waited for: Redis is where its sale looks for them.
    async fn units_returned(&self, closed: &[Closed]) {
        let inner = &self.inner;
        inner.holders.closed(closed);
        let (mut sync, mut sold_async) = (Vec::new(), Vec::new());
        // Every row of a voucher carries its stock after the statement's
        // returns: one per voucher is enough.
        let mut seen = HashSet::new();
        for order in closed {
            if seen.insert(order.voucher_id) {
                inner.vouchers.windows.invalidate(&order.voucher_id).await;
                match order.sale_mode {
                    SaleMode::Sync => sync.push(*order),
                    SaleMode::Async => sold_async.push(*order),
                }
            }
        }
        inner.give_back(&sold_async, closed).await;
        if sync.is_empty() {
            return;
        }
        let told = self.inner.clone();
        let tell = async move { told.open_flags(&sync).await };
        inner.background.wait_then_leave(TELL_WAIT, tell).await;
    }
}

impl super::Inner {
    /// The sold-out flags of these sync vouchers (one closed order of
    /// each) open at their new epochs.
    async fn open_flags(&self, one: &[Closed]) {
        let now = self.clock.now();
        for order in one {
            self.flags
                .publish(order.voucher_id, order.end_time, order.level, now)
                .await;
        }
    }

    /// These async vouchers' units and buyers (one closed order of each,
    /// `closed` all of them) given back to Redis, the relay woken behind.
    async fn give_back(&self, one: &[Closed], closed: &[Closed]) {
        for order in one {
            let returns: Vec<StockReturn> = closed
                .iter()
                .filter(|c| c.voucher_id == order.voucher_id)
                .map(|c| StockReturn {
                    order_id: c.order_id,
                    voucher_id: c.voucher_id,
                    user_id: c.user_id,
                    quantity: c.quantity,
                })
                .collect();
            if let Err(error) = self.async_sales.give_back(order.voucher_id, &returns).await {
                tracing::debug!(voucher_id = %order.voucher_id, error = %crate::telemetry::Chain(&error),
                    "returning units to Redis at once failed; the relay does it");
            }
            self.returns_queued.notify_one();
        }
    }
}

/// The answer to a cancel of `order`, read after the cancel's statements:
/// the order if it ended cancelled, else why not.
fn cancelled(order: Order) -> Result<Order, OrderError> {
    match order.status {
        OrderStatus::Cancelled => Ok(order),
        OrderStatus::Paid => Err(OrderRefusal::AlreadyPaid.into()),
        OrderStatus::Expired => Err(OrderRefusal::Expired.into()),
        OrderStatus::Pending => Err(OrderRefusal::Pending.into()),
        // Another transaction held it through both statements and let
        // it go unchanged: the next try decides it.
        OrderStatus::Unpaid => Err(SeckillError::postgres_unavailable(
            "the order was busy; try the cancel again",
        )
        .into()),
    }
}

/// Runs `round` until `stop` is cancelled: again at once when it returns
/// no pause (more work waits), else after its pause or when `wake` fires.
async fn repeat<F, Fut>(stop: &CancellationToken, wake: Option<&tokio::sync::Notify>, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    while !stop.is_cancelled() {
        let pause = round().await;
        if pause.is_zero() {
            continue;
        }
        let woken = async {
            match wake {
                Some(wake) => wake.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = woken => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn order(status: OrderStatus) -> Order {
        let created_at = Utc::now();
        Order {
            id: OrderId::from_parts(100_000, 1).unwrap(),
            user_id: UserId::new(9).unwrap(),
            voucher_id: VoucherId::new(7).unwrap(),
            quantity: 1,
            created_at,
            status,
            pay_by: Some(created_at + chrono::Duration::minutes(15)),
            paid_at: None,
            user_ref: None,
        }
    }

    #[test]
    fn a_cancel_answers_the_order_it_cancelled_and_each_other_winner_its_own_refusal() {
        for status in OrderStatus::ALL {
            let answer = cancelled(order(*status));
            let as_expected = match status {
                OrderStatus::Cancelled => {
                    matches!(&answer, Ok(o) if o.status == OrderStatus::Cancelled)
                }
                OrderStatus::Paid => {
                    matches!(answer, Err(OrderError::Refused(OrderRefusal::AlreadyPaid)))
                }
                OrderStatus::Expired => {
                    matches!(answer, Err(OrderError::Refused(OrderRefusal::Expired)))
                }
                OrderStatus::Pending => {
                    matches!(answer, Err(OrderError::Refused(OrderRefusal::Pending)))
                }
                // Left unpaid by both statements: busy, to be tried again.
                OrderStatus::Unpaid => matches!(
                    answer,
                    Err(OrderError::Failed(SeckillError::Unavailable { .. }))
                ),
            };
            assert!(as_expected, "{status}: {answer:?}");
        }
    }
}
