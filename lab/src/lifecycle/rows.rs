//! What every design's rows share: a sold-out sale of unpaid orders, the
//! statements that close an order and return its unit, and the verdict
//! the rows give.

use std::collections::HashSet;

use sqlx::postgres::PgPool;

use super::{LifeRow, Scenario};

pub(super) type Sql<T> = Result<T, sqlx::Error>;

/// A sold-out voucher of `orders` units, each held by an unpaid order whose
/// deadline is a quarter of an hour away until [`deadline_passes`].
pub(super) async fn sold_out_sale(pool: &PgPool, orders: i64) -> Sql<i64> {
    let (voucher,): (i64,) = sqlx::query_as(
        "INSERT INTO lablife_vouchers (initial_stock, stock) VALUES ($1, 0) RETURNING id",
    )
    .bind(i32::try_from(orders).unwrap_or(i32::MAX))
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO lablife_orders (voucher_id, user_id, status, pay_by)
         SELECT $1, u, 'unpaid', now() + interval '15 minutes' FROM generate_series(1, $2) u",
    )
    .bind(voucher)
    .bind(orders)
    .execute(pool)
    .await?;
    Ok(voucher)
}

/// The deadline of every order of `voucher` passes now: the lab moves it
/// rather than waits for it, so that what must land before it does, however
/// late the machine runs it.
pub(super) async fn deadline_passes(pool: &PgPool, voucher: i64) -> Sql<()> {
    sqlx::query("UPDATE lablife_orders SET pay_by = now() WHERE voucher_id = $1")
        .bind(voucher)
        .execute(pool)
        .await?;
    Ok(())
}

/// Closes an unpaid order as `status` and returns its unit, in one
/// statement: only a transition that happened returns anything.
pub(super) const CLOSE_AND_RETURN: &str = "
WITH closed AS (
    UPDATE lablife_orders SET status = $2, returns = returns + 1
    WHERE id = $1 AND status = 'unpaid' AND ($2 <> 'expired' OR pay_by <= now())
    RETURNING voucher_id)
UPDATE lablife_vouchers v SET stock = stock + 1, returned = returned + 1
FROM closed WHERE v.id = closed.voucher_id";

/// Returns the unit of order `id` unconditionally (the naive second step).
pub(super) const RETURN_UNIT: &str = "
WITH o AS (UPDATE lablife_orders SET returns = returns + 1 WHERE id = $1 RETURNING voucher_id)
UPDATE lablife_vouchers v SET stock = stock + 1, returned = returned + 1 FROM o WHERE v.id = o.voucher_id";

pub(super) async fn order_ids(pool: &PgPool, voucher: i64) -> Sql<Vec<i64>> {
    let ids: Vec<(i64,)> =
        sqlx::query_as("SELECT id FROM lablife_orders WHERE voucher_id = $1 ORDER BY id")
            .bind(voucher)
            .fetch_all(pool)
            .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

/// What the rows say of a voucher.
pub(super) async fn judge(
    pool: &PgPool,
    voucher: i64,
    scenario: Scenario,
    right: bool,
    paid_acked: &HashSet<i64>,
) -> Sql<LifeRow> {
    let rows: Vec<(i64, String, i32)> =
        sqlx::query_as("SELECT id, status, returns FROM lablife_orders WHERE voucher_id = $1")
            .bind(voucher)
            .fetch_all(pool)
            .await?;
    let (initial, stock): (i32, i32) =
        sqlx::query_as("SELECT initial_stock, stock FROM lablife_vouchers WHERE id = $1")
            .bind(voucher)
            .fetch_one(pool)
            .await?;
    let live = rows
        .iter()
        .filter(|(_, s, _)| s == "unpaid" || s == "paid")
        .count() as i64;
    Ok(LifeRow {
        scenario,
        right,
        orders: rows.len() as i64,
        payments_lost: rows
            .iter()
            .filter(|(id, s, _)| paid_acked.contains(id) && s != "paid")
            .count() as i64,
        paid_units_resold: rows
            .iter()
            .filter(|(_, s, r)| s == "paid" && *r > 0)
            .count() as i64,
        returned_twice: rows
            .iter()
            .map(|(_, _, r)| i64::from((*r - 1).max(0)))
            .sum(),
        hidden: 0,
        phantom: i64::from(stock) + live - i64::from(initial),
    })
}
