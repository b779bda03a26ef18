//! The lab's order-lifecycle designs: what happens after the grab, done the
//! popular naive way and the right way, each failure in real rows.
//!
//! These designs are statements and process memory, not HTTP: the driver
//! plays the instances itself (each with its own connections and its own
//! memory) on scratch tables of the lab's database (`lablife_*`), so every
//! anomaly counted below is read back from Postgres rows. As in the rest of
//! the lab, the one artificial thing is a fixed stall at the point where a
//! real system pauses (a slow call to the payment provider, a GC pause
//! between a sweeper's read and its write), so that races happen on demand.
//!
//! - `payment_meets_expiry`: a payment and the expiry sweeper both read the
//!   order as `unpaid`, then write their status by primary key. Naive: the
//!   later write wins, so a buyer is told "paid" for a unit that went back
//!   on sale (or a unit is returned for an order that ends paid). Right:
//!   each transition is one `UPDATE ... WHERE status = 'unpaid'` (the
//!   payment also `AND pay_by > now()`), the return in the same statement.
//! - `timeout_twice`: the order's timeout is delivered twice (a delay queue
//!   delivers at least once, or a sweeper runs beside it). Naive: check the
//!   status, then expire and return the unit: both deliveries return it.
//!   Right: the conditional update returns the unit only when it matched.
//! - `soldout_flag`: instance B remembers "sold out" in its memory; a
//!   cancel on instance A gives a unit back. Naive: B's flag is never
//!   reset, so the unit stays unsold while B turns buyers away. Right: the
//!   flag remembers the epoch (initial stock + units returned) it saw;
//!   whoever returns a unit publishes the new epoch, and a flag of an older
//!   epoch is ignored (what the service does, with Redis as the shared place).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::task::JoinSet;

use crate::table::Table;

/// The pause between a read and the write that trusts it.
const STALL: Duration = Duration::from_millis(100);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lablife_vouchers (
    id            BIGSERIAL PRIMARY KEY,
    initial_stock INTEGER NOT NULL,
    stock         INTEGER NOT NULL,
    returned      INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lablife_orders (
    id         BIGSERIAL   PRIMARY KEY,
    voucher_id BIGINT      NOT NULL,
    user_id    BIGINT      NOT NULL,
    status     TEXT        NOT NULL,
    pay_by     TIMESTAMPTZ NOT NULL,
    -- How many times this order's unit went back on sale.
    returns    INTEGER     NOT NULL DEFAULT 0
)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    PaymentMeetsExpiry,
    TimeoutTwice,
    SoldoutFlag,
}

impl Scenario {
    pub const ALL: [Self; 3] = [
        Self::PaymentMeetsExpiry,
        Self::TimeoutTwice,
        Self::SoldoutFlag,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::PaymentMeetsExpiry => "payment_meets_expiry",
            Self::TimeoutTwice => "timeout_twice",
            Self::SoldoutFlag => "soldout_flag",
        }
    }

    fn design(self, right: bool) -> &'static str {
        match (self, right) {
            (Self::PaymentMeetsExpiry, false) => "read, then write by id",
            (Self::TimeoutTwice, false) => "check status, then return",
            (Self::SoldoutFlag, false) => "flag in process memory",
            (Self::SoldoutFlag, true) => "flag with epoch",
            (_, true) => "conditional update",
        }
    }
}

/// One design in one scenario, judged on its rows.
pub struct LifeRow {
    pub scenario: Scenario,
    /// The service's design (true) or the naive one.
    pub right: bool,
    pub orders: i64,
    /// Payments acknowledged to the provider whose order did not end paid.
    pub payments_lost: i64,
    /// Orders that ended paid, yet their unit went back on sale.
    pub paid_units_resold: i64,
    /// Units returned more than once for one order.
    pub returned_twice: i64,
    /// Units left in stock while buyers were told "sold out".
    pub hidden: i64,
    /// stock + live orders - initial stock: units that exist twice (> 0).
    pub phantom: i64,
}

impl LifeRow {
    pub fn broke(&self) -> bool {
        self.payments_lost > 0
            || self.paid_units_resold > 0
            || self.returned_twice > 0
            || self.hidden > 0
            || self.phantom != 0
    }

    /// The right design must hold; the naive one is expected to break.
    pub fn failed(&self) -> bool {
        self.right && self.broke()
    }

    pub fn verdict(&self) -> &'static str {
        match (self.right, self.broke()) {
            (true, true) => "FAILED",
            (true, false) | (false, true) => "as expected",
            (false, false) => "race not seen",
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "scenario": self.scenario.name(),
            "design": self.scenario.design(self.right),
            "right": self.right,
            "orders": self.orders,
            "payments_lost": self.payments_lost,
            "paid_units_resold": self.paid_units_resold,
            "returned_twice": self.returned_twice,
            "hidden": self.hidden,
            "phantom_units": self.phantom,
            "verdict": self.verdict(),
        })
    }
}

