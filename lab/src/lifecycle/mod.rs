//! The lab's order-lifecycle designs: what happens after the grab, done the
//! popular naive way and the right way, each failure in real rows.
//!
//! These designs are statements and process memory, not HTTP: [`run`]
//! plays the instances itself (each with its own connections and its own
//! memory) on scratch tables of the lab's database (`lablife_*`), so every
//! anomaly counted below is read back from Postgres rows. The artificial
//! things are the clock and a pause where a real system pauses (a slow call
//! to the payment provider, a GC pause between a sweeper's read and its
//! write): there, where the rest of the lab stalls for a fixed time, each
//! actor here waits until the actors it races have read too, and the lab
//! moves an order's deadline rather than wait for it. So the races happen
//! on every run, in the order each scenario states, however busy the
//! machine; a design that does not race shows it in its row.
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

mod flag;
mod pause;
mod rows;
mod transitions;

use anyhow::Context;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;

use flag::soldout_flag;
use transitions::{payment_meets_expiry, timeout_twice};

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

    /// The design's name: the service's (`right`) or the naive one.
    pub fn design(self, right: bool) -> &'static str {
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

/// Every scenario with the naive and the right design, `orders` orders
/// each, on the database at `url` (and, for the flag's epoch, the Redis at
/// `redis_url` under `prefix`).
pub async fn run(
    url: &str,
    redis_url: &str,
    prefix: &str,
    orders: i64,
) -> anyhow::Result<Vec<LifeRow>> {
    let pool = PgPoolOptions::new()
        .max_connections(40)
        .connect(url)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    let redis = redis::Client::open(redis_url)?;
    let mut rows = Vec::new();
    for scenario in Scenario::ALL {
        for right in [false, true] {
            let row = match scenario {
                Scenario::PaymentMeetsExpiry => payment_meets_expiry(&pool, orders, right)
                    .await
                    .map_err(anyhow::Error::from),
                Scenario::TimeoutTwice => timeout_twice(&pool, orders, right)
                    .await
                    .map_err(anyhow::Error::from),
                Scenario::SoldoutFlag => soldout_flag(&pool, &redis, prefix, orders, right).await,
            }
            .with_context(|| format!("lab {} ({})", scenario.name(), scenario.design(right)))?;
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

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
        let server = testkit::pg_server();
        let run_id = format!("{}_{}", std::process::id(), testkit::free_port().unwrap());
        let name = format!("seckill_lablife_{run_id}");
        let mut admin = sqlx::PgConnection::connect(&format!("{server}/postgres"))
            .await
            .expect("Postgres answers (scripts/deps.sh starts it)");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .unwrap();
        let prefix = format!("test:lablife:{run_id}:");
        let rows = run(
            &format!("{server}/{name}"),
            &testkit::redis_url(),
            &prefix,
            40,
        )
        .await;
        testkit::drop_database(&name, &prefix).await;
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
