//! The order lifecycle's statements: pay, cancel and expire, each one
//! conditional change of an `unpaid` order, so exactly one of them wins;
//! the unit goes back in the transaction that closes the order (and, for
//! an async sale, into the `stock_returns` outbox that Redis learns it
//! from).

use chrono::{DateTime, Utc};
use sqlx::{Acquire, FromRow, PgConnection};

use super::{Result, Store};
use crate::domain::{OrderId, OrderStatus, Payment, SaleMode, StockLevel, UserId, VoucherId};

/// Closes the orders in `closing` (ids) that are `unpaid` and meet `$due`
/// (their deadline against `$2`) as `$1` ('cancelled' or 'expired') at
/// `$2`: gives their units back to their vouchers' stock (and counts them
/// in `returned`, the flags' epoch) and queues the returns of async sales
/// for Redis. Needs a CTE `closing` ahead of it; answers one row per closed
/// order with its voucher's stock after the return.
///
/// The conditions are the `UPDATE`'s own, and the deadline is compared as
/// a difference, which no index can answer, so one order is found by its
/// primary key: written as `pay_by > $2`, it let the planner read the
/// unpaid orders' deadline index instead (the generic plan a connection
/// keeps from a new database, where the two indexes cost the same), every
/// unpaid order in time read for one cancel.
macro_rules! close_and_return {
    ($due:literal) => {
        concat!(
            "closed AS (
            UPDATE voucher_orders o SET status = $1, closed_at = $2
            FROM closing c
            WHERE o.id = c.id AND o.status = 'unpaid' AND ",
            $due,
            "
            RETURNING o.id, o.voucher_id, o.user_id, o.pay_by, o.quantity
        ), units AS (
            SELECT voucher_id, sum(quantity)::int AS n FROM closed GROUP BY voucher_id
        ), back AS (
            UPDATE seckill_vouchers s
            SET stock = s.stock + u.n, returned = s.returned + u.n
            FROM units u
            WHERE s.voucher_id = u.voucher_id
            RETURNING s.voucher_id, s.stock, s.initial_stock, s.returned, s.sale_mode, s.end_time
        ), outbox AS (
            INSERT INTO stock_returns (order_id, voucher_id, user_id, quantity)
            SELECT c.id, c.voucher_id, c.user_id, c.quantity
            FROM closed c JOIN back b ON b.voucher_id = c.voucher_id
            WHERE b.sale_mode = 'async'
        )
        SELECT c.id AS order_id, c.voucher_id, c.user_id, c.pay_by, c.quantity, b.stock, b.initial_stock,
               b.returned, b.sale_mode, b.end_time
        FROM closed c JOIN back b ON b.voucher_id = c.voucher_id"
        )
    };
}

/// Cancels order `$3` if it is `unpaid` and still in time.
pub const CANCEL: &str = concat!(
    "WITH closing AS (SELECT $3::bigint AS id), ",
    close_and_return!("o.pay_by - $2 > interval '0'")
);

/// Expires order `$3` if it is `unpaid` and past its deadline.
pub const EXPIRE_ONE: &str = concat!(
    "WITH closing AS (SELECT $3::bigint AS id), ",
    close_and_return!("o.pay_by - $2 <= interval '0'")
);

/// Expires up to `$3` orders past their deadline, all of one voucher (the
/// one whose order is the most overdue among those no other transaction
/// holds), so that a sweep locks one voucher row and two sweeps never wait
/// for each other in a circle. Orders that another transaction holds (a
/// payment or cancel deciding them, another instance's sweep, a frozen
/// client's open transaction) are skipped, not waited for, and do not hold
/// up the other vouchers' expiry.
const EXPIRE_DUE: &str = concat!(
    "WITH first AS (
        SELECT voucher_id FROM voucher_orders
        WHERE status = 'unpaid' AND pay_by <= $2
        ORDER BY pay_by LIMIT 1
        FOR UPDATE SKIP LOCKED
     ), closing AS (
        SELECT id FROM voucher_orders
        WHERE status = 'unpaid' AND pay_by <= $2 AND voucher_id = (SELECT voucher_id FROM first)
        ORDER BY pay_by LIMIT $3
        FOR UPDATE SKIP LOCKED
     ), ",
    close_and_return!("o.pay_by - $2 <= interval '0'")
);