/// The naive lifecycle designs beside the right ones, a row each.
pub fn table(rows: &[LifeRow]) -> Table {
    let mut table = Table::new([
        "scenario", "design", "orders", "pay lost", "paid+res", "ret x2", "hidden", "phantom",
        "verdict",
    ]);
    for r in rows {
        table.row([
            r.scenario.name().to_owned(),
            r.scenario.design(r.right).to_owned(),
            r.orders.to_string(),
            r.payments_lost.to_string(),
            r.paid_units_resold.to_string(),
            r.returned_twice.to_string(),
            r.hidden.to_string(),
            r.phantom.to_string(),
            r.verdict().to_owned(),
        ]);
    }
    table
}

/// Every scenario with the naive and the right design, `orders` orders
/// each, on the database at `url` (and, for the flag's epoch, the Redis at
/// `redis_url` under `prefix`).
pub async fn run(
    url: &str,
    redis_url: &str,
    prefix: &str,
    orders: i64,
) -> Result<Vec<LifeRow>, String> {
    let pool = PgPoolOptions::new()
        .max_connections(40)
        .connect(url)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::raw_sql(SCHEMA)
        .execute(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let redis = redis::Client::open(redis_url).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for scenario in Scenario::ALL {
        for right in [false, true] {
            let row = match scenario {
                Scenario::PaymentMeetsExpiry => payment_meets_expiry(&pool, orders, right)
                    .await
                    .map_err(|e| e.to_string()),
                Scenario::TimeoutTwice => timeout_twice(&pool, orders, right)
                    .await
                    .map_err(|e| e.to_string()),
                Scenario::SoldoutFlag => soldout_flag(&pool, &redis, prefix, orders, right).await,
            }
            .map_err(|e| format!("lab {} ({}): {e}", scenario.name(), scenario.design(right)))?;
            eprintln!(
                "lab lifecycle {:<21} {:<26} {}",
                scenario.name(),
                scenario.design(right),
                row.verdict()
            );
            rows.push(row);
        }
    }
    pool.close().await;
    Ok(rows)
}

type Sql<T> = Result<T, sqlx::Error>;

/// A sold-out voucher of `orders` units, each held by an unpaid order due
/// `due_ms` from now.
async fn sold_out_sale(pool: &PgPool, orders: i64, due_ms: i64) -> Sql<i64> {
    let (voucher,): (i64,) = sqlx::query_as(
        "INSERT INTO lablife_vouchers (initial_stock, stock) VALUES ($1, 0) RETURNING id",
    )
    .bind(i32::try_from(orders).unwrap_or(i32::MAX))
    .fetch_one(pool)
    .await?;
    sqlx::query(
        "INSERT INTO lablife_orders (voucher_id, user_id, status, pay_by)
         SELECT $1, u, 'unpaid', now() + make_interval(secs => $3::float8 / 1000) FROM generate_series(1, $2) u",
    )
    .bind(voucher)
    .bind(orders)
    .bind(due_ms as f64)
    .execute(pool)
    .await?;
    Ok(voucher)
}

/// Closes an unpaid order as `status` and returns its unit, in one
/// statement: only a transition that happened returns anything.
const CLOSE_AND_RETURN: &str = "
WITH closed AS (
    UPDATE lablife_orders SET status = $2, returns = returns + 1
    WHERE id = $1 AND status = 'unpaid' AND ($2 <> 'expired' OR pay_by <= now())
    RETURNING voucher_id)
UPDATE lablife_vouchers v SET stock = stock + 1, returned = returned + 1
FROM closed WHERE v.id = closed.voucher_id";

/// Returns the unit of order `id` unconditionally (the naive second step).
const RETURN_UNIT: &str = "
WITH o AS (UPDATE lablife_orders SET returns = returns + 1 WHERE id = $1 RETURNING voucher_id)
UPDATE lablife_vouchers v SET stock = stock + 1, returned = returned + 1 FROM o WHERE v.id = o.voucher_id";

async fn order_ids(pool: &PgPool, voucher: i64) -> Sql<Vec<i64>> {
    let ids: Vec<(i64,)> =
        sqlx::query_as("SELECT id FROM lablife_orders WHERE voucher_id = $1 ORDER BY id")
            .bind(voucher)
            .fetch_all(pool)
            .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

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

/// What the rows say of a voucher.
async fn judge(
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

/// Every order is paid in a window around its deadline (the payment's
/// check lands before it, its write after it) while the sweeper expires
/// what it found due.
async fn payment_meets_expiry(pool: &PgPool, orders: i64, right: bool) -> Sql<LifeRow> {
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
async fn timeout_twice(pool: &PgPool, orders: i64, right: bool) -> Sql<LifeRow> {
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

/// One instance's sold-out flag: naive, a bool; right, the epoch it was
/// set at, trusted only while the shared epoch is the same.
struct Instance {
    soldout: AtomicBool,
    epoch: AtomicI64,
}

/// The voucher's epoch: initial stock + units returned (it only grows).
async fn epoch(pool: &PgPool, voucher: i64) -> Result<i64, String> {
    sqlx::query_scalar(
        "SELECT (initial_stock + returned)::bigint FROM lablife_vouchers WHERE id = $1",
    )
    .bind(voucher)
    .fetch_one(pool)
    .await
    .map_err(|e| e.to_string())
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
) -> Result<bool, String> {
    if instance.soldout.load(Ordering::Relaxed) {
        if !right {
            return Ok(false);
        }
        let current: Option<i64> = redis::cmd("GET")
            .arg(key)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
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
    .await
    .map_err(|e| e.to_string())?;
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
async fn soldout_flag(
    pool: &PgPool,
    redis: &redis::Client,
    prefix: &str,
    orders: i64,
    right: bool,
) -> Result<LifeRow, String> {
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let (voucher,): (i64,) = sqlx::query_as(
        "INSERT INTO lablife_vouchers (initial_stock, stock) VALUES ($1, $1) RETURNING id",
    )
    .bind(i32::try_from(orders).unwrap_or(i32::MAX))
    .fetch_one(pool)
    .await
    .map_err(|e| e.to_string())?;
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
    for id in order_ids(pool, voucher).await.map_err(|e| e.to_string())? {
        sqlx::query(CLOSE_AND_RETURN)
            .bind(id)
            .bind("cancelled")
            .execute(pool)
            .await
            .map_err(|e| e.to_string())?;
    }
    // A publishes the epoch its returns made (the right design reads it).
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(epoch(pool, voucher).await?)
        .arg("PX")
        .arg(600_000)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let mut refused = 0;
    for user in orders + 2..=2 * orders + 1 {
        if !buy(pool, &mut conn, &key, &b, voucher, user, right).await? {
            refused += 1;
        }
    }
    let mut row = judge(pool, voucher, Scenario::SoldoutFlag, right, &HashSet::new())
        .await
        .map_err(|e| e.to_string())?;
    let (stock,): (i32,) = sqlx::query_as("SELECT stock FROM lablife_vouchers WHERE id = $1")
        .bind(voucher)
        .fetch_one(pool)
        .await
        .map_err(|e| e.to_string())?;
    row.hidden = i64::from(stock).min(refused);
    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(right: bool) -> LifeRow {
        LifeRow {
            scenario: Scenario::TimeoutTwice,
            right,
            orders: 10,
            payments_lost: 0,
            paid_units_resold: 0,
            returned_twice: 0,
            hidden: 0,
            phantom: 0,
        }
    }

    #[test]
    fn the_right_design_fails_the_run_when_it_breaks_and_the_naive_one_never_does() {
        assert_eq!(row(true).verdict(), "as expected");
        assert_eq!(row(false).verdict(), "race not seen");
        let broken = |right| LifeRow {
            returned_twice: 3,
            ..row(right)
        };
        assert!(broken(true).failed());
        assert!(!broken(false).failed());
        assert_eq!(broken(false).verdict(), "as expected");
        assert!(LifeRow {
            phantom: -1,
            ..row(true)
        }
        .failed());
    }

    /// The page's claims, on a fresh database: every naive design breaks,
    /// every right one holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_naive_lifecycle_designs_break_and_the_right_ones_hold() {
        use sqlx::Connection;
        let server = crate::service::pg_server();
        let name = format!("seckill_lablife_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
            .await
            .expect("Postgres answers (scripts/deps.sh starts it)");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .unwrap();
        let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
        let rows = run(
            &format!("{server}/{name}"),
            &crate::service::redis_url(),
            &prefix,
            40,
        )
        .await;
        sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .unwrap();
        let rows = rows.expect("the lifecycle lab runs");
        assert_eq!(rows.len(), 2 * Scenario::ALL.len());
        for row in &rows {
            assert_eq!(
                row.broke(),
                !row.right,
                "{}",
                serde_json::to_string(&row.json()).unwrap()
            );
        }
    }

    #[test]
    fn the_scenarios_have_distinct_names() {
        let names: HashSet<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Scenario::ALL.len());
    }
}
