//! Accepting async purchases: those of one voucher that reach an instance
//! while its previous call for that voucher is under way go to Redis
//! together, in one run of `lua/async_purchase.lua`, as group commit
//! gathers a batch. One call, one read of the sale and of Redis's clock,
//! one write of the stock and of the buyers for all of them; each purchase
//! still gets its own verdict. A lone purchase is sent at once: no timer
//! ever makes a buyer wait for company.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{AsyncSales, SaleKeys, PENDING_TTL_SECS};
use crate::domain::{OrderId, Quantity, UserId, VoucherId};
use crate::seckill::error::{Result, SeckillError};
use crate::seckill::metric;
use crate::seckill::workers::Unanswered;

/// Most purchases in one call: bounds how long one script holds Redis
/// (about 10 µs of Redis's time each).
const MAX: usize = 64;
/// An acceptor with nothing to do for this long stops (the next purchase
/// of its voucher starts another).
const IDLE: Duration = Duration::from_secs(30);

/// What Redis said of one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// In the stream, at this time of Redis's clock (ms).
    Accepted {
        at_ms: i64,
    },
    NotStarted,
    Ended,
    SoldOut,
    /// Fewer units than asked were left at its turn: this many.
    Short(i32),
    /// The user holds this order already.
    Held(Option<OrderId>),
    /// The sale is not loaded in Redis (lost, or being reconciled).
    Paused,
    /// The user has the voucher's max_orders_per_user orders of it.
    TooMany,
}

/// A purchase waiting for its call.
pub(super) struct Request {
    user_id: UserId,
    order_id: OrderId,
    quantity: Quantity,
    reply: oneshot::Sender<Result<Verdict>>,
}

impl AsyncSales {
    /// Redis's verdict on `user_id` buying `quantity` units of
    /// `voucher_id` under `order_id`, from the voucher's next call. Waits at most twice the
    /// Redis deadline (the call ahead of it, then its own); a purchase
    /// whose verdict is late is answered 503 and may still have been
    /// accepted, as a single call that timed out may have been: a retry
    /// finds the order.
    pub(super) async fn accept(
        &self,
        voucher_id: VoucherId,
        max_orders: i32,
        user_id: UserId,
        order_id: OrderId,
        quantity: Quantity,
    ) -> Result<Verdict> {
        let verdict = self
            .inner
            .acceptors
            .ask(
                voucher_id,
                |reply| Request {
                    user_id,
                    order_id,
                    quantity,
                    reply,
                },
                Some(self.inner.redis.timeout() * 2),
                |arrivals, stop| {
                    accept_arrivals(self.clone(), voucher_id, max_orders, arrivals, stop)
                },
            )
            .await;
        match verdict {
            Ok(verdict) => verdict,
            Err(Unanswered::Dropped) => Err(SeckillError::redis_unavailable(
                "the purchase's call to Redis was dropped",
            )),
            Err(Unanswered::Late) => Err(SeckillError::redis_unavailable(
                "Redis did not answer the purchase in time",
            )),
        }
    }

    /// One call of the purchase script for `batch`: a verdict per purchase,
    /// in order.
    async fn call(
        &self,
        voucher_id: VoucherId,
        max_orders: i32,
        keys: &SaleKeys,
        batch: &[Request],
    ) -> Result<Vec<Verdict>> {
        let inner = &self.inner;
        // On a single Redis the script records the lookups by id too; on a
        // cluster those keys live in other slots and the purchases write
        // them (`AsyncSales::purchase`).
        let lookups_in_script = !inner.redis.is_cluster();
        let mut invocation = inner.purchase.prepare_invoke();
        invocation
            .key(&keys.sale)
            .key(&keys.buyers)
            .key(&keys.orders)
            .key(&keys.orders_per_user)
            .arg(voucher_id)
            .arg(PENDING_TTL_SECS)
            .arg(max_orders);
        for request in batch {
            if lookups_in_script {
                invocation.key(self.pending_key(request.order_id));
            }
            invocation
                .arg(request.user_id)
                .arg(request.order_id)
                .arg(request.quantity.get());
        }
        let answers: Vec<Vec<String>> = inner.redis.invoke(&invocation).await?;
        if answers.len() != batch.len() {
            return Err(unexpected(&answers));
        }
        answers.iter().map(|answer| verdict(answer)).collect()
    }
}

