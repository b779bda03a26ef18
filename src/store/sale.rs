//! The sale: one statement that sells a batch of purchases of one voucher
//! (group commit). Fences, "already bought?", the `stock > 0` decrement by
//! as many units as it can grant, and the orders, in one transaction and
//! one round trip, with an answer per purchase.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::{Result, Store, StoreError};
use crate::domain::{FencingToken, OrderId, Quantity, StockLevel, UserId, VoucherId};

/// One purchase in a batch: a user who holds their lock (with its fencing
/// token) and the order id drawn for them; or, from an async sale's
/// stream, an order Redis accepted, which has no lock and no token. Its
/// order is created at `at` (the sale's clock) and must be paid within the
/// voucher's window from then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleRequest {
    pub order_id: OrderId,
    pub user_id: UserId,
    pub fence: Option<FencingToken>,
    pub at: DateTime<Utc>,
    /// Units it asks for, all or nothing.
    pub quantity: Quantity,
}

/// What the batch did for one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sale {
    /// The order is committed under the request's order id.
    Sold,
    /// No unit was left for it (or the voucher has no sale).
    SoldOut,
    /// Fewer units than it asked for were left for it: this many, after
    /// the batch.
    Short(i32),
    /// The user already holds this order for the voucher.
    Held(OrderId),
    /// The fencing token is older than the user's last one: the lock it
    /// came from was lost and a newer holder has written since.
    Fenced,
    /// The user has as many orders of the voucher (live, cancelled or
    /// expired) as it allows.
    TooMany,
    /// The order id is taken already: the id counter was lost and counts
    /// again from below. Nothing was written for it; draw another.
    IdTaken,
}

/// A batch's answers, in the order of its requests, and the stock right
/// after it (`None` when it decremented nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSale {
    pub sales: Vec<Sale>,
    pub level: Option<StockLevel>,
}