/// An order this instance closed, with its voucher's stock right after.
#[derive(Debug, Clone, Copy, FromRow)]
pub struct Closed {
    pub order_id: OrderId,
    pub voucher_id: VoucherId,
    pub user_id: UserId,
    pub pay_by: DateTime<Utc>,
    /// The order's units, all given back.
    pub quantity: i32,
    #[sqlx(flatten)]
    pub level: StockLevel,
    pub sale_mode: SaleMode,
    pub end_time: DateTime<Utc>,
}

/// What a notification did.
#[derive(Debug, Clone)]
pub enum PaymentOutcome {
    /// Recorded (now, or at an earlier delivery of the same payment id):
    /// the order as it stands, and whether the money goes back.
    Recorded {
        status: OrderStatus,
        refund: bool,
        /// The order this delivery found past its deadline and expired.
        expired: Option<Closed>,
    },
    /// No stored order has this id.
    UnknownOrder,
    /// The amount is not what the order costs (the voucher's price times
    /// its units): nothing recorded.
    WrongAmount { price_cents: i64 },
    /// This payment id was recorded for another order or amount.
    Reused,
}

/// A unit an async sale's closed order gave back, for Redis to learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct StockReturn {
    pub order_id: OrderId,
    pub voucher_id: VoucherId,
    pub user_id: UserId,
    /// The order's units, all given back.
    pub quantity: i32,
}

#[derive(FromRow)]
struct Payable {
    status: OrderStatus,
    pay_by: DateTime<Utc>,
    /// What the order costs: the voucher's price times its units.
    price_cents: i64,
}

#[derive(FromRow)]
struct Recorded {
    order_id: OrderId,
    amount_cents: i64,
    refund: bool,
}

impl Store {
    /// Cancels `id` if it is `unpaid` and in time at `now`; `None`
    /// when it was not (the caller reads why).
    pub async fn cancel_order(&self, id: OrderId, now: DateTime<Utc>) -> Result<Option<Closed>> {
        self.close_one(CANCEL, OrderStatus::Cancelled, id, now)
            .await
    }

    /// Expires `id` if it is `unpaid` and past its deadline at `now`.
    pub async fn expire_order(&self, id: OrderId, now: DateTime<Utc>) -> Result<Option<Closed>> {
        self.close_one(EXPIRE_ONE, OrderStatus::Expired, id, now)
            .await
    }