/// One voucher's acceptor: takes what has arrived (up to [`MAX`]), sends
/// it in one call, answers each, and again, until idle (at shutdown, until
/// its queue is empty). Nothing is sent for a purchase nobody waits for.
async fn accept_arrivals(
    sales: AsyncSales,
    voucher_id: VoucherId,
    max_orders: i32,
    arrivals: mpsc::UnboundedReceiver<Request>,
    stop: CancellationToken,
) {
    let keys = sales.keys(voucher_id);
    let keys = &keys;
    let sales = &sales;
    sales
        .inner
        .acceptors
        .gather(
            voucher_id,
            arrivals,
            stop,
            (MAX, IDLE),
            |request| !request.reply.is_closed(),
            |batch| async move {
                metrics::histogram!(metric::ASYNC_ACCEPT_BATCH_SIZE).record(batch.len() as f64);
                match sales.call(voucher_id, max_orders, keys, &batch).await {
                    Ok(verdicts) => {
                        for (request, verdict) in batch.into_iter().zip(verdicts) {
                            let _ = request.reply.send(Ok(verdict));
                        }
                    }
                    Err(error) => {
                        for request in batch {
                            let _ = request.reply.send(Err(error.clone()));
                        }
                    }
                }
            },
        )
        .await;
}

/// One purchase's answer from the script (see `lua/async_purchase.lua`).
/// A held order id that is not one (a hand-edited Redis) is no order id.
fn verdict(answer: &[String]) -> Result<Verdict> {
    let number = |i: usize| answer.get(i).and_then(|v| v.parse::<i64>().ok());
    Ok(match (number(0), answer.len()) {
        (Some(1), 2) => Verdict::Accepted {
            at_ms: number(1).ok_or_else(|| unexpected(answer))?,
        },
        (Some(-1), 1) => Verdict::NotStarted,
        (Some(-2), 1) => Verdict::Ended,
        (Some(-3), 1) => Verdict::SoldOut,
        (Some(-4), 2) => Verdict::Held(number(1).and_then(OrderId::from_stored)),
        (Some(-5), 1) => Verdict::Paused,
        (Some(-6), 1) => Verdict::TooMany,
        (Some(-7), 2) => match number(1).and_then(|left| i32::try_from(left).ok()) {
            Some(left) if left > 0 => Verdict::Short(left),
            _ => return Err(unexpected(answer)),
        },
        _ => return Err(unexpected(answer)),
    })
}

fn unexpected(answer: &(impl std::fmt::Debug + ?Sized)) -> SeckillError {
    SeckillError::internal(format!(
        "unexpected answer of the purchase script: {answer:?}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_of_the_script_has_its_verdict_and_nothing_else_passes() {
        let answer =
            |parts: &[&str]| verdict(&parts.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        assert_eq!(
            answer(&["1", "1700000000123"]).unwrap(),
            Verdict::Accepted {
                at_ms: 1_700_000_000_123
            }
        );
        assert_eq!(answer(&["-1"]).unwrap(), Verdict::NotStarted);
        assert_eq!(answer(&["-2"]).unwrap(), Verdict::Ended);
        assert_eq!(answer(&["-3"]).unwrap(), Verdict::SoldOut);
        let held = OrderId::from_stored(7 << 32 | 5).unwrap();
        assert_eq!(
            answer(&["-4", &held.to_string()]).unwrap(),
            Verdict::Held(Some(held))
        );
        assert_eq!(answer(&["-4", "garbage"]).unwrap(), Verdict::Held(None));
        assert_eq!(answer(&["-5"]).unwrap(), Verdict::Paused);
        assert_eq!(answer(&["-6"]).unwrap(), Verdict::TooMany);
        assert_eq!(answer(&["-7", "2"]).unwrap(), Verdict::Short(2));
        for odd in [
            &[][..],
            &["1"],
            &["1", "soon"],
            &["-4"],
            &["0"],
            &["2", "1"],
            &["-3", "1"],
            &["-7"],
            &["-7", "0"],
            &["-7", "many"],
            &["x"],
        ] {
            assert!(
                matches!(answer(odd), Err(SeckillError::Internal(_))),
                "{odd:?}"
            );
        }
    }
}
