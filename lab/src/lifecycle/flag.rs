//! A sold-out flag in one instance's memory while another gives a unit
//! back: a bool that is never reset, or the epoch it was set at.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use sqlx::postgres::PgPool;

use super::rows::{judge, order_ids, CLOSE_AND_RETURN};
use super::{LifeRow, Scenario};

/// One instance's sold-out flag: naive, a bool; right, the epoch it was
/// set at, trusted only while the shared epoch is the same.
struct Instance {
    soldout: AtomicBool,
    epoch: AtomicI64,
}

/// The voucher's epoch: initial stock + units returned (it only grows).
async fn epoch(pool: &PgPool, voucher: i64) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT (initial_stock + returned)::bigint FROM lablife_vouchers WHERE id = $1",
    )
    .bind(voucher)
    .fetch_one(pool)
    .await?)
}

/// A purchase of one unit on `instance`: true when sold.
async fn buy(
    pool: &PgPool,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    instance: &Instance,
    voucher: i64,
    user: i64,
    right: bool,
) -> anyhow::Result<bool> {
    if instance.soldout.load(Ordering::Relaxed) {
        if !right {
            return Ok(false);
        }
        let current: Option<i64> = redis::cmd("GET").arg(key).query_async(conn).await?;
        if current.unwrap_or(0) == instance.epoch.load(Ordering::Relaxed) {
            return Ok(false);
        }
        instance.soldout.store(false, Ordering::Relaxed);
    }
    let sold: Option<(i64,)> = sqlx::query_as(
        "WITH s AS (UPDATE lablife_vouchers SET stock = stock - 1 WHERE id = $1 AND stock > 0 RETURNING id)
         INSERT INTO lablife_orders (voucher_id, user_id, status, pay_by)
         SELECT s.id, $2, 'unpaid', now() + interval '15 minutes' FROM s
         RETURNING id",
    )
    .bind(voucher)
    .bind(user)
    .fetch_optional(pool)
    .await?;
    if sold.is_some() {
        return Ok(true);
    }
    // Sold out: remember it, with the epoch it was seen at.
    instance
        .epoch
        .store(epoch(pool, voucher).await?, Ordering::Relaxed);
    instance.soldout.store(true, Ordering::Relaxed);
    Ok(false)
}

/// Sold out through A, seen sold out by B, every order cancelled through
/// A; then new buyers come to B.
pub(super) async fn soldout_flag(
    pool: &PgPool,
    redis: &redis::Client,
    prefix: &str,
    orders: i64,
    right: bool,
) -> anyhow::Result<LifeRow> {
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let (voucher,): (i64,) = sqlx::query_as(
        "INSERT INTO lablife_vouchers (initial_stock, stock) VALUES ($1, $1) RETURNING id",
    )
    .bind(i32::try_from(orders).unwrap_or(i32::MAX))
    .fetch_one(pool)
    .await?;
    let key = format!("{prefix}lablife:{voucher}:epoch");
    let (a, b) = (
        Instance {
            soldout: AtomicBool::new(false),
            epoch: AtomicI64::new(0),
        },
        Instance {
            soldout: AtomicBool::new(false),
            epoch: AtomicI64::new(0),
        },
    );
    for user in 1..=orders {
        buy(pool, &mut conn, &key, &a, voucher, user, right).await?;
    }
    // B sees it sold out.
    buy(pool, &mut conn, &key, &b, voucher, orders + 1, right).await?;
    for id in order_ids(pool, voucher).await? {
        sqlx::query(CLOSE_AND_RETURN)
            .bind(id)
            .bind("cancelled")
            .execute(pool)
            .await?;
    }
    // A publishes the epoch its returns made (the right design reads it).
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(epoch(pool, voucher).await?)
        .arg("PX")
        .arg(600_000)
        .query_async(&mut conn)
        .await?;
    let mut refused = 0;
    for user in orders + 2..=2 * orders + 1 {
        if !buy(pool, &mut conn, &key, &b, voucher, user, right).await? {
            refused += 1;
        }
    }
    let mut row = judge(pool, voucher, Scenario::SoldoutFlag, right, &HashSet::new()).await?;
    let (stock,): (i32,) = sqlx::query_as("SELECT stock FROM lablife_vouchers WHERE id = $1")
        .bind(voucher)
        .fetch_one(pool)
        .await?;
    row.hidden = i64::from(stock).min(refused);
    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
    Ok(row)
}