/// The batch sale, in one statement (so one transaction).
///
/// - `req`: the purchases, numbered in arrival order, each asking for
///   `quantity` units (`$7`).
/// - `fence`: each user's token (of their lock for this voucher) is stored,
///   in user order (so two batches lock fence rows alike), if it is not
///   smaller than the one stored; only those users may buy. A request
///   without a token (an async sale's order) is not fenced.
/// - `mine`: each user's orders of this voucher, whatever their status,
///   counted (`n`) and their live one (`unpaid` or `paid`, at most one)
///   found, in one probe of the index on (voucher, user); `used`: order ids
///   that are taken. Both look each request up in an index (`LATERAL`, an
///   aggregate or a `LIMIT` that keeps the planner from turning it into a
///   join): a connection keeps the generic plan it chose on an empty table,
///   which would scan every order for each batch.
/// - `held`: users who already hold a live order of this voucher. A request
///   whose own order id is stored for the same user and voucher (an async
///   entry written twice) is `held` by it.
/// - `maxed`: users who have `$6` (the voucher's `max_orders_per_user`)
///   orders of it already, whatever their status.
/// - `eligible`: the rest, ranked by arrival; `asks`: the units they ask
///   for, together (`total`) and one by one (`q`, in arrival order).
/// - `locked`: the voucher's row, locked, as the last committed writer left
///   it (a row lock wait in READ COMMITTED re-reads the newest version), so
///   what it grants is exact.
/// - `fits`: all or nothing, in arrival order while the stock covers the
///   asks; one that it cannot cover does not stop a later, smaller one
///   (3 left, asks of 2, 2, 1: the first and the third). When the stock
///   covers every ask (`total`), all are granted without walking them;
///   otherwise `walk` takes them one by one from `q` (each step reads one
///   element, not the whole batch again) and stops once no unit is left. `fits` holds the granted purchases whole, so
///   that nothing below joins it back to `eligible`: a join of two CTEs,
///   whose sizes the planner cannot see, was a nested loop over both (a
///   batch of 500 compared 250,000 pairs).
/// - `taken` decrements by the units granted; `placed`: the granted
///   purchases become `unpaid` orders of their quantity, due
///   `pay_within_seconds` after their creation time.
///
/// A purchase that was eligible but not granted is `short` while units
/// are left after the batch (fewer than it asked), `sold_out` when none
/// are. The CHECKs and the unique indexes still hold behind it: an order
/// that a concurrent batch committed after this statement's snapshot (a
/// lapsed lease on another instance) fails the whole statement, and the
/// caller runs it again, when `held` sees it. (`loadtest` runs this same
/// text through pgbench: keep them equal.)
pub const SELL_BATCH: &str = "\
WITH RECURSIVE req AS (
    SELECT r.order_id, r.user_id, r.fence, r.at, r.quantity, r.pos
    FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::timestamptz[], $7::int[])
         WITH ORDINALITY AS r(order_id, user_id, fence, at, quantity, pos)
), fence AS (
    INSERT INTO user_fences (user_id, voucher_id, token)
    SELECT user_id, $1, fence FROM req WHERE fence IS NOT NULL ORDER BY user_id
    ON CONFLICT (user_id, voucher_id) DO UPDATE SET token = EXCLUDED.token
    WHERE user_fences.token <= EXCLUDED.token
    RETURNING user_id
), mine AS (
    SELECT r.user_id, o.n, o.live FROM req r, LATERAL (
        SELECT count(*) AS n, max(o.id) FILTER (WHERE o.status IN ('unpaid', 'paid')) AS live
        FROM voucher_orders o
        WHERE o.voucher_id = $1 AND o.user_id = r.user_id
    ) o
    WHERE o.n > 0
), held AS (
    SELECT user_id, live AS id FROM mine WHERE live IS NOT NULL
), maxed AS (
    SELECT user_id FROM mine WHERE n >= $6
), used AS (
    SELECT o.id, o.user_id, o.voucher_id FROM req r, LATERAL (
        SELECT o.id, o.user_id, o.voucher_id FROM voucher_orders o
        WHERE o.id = r.order_id
        LIMIT 1
    ) o
), eligible AS (
    SELECT r.pos, r.order_id, r.user_id, r.at, r.quantity,
           row_number() OVER (ORDER BY r.pos) AS rank
    FROM req r
    WHERE (r.fence IS NULL OR r.user_id IN (SELECT user_id FROM fence))
      AND r.user_id NOT IN (SELECT user_id FROM held)
      AND r.user_id NOT IN (SELECT user_id FROM maxed)
      AND r.order_id NOT IN (SELECT id FROM used)
), locked AS (
    SELECT v.stock, v.pay_within_seconds FROM seckill_vouchers v
    WHERE v.voucher_id = $1 AND EXISTS (SELECT 1 FROM eligible)
    FOR UPDATE
), asks AS (
    SELECT array_agg(quantity ORDER BY rank) AS q, count(*)::int AS n,
           coalesce(sum(quantity), 0) AS total
    FROM eligible
), walk AS (
    SELECT 0 AS i, (SELECT stock FROM locked) AS left_after, false AS granted
    WHERE (SELECT total FROM asks) > (SELECT stock FROM locked)
    UNION ALL
    SELECT w.i + 1,
           CASE WHEN a.q[w.i + 1] <= w.left_after THEN w.left_after - a.q[w.i + 1]
                ELSE w.left_after END,
           a.q[w.i + 1] <= w.left_after
    FROM walk w, asks a
    WHERE w.i < a.n AND w.left_after > 0
), fits AS (
    SELECT e.rank, e.order_id, e.user_id, e.at, e.quantity FROM eligible e
    WHERE (SELECT total FROM asks) <= (SELECT stock FROM locked)
    UNION ALL
    SELECT e.rank, e.order_id, e.user_id, e.at, e.quantity FROM eligible e
    WHERE (SELECT total FROM asks) > (SELECT stock FROM locked)
      AND e.rank = ANY ((SELECT array_agg(w.i) FROM walk w WHERE w.granted)::bigint[])
), granted AS (
    SELECT coalesce((SELECT sum(quantity) FROM fits), 0)::int AS n, stock, pay_within_seconds
    FROM locked
), taken AS (
    UPDATE seckill_vouchers v SET stock = v.stock - g.n
    FROM granted g
    WHERE v.voucher_id = $1 AND g.n > 0
    RETURNING v.stock, v.initial_stock, v.returned
), placed AS (
    INSERT INTO voucher_orders (id, user_id, voucher_id, created_at, status, pay_by, quantity)
    SELECT f.order_id, f.user_id, $1, f.at, 'unpaid',
           f.at + make_interval(secs => g.pay_within_seconds), f.quantity
    FROM fits f, granted g
    RETURNING id
)
SELECT
    CASE
        WHEN r.fence IS NOT NULL AND r.user_id NOT IN (SELECT user_id FROM fence) THEN 'fenced'
        WHEN u.user_id = r.user_id AND u.voucher_id = $1 THEN 'held'
        WHEN h.id IS NOT NULL THEN 'held'
        WHEN u.id IS NOT NULL THEN 'id_taken'
        WHEN r.user_id IN (SELECT user_id FROM maxed) THEN 'too_many'
        WHEN e.rank IN (SELECT rank FROM fits) THEN 'sold'
        WHEN (SELECT stock - n FROM granted) > 0 THEN 'short'
        ELSE 'sold_out'
    END AS outcome,
    CASE WHEN u.user_id = r.user_id AND u.voucher_id = $1 THEN u.id ELSE h.id END AS held_id,
    (SELECT stock - n FROM granted) AS left_units,
    (SELECT stock FROM taken) AS stock,
    (SELECT initial_stock FROM taken) AS initial_stock,
    (SELECT returned FROM taken) AS returned,
    (SELECT count(*) FROM placed) AS placed