    async fn close_one(
        &self,
        statement: &'static str,
        to: OrderStatus,
        order_id: OrderId,
        now: DateTime<Utc>,
    ) -> Result<Option<Closed>> {
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(statement)
                        .bind(to)
                        .bind(now)
                        .bind(order_id)
                        .persistent(persistent)
                        .fetch_optional(c),
                )
            })
            .await
    }

    /// Expires up to `limit` orders of one voucher whose deadline passed
    /// by `now`; every instance may run it at once without double work.
    ///
    /// Planned afresh on every run (an unnamed statement): a sweep is rare
    /// next to its planning, and a plan kept from a new database's empty
    /// table updated the swept orders by reading every unpaid one, where a
    /// plan made now sees the table's size and goes by primary key.
    pub async fn expire_due(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<Closed>> {
        self.db
            .run(move |c, _| {
                Box::pin(
                    sqlx::query_as(EXPIRE_DUE)
                        .bind(OrderStatus::Expired)
                        .bind(now)
                        .bind(limit)
                        .persistent(false)
                        .fetch_all(c),
                )
            })
            .await
    }

    /// Records a payment notification and pays the order if it is
    /// `unpaid` and in time at `now`, in one transaction that holds the
    /// order's row: deliveries of one payment, other payments, a cancel
    /// and the expiry of the order take their turns, and exactly one of
    /// pay, cancel and expire changes it.
    pub async fn pay(&self, payment: &Payment, now: DateTime<Utc>) -> Result<PaymentOutcome> {
        let payment = payment.clone();
        self.db
            .run(move |c, persistent| Box::pin(pay_in(c, payment, now, persistent)))
            .await
    }

    /// Takes up to `limit` queued stock returns that no instance has
    /// claimed in the last `lease_ms` (one that died mid-way), claiming
    /// them for that long.
    pub async fn claim_stock_returns(&self, limit: i64, lease_ms: i64) -> Result<Vec<StockReturn>> {
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(
                        "UPDATE stock_returns r
                         SET visible_at = now() + make_interval(secs => $2::double precision / 1000)
                         FROM (SELECT order_id FROM stock_returns WHERE visible_at <= now()
                               ORDER BY order_id LIMIT $1 FOR UPDATE SKIP LOCKED) due
                         WHERE r.order_id = due.order_id
                         RETURNING r.order_id, r.voucher_id, r.user_id, r.quantity",
                    )
                    .bind(limit)
                    .bind(lease_ms)
                    .persistent(persistent)
                    .fetch_all(c),
                )
            })
            .await
    }

    /// Forgets stock returns that Redis has learnt.
    pub async fn forget_stock_returns(&self, order_ids: Vec<OrderId>) -> Result<()> {
        self.db
            .execute(
                sqlx::query("DELETE FROM stock_returns WHERE order_id = ANY($1)").bind(order_ids),
            )
            .await
            .map(drop)
    }
}

async fn pay_in(
    conn: &mut PgConnection,
    payment: Payment,
    now: DateTime<Utc>,
    persistent: bool,
) -> std::result::Result<PaymentOutcome, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let order: Option<Payable> = sqlx::query_as(
        "SELECT o.status, o.pay_by, s.price_cents * o.quantity AS price_cents
         FROM voucher_orders o JOIN seckill_vouchers s ON s.voucher_id = o.voucher_id
         WHERE o.id = $1
         FOR UPDATE OF o",
    )
    .bind(payment.order_id)
    .persistent(persistent)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(order) = order else {
        // A payment id used already, for an order that is stored, is a
        // reuse whatever this order is (unknown, or not stored yet).
        let used: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM payments WHERE payment_id = $1)")
                .bind(&payment.payment_id)
                .persistent(persistent)
                .fetch_one(&mut *tx)
                .await?;
        return Ok(if used {
            PaymentOutcome::Reused
        } else {
            PaymentOutcome::UnknownOrder
        });
    };
    // Read after the order's row is ours: an earlier delivery of this
    // payment has committed or rolled back by now.
    let recorded: Option<Recorded> =
        sqlx::query_as("SELECT order_id, amount_cents, refund FROM payments WHERE payment_id = $1")
            .bind(&payment.payment_id)
            .persistent(persistent)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some(recorded) = recorded {
        if recorded.order_id != payment.order_id || recorded.amount_cents != payment.amount_cents {
            return Ok(PaymentOutcome::Reused);
        }
        return Ok(PaymentOutcome::Recorded {
            status: order.status,
            refund: recorded.refund,
            expired: None,
        });
    }
    // The price matters only to a payment that would pay the order: money
    // for a closed (or late) order is recorded and refunded, whatever it is.
    let pays = payment_step(order.status, order.pay_by, now) == PaymentStep::Pay;
    if pays && payment.amount_cents != order.price_cents {
        return Ok(PaymentOutcome::WrongAmount {
            price_cents: order.price_cents,
        });
    }
    let (status, refund, expired) = settle(&mut tx, &order, &payment, now, persistent).await?;
    // The same payment id for another order, delivered at the same moment,
    // locks another order's row: the two meet here, and the later one
    // finds the id taken once the first commits. It changes nothing.
    let recorded = sqlx::query(
        "INSERT INTO payments (payment_id, order_id, amount_cents, refund) VALUES ($1, $2, $3, $4)
         ON CONFLICT (payment_id) DO NOTHING",
    )
    .bind(&payment.payment_id)
    .bind(payment.order_id)
    .bind(payment.amount_cents)
    .bind(refund)
    .persistent(persistent)
    .execute(&mut *tx)
    .await?;
    if recorded.rows_affected() == 0 {
        tx.rollback().await?;
        return Ok(PaymentOutcome::Reused);
    }
    tx.commit().await?;
    Ok(PaymentOutcome::Recorded {
        status,
        refund,
        expired,
    })
}

