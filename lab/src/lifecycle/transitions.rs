//! A payment racing the expiry sweeper, and a timeout delivered twice:
//! each done naively, then as one conditional statement.

use std::collections::HashSet;
use std::future::Future;

use sqlx::postgres::PgPool;
use tokio::task::JoinSet;

use super::pause::Pause;
use super::rows::{
    deadline_passes, judge, order_ids, sold_out_sale, Sql, CLOSE_AND_RETURN, RETURN_UNIT,
};
use super::{LifeRow, Scenario};

/// Of every `LATE_EVERY` payments, one lands after its deadline; the others
/// land before it.
const LATE_EVERY: usize = 5;

/// Pays order `id`: true when the provider is told "paid". The naive
/// payment checks, talks to the provider (`pause`), then writes by id; the
/// right one is one conditional statement when the notification lands, and
/// has nothing left to write after the pause.
async fn pay(pool: PgPool, id: i64, right: bool, pause: Option<Pause>) -> Sql<bool> {
    if right {
        let done = sqlx::query(
            "UPDATE lablife_orders SET status = 'paid'
             WHERE id = $1 AND status = 'unpaid' AND pay_by > now()",
        )
        .bind(id)
        .execute(&pool)
        .await?;
        if let Some(pause) = pause {
            pause.wait().await;
        }
        return Ok(done.rows_affected() == 1);
    }
    let (payable,): (bool,) = sqlx::query_as(
        "SELECT status = 'unpaid' AND pay_by > now() FROM lablife_orders WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await?;
    if let Some(pause) = pause {
        pause.wait().await;
    }
    if !payable {
        return Ok(false);
    }
    sqlx::query("UPDATE lablife_orders SET status = 'paid' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await?;
    Ok(true)
}

/// The sweeper: it reads the due unpaid orders, pauses (`pause`: whatever
/// happens meanwhile, its result returned), then expires each order it
/// read, naive by id and returning its unit, right in one conditional
/// statement.
async fn sweep<T>(
    pool: &PgPool,
    voucher: i64,
    right: bool,
    pause: impl Future<Output = Sql<T>>,
) -> Sql<T> {
    let due: Vec<(i64,)> = sqlx::query_as(
        "SELECT id FROM lablife_orders WHERE voucher_id = $1 AND status = 'unpaid' AND pay_by <= now()",
    )
    .bind(voucher)
    .fetch_all(pool)
    .await?;
    let meanwhile = pause.await?;
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
    Ok(meanwhile)
}

/// Every order is paid around its deadline while the sweeper expires what
/// it found due, in this order: the payments that land in time check
/// (right: pay) and pause; the deadline passes; the sweeper reads the due
/// orders and pauses; the paused payments write, the late ones land (and
/// are refused); then the sweeper writes.
pub(super) async fn payment_meets_expiry(pool: &PgPool, orders: i64, right: bool) -> Sql<LifeRow> {
    let voucher = sold_out_sale(pool, orders).await?;
    let ids = order_ids(pool, voucher).await?;
    let (mut late, mut in_time) = (Vec::new(), Vec::new());
    for (i, &id) in ids.iter().enumerate() {
        if (i + 1) % LATE_EVERY == 0 {
            late.push(id);
        } else {
            in_time.push(id);
        }
    }
    let provider = Pause::new(in_time.len());
    let mut payments = JoinSet::new();
    for id in in_time {
        let (pool, pause) = (pool.clone(), provider.clone());
        payments.spawn(async move { pay(pool, id, right, Some(pause)).await.map(|a| (id, a)) });
    }
    provider.reads().await;
    deadline_passes(pool, voucher).await?;
    let acked = sweep(pool, voucher, right, async {
        provider.release().await;
        for id in late {
            let pool = pool.clone();
            payments.spawn(async move { pay(pool, id, right, None).await.map(|a| (id, a)) });
        }
        let mut acked = HashSet::new();
        while let Some(done) = payments.join_next().await {
            let (id, ok) = done.expect("a payment task panicked")?;
            if ok {
                acked.insert(id);
            }
        }
        Ok(acked)
    })
    .await?;
    judge(pool, voucher, Scenario::PaymentMeetsExpiry, right, &acked).await
}

/// Two consumers get every order's timeout, at the deadline: both check
/// the order (right: nothing to check) and pause until every check is done,
/// then both act on it.
pub(super) async fn timeout_twice(pool: &PgPool, orders: i64, right: bool) -> Sql<LifeRow> {
    let voucher = sold_out_sale(pool, orders).await?;
    let ids = order_ids(pool, voucher).await?;
    deadline_passes(pool, voucher).await?;
    let pause = Pause::new(2 * ids.len());
    let mut deliveries = JoinSet::new();
    for &id in ids.iter().chain(ids.iter()) {
        let (pool, pause) = (pool.clone(), pause.clone());
        deliveries.spawn(async move {
            if right {
                pause.wait().await;
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
            pause.wait().await;
            if unpaid {
                sqlx::query("UPDATE lablife_orders SET status = 'expired' WHERE id = $1")
                    .bind(id)
                    .execute(&pool)
                    .await?;
                sqlx::query(RETURN_UNIT).bind(id).execute(&pool).await?;
            }
            Ok::<_, sqlx::Error>(())
        });
    }
    pause.reads().await;
    pause.release().await;
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
