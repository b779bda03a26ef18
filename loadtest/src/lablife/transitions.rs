//! A payment racing the expiry sweeper, and a timeout delivered twice:
//! each done naively, then as one conditional statement.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::postgres::PgPool;
use tokio::task::JoinSet;

use super::rows::{judge, order_ids, sold_out_sale, Sql, CLOSE_AND_RETURN, RETURN_UNIT};
use super::{LifeRow, Scenario, STALL};

/// Pays order `id`: true when the provider is told "paid". The naive
/// payment checks, talks to the provider (the stall), then writes by id;
/// the right one is one conditional statement when the notification lands.
async fn pay(pool: PgPool, id: i64, right: bool) -> Sql<bool> {
    if right {
        let done = sqlx::query(
            "UPDATE lablife_orders SET status = 'paid'
             WHERE id = $1 AND status = 'unpaid' AND pay_by > now()",
        )
        .bind(id)
        .execute(&pool)
        .await?;
        return Ok(done.rows_affected() == 1);
    }
    let (payable,): (bool,) = sqlx::query_as(
        "SELECT status = 'unpaid' AND pay_by > now() FROM lablife_orders WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await?;
    if !payable {
        return Ok(false);
    }
    tokio::time::sleep(STALL).await;
    sqlx::query("UPDATE lablife_orders SET status = 'paid' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await?;
    Ok(true)
}

/// The sweeper, once its orders are due: naive, it reads the due unpaid
/// orders, pauses, then expires each by id and returns its unit.
async fn sweep(pool: &PgPool, voucher: i64, right: bool) -> Sql<()> {
    let due: Vec<(i64,)> = sqlx::query_as(
        "SELECT id FROM lablife_orders WHERE voucher_id = $1 AND status = 'unpaid' AND pay_by <= now()",
    )
    .bind(voucher)
    .fetch_all(pool)
    .await?;
    tokio::time::sleep(STALL).await;
    for (id,) in due {
        if right {
            sqlx::query(CLOSE_AND_RETURN)
                .bind(id)
                .bind("expired")
                .execute(pool)
                .await?;
        } else {
            sqlx::query("UPDATE lablife_orders SET status = 'expired' WHERE id = $1")
                .bind(id)
                .execute(pool)
                .await?;
            sqlx::query(RETURN_UNIT).bind(id).execute(pool).await?;
        }
    }
    Ok(())
}

/// Every order is paid in a window around its deadline (the payment's
/// check lands before it, its write after it) while the sweeper expires
/// what it found due.
pub(super) async fn payment_meets_expiry(pool: &PgPool, orders: i64, right: bool) -> Sql<LifeRow> {
    let due_ms = 300;
    let voucher = sold_out_sale(pool, orders, due_ms).await?;
    let ids = order_ids(pool, voucher).await?;
    let mut payments = JoinSet::new();
    for (i, &id) in ids.iter().enumerate() {
        let pool = pool.clone();
        // Checks from 80 ms before the deadline to 20 ms after it.
        let at = Duration::from_millis((due_ms - 80) as u64 + (i as u64 % 100));
        payments.spawn(async move {
            tokio::time::sleep(at).await;
            pay(pool, id, right).await.map(|acked| (id, acked))
        });
    }
    tokio::time::sleep(Duration::from_millis(due_ms as u64 + 5)).await;
    sweep(pool, voucher, right).await?;
    let mut acked = HashSet::new();
    while let Some(done) = payments.join_next().await {
        let (id, ok) = done.expect("a payment task panicked")?;
        if ok {
            acked.insert(id);
        }
    }
    // A second sweep for what the first did not find due.
    sweep(pool, voucher, right).await?;
    judge(pool, voucher, Scenario::PaymentMeetsExpiry, right, &acked).await
}

/// Two consumers get every order's timeout, at the deadline.
pub(super) async fn timeout_twice(pool: &PgPool, orders: i64, right: bool) -> Sql<LifeRow> {
    let due_ms = 100;
    let voucher = sold_out_sale(pool, orders, due_ms).await?;
    let ids = order_ids(pool, voucher).await?;
    tokio::time::sleep(Duration::from_millis(due_ms as u64 + 5)).await;
    let mut deliveries = JoinSet::new();
    for &id in ids.iter().chain(ids.iter()) {
        let pool = pool.clone();
        deliveries.spawn(async move {
            if right {
                sqlx::query(CLOSE_AND_RETURN)
                    .bind(id)
                    .bind("expired")
                    .execute(&pool)
                    .await?;
                return Ok(());
            }
            let (unpaid,): (bool,) =
                sqlx::query_as("SELECT status = 'unpaid' FROM lablife_orders WHERE id = $1")
                    .bind(id)
                    .fetch_one(&pool)
                    .await?;
            if unpaid {
                tokio::time::sleep(STALL).await;
                sqlx::query("UPDATE lablife_orders SET status = 'expired' WHERE id = $1")
                    .bind(id)
                    .execute(&pool)
                    .await?;
                sqlx::query(RETURN_UNIT).bind(id).execute(&pool).await?;
            }
            Ok::<_, sqlx::Error>(())
        });
    }
    while let Some(done) = deliveries.join_next().await {
        done.expect("a timeout task panicked")?;
    }
    judge(
        pool,
        voucher,
        Scenario::TimeoutTwice,
        right,
        &HashSet::new(),
    )
    .await
}