/// What a payment does to its `order` (locked by the caller): an unpaid
/// order in time is paid; a late one expires here, as the sweep would have
/// closed it, and the payment is to be refunded, as for any closed order.
async fn settle(
    conn: &mut PgConnection,
    order: &Payable,
    payment: &Payment,
    now: DateTime<Utc>,
    persistent: bool,
) -> std::result::Result<(OrderStatus, bool, Option<Closed>), sqlx::Error> {
    Ok(match payment_step(order.status, order.pay_by, now) {
        PaymentStep::Pay => {
            sqlx::query(
                "UPDATE voucher_orders SET status = 'paid', paid_at = $2
                 WHERE id = $1 AND status = 'unpaid'",
            )
            .bind(payment.order_id)
            .bind(now)
            .persistent(persistent)
            .execute(conn)
            .await?;
            (OrderStatus::Paid, false, None)
        }
        PaymentStep::Expire => {
            let closed: Option<Closed> = sqlx::query_as(EXPIRE_ONE)
                .bind(OrderStatus::Expired)
                .bind(now)
                .bind(payment.order_id)
                .persistent(persistent)
                .fetch_optional(conn)
                .await?;
            (OrderStatus::Expired, true, closed)
        }
        PaymentStep::Refund(status) => (status, true, None),
    })
}

/// What a payment does to an order that stands at `status`, due by
/// `pay_by`, at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PaymentStep {
    /// Unpaid and in time: paid.
    Pay,
    /// Unpaid and due: it expires, and the money goes back.
    Expire,
    /// Closed already (paid by another payment, cancelled or expired): it
    /// stays so, and the money goes back.
    Refund(OrderStatus),
}

/// The step a payment takes with an order at `status`, due by `pay_by`,
/// at `now`: only an unpaid order in time is paid; at its deadline it is
/// due, as `EXPIRE_ONE` and the sweep count it.
fn payment_step(status: OrderStatus, pay_by: DateTime<Utc>, now: DateTime<Utc>) -> PaymentStep {
    match status {
        OrderStatus::Unpaid if pay_by > now => PaymentStep::Pay,
        OrderStatus::Unpaid => PaymentStep::Expire,
        closed => PaymentStep::Refund(closed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payment_pays_only_an_unpaid_order_in_time_and_refunds_the_rest() {
        let pay_by = Utc::now();
        let second = chrono::Duration::seconds(1);
        let cases = [
            (OrderStatus::Unpaid, pay_by - second, PaymentStep::Pay),
            // At its deadline an order is due: the payment expires it.
            (OrderStatus::Unpaid, pay_by, PaymentStep::Expire),
            (OrderStatus::Unpaid, pay_by + second, PaymentStep::Expire),
            // Another payment, a cancel or the expiry won: whatever the
            // time, the order stays as it was and the money goes back.
            (
                OrderStatus::Paid,
                pay_by - second,
                PaymentStep::Refund(OrderStatus::Paid),
            ),
            (
                OrderStatus::Cancelled,
                pay_by - second,
                PaymentStep::Refund(OrderStatus::Cancelled),
            ),
            (
                OrderStatus::Expired,
                pay_by + second,
                PaymentStep::Refund(OrderStatus::Expired),
            ),
        ];
        for (status, now, step) in cases {
            assert_eq!(
                payment_step(status, pay_by, now),
                step,
                "{status} at {}",
                now - pay_by
            );
        }
    }
}