FROM req r
LEFT JOIN held h ON h.user_id = r.user_id
LEFT JOIN used u ON u.id = r.order_id
LEFT JOIN eligible e ON e.pos = r.pos
ORDER BY r.pos";

#[derive(FromRow)]
struct Row {
    outcome: String,
    held_id: Option<OrderId>,
    stock: Option<i32>,
    initial_stock: Option<i32>,
    returned: Option<i64>,
    /// Units left after the batch (none when nobody in it was eligible).
    left_units: Option<i32>,
    placed: i64,
}

impl Row {
    /// The statement's word for one purchase, as a [`Sale`]; a word it
    /// never writes is a bug, not a sold-out.
    fn sale(&self) -> Result<Sale> {
        Ok(match (self.outcome.as_str(), self.held_id) {
            ("sold", _) => Sale::Sold,
            ("sold_out", _) => Sale::SoldOut,
            ("short", _) => match self.left_units {
                Some(left) if left > 0 => Sale::Short(left),
                _ => return Err(self.unexpected()),
            },
            ("held", Some(id)) => Sale::Held(id),
            ("fenced", _) => Sale::Fenced,
            ("too_many", _) => Sale::TooMany,
            ("id_taken", _) => Sale::IdTaken,
            _ => return Err(self.unexpected()),
        })
    }

    /// A word the statement never writes, or one without what it needs.
    fn unexpected(&self) -> StoreError {
        StoreError::Other(sqlx::Error::Protocol(format!(
            "the batch statement answered {:?} (held order {:?}, units left {:?})",
            self.outcome, self.held_id, self.left_units
        )))
    }
}

impl Store {
    /// Sells what it can to a batch of purchases of `voucher_id`, whose
    /// users must be distinct, in one statement. Either every write of the
    /// batch commits or none does.
    /// `max_orders` is the voucher's `max_orders_per_user`.
    pub async fn sell_batch(
        &self,
        voucher_id: VoucherId,
        max_orders: i32,
        batch: &[SaleRequest],
    ) -> Result<BatchSale> {
        let order_ids: Vec<OrderId> = batch.iter().map(|r| r.order_id).collect();
        let user_ids: Vec<UserId> = batch.iter().map(|r| r.user_id).collect();
        // The tokens as the numbers SQL compares.
        let fences: Vec<Option<i64>> = batch
            .iter()
            .map(|r| r.fence.map(FencingToken::get))
            .collect();
        let times: Vec<DateTime<Utc>> = batch.iter().map(|r| r.at).collect();
        let quantities: Vec<i32> = batch.iter().map(|r| r.quantity.get()).collect();
        let rows: Vec<Row> = self
            .sale
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(SELL_BATCH)
                        .bind(voucher_id)
                        .bind(order_ids)
                        .bind(user_ids)
                        .bind(fences)
                        .bind(times)
                        .bind(i64::from(max_orders))
                        .bind(quantities)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await?;
        let level = rows.first().and_then(|row| {
            Some(StockLevel {
                stock: row.stock?,
                initial_stock: row.initial_stock?,
                returned: row.returned?,
            })
        });
        let sales = rows.iter().map(Row::sale).collect::<Result<Vec<Sale>>>()?;
        debug_assert_eq!(
            rows.first().map_or(0, |r| r.placed),
            sales.iter().filter(|s| **s == Sale::Sold).count() as i64
        );
        Ok(BatchSale { sales, level })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(outcome: &str, held_id: Option<OrderId>) -> Row {
        Row {
            outcome: outcome.to_owned(),
            held_id,
            stock: None,
            initial_stock: None,
            returned: None,
            left_units: None,
            placed: 0,
        }
    }

    #[test]
    fn each_word_of_the_statement_reads_as_its_sale_and_any_other_is_an_error() {
        let held = OrderId::from_parts(100_000, 7).unwrap();
        let cases = [
            ("sold", None, Sale::Sold),
            ("sold_out", None, Sale::SoldOut),
            ("held", Some(held), Sale::Held(held)),
            ("fenced", None, Sale::Fenced),
            ("too_many", None, Sale::TooMany),
            ("id_taken", None, Sale::IdTaken),
        ];
        for (word, held_id, sale) in cases {
            assert_eq!(row(word, held_id).sale().ok(), Some(sale), "{word}");
        }
        // "held" names the order held; without it the answer is a bug, as
        // is a word the statement never writes.
        for (word, held_id) in [("held", None), ("sold ", None), ("", Some(held))] {
            assert!(row(word, held_id).sale().is_err(), "{word:?}");
        }
    }
}
