//! The contract's invariants, judged from what a run observed: the admin
//! API's stats and order list, and the answers the crowd got; `check`
//! gathers those (and, for a service this driver started, SQL's count).

use std::collections::{BTreeMap, HashSet};
use std::ops::RangeInclusive;

use crate::api::Stats;
use crate::drive::{answers_where, Tally};
use crate::service::Target;
use seckill::domain::OrderId;

/// What a run saw, to be judged.
pub struct Observed<'a> {
    pub stats: Stats,
    /// (order id, user id) of every order of the voucher.
    pub orders: &'a [(String, i64)],
    /// Order ids the crowd was answered with (200s).
    pub answered: &'a [String],
    /// Count per answer, as the load engine keys them.
    pub statuses: &'a BTreeMap<String, u64>,
    /// Unix seconds an order id of this run may carry.
    pub id_seconds: RangeInclusive<i64>,
    /// The exact number of orders the run must end with, if known.
    pub expected: Option<i64>,
    /// Orders placed before the load (not among `answered`).
    pub placed_before: usize,
}

/// The verdict: the figures of the report, and every broken invariant.
#[derive(Debug, Default)]
pub struct Check {
    pub orders: i64,
    pub stock_left: i64,
    pub oversold: i64,
    pub duplicate_users: i64,
    pub problems: Vec<String>,
}

impl Check {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

pub fn judge(o: &Observed) -> Check {
    let stats = o.stats;
    let mut problems = Vec::new();
    if !stats.conserved() {
        problems.push(format!(
            "units {} (of {} orders, {} pending) + stock {} != initial stock {}",
            stats.units, stats.orders, stats.pending, stats.stock, stats.initial_stock
        ));
    }
    if stats.orders != o.orders.len() as i64 {
        problems.push(format!(
            "stats count {} orders, the listing {}",
            stats.orders,
            o.orders.len()
        ));
    }
    let users: HashSet<i64> = o.orders.iter().map(|(_, u)| *u).collect();
    let duplicate_users = o.orders.len() as i64 - users.len() as i64;
    if duplicate_users != 0 || stats.distinct_users != stats.orders {
        problems.push(format!(
            "{} users hold more than one order",
            duplicate_users.max(stats.orders - stats.distinct_users)
        ));
    }
    let ids: HashSet<&str> = o.orders.iter().map(|(id, _)| id.as_str()).collect();
    if ids.len() != o.orders.len() {
        problems.push("order ids repeat".into());
    }
    for (id, _) in o.orders {
        let Ok(parsed) = id.parse::<OrderId>() else {
            problems.push(format!("order id {id} is not an order id"));
            continue;
        };
        let second = parsed.drawn_at().timestamp();
        if !o.id_seconds.contains(&second) || parsed.sequence() == 0 {
            problems.push(format!(
                "order id {id} does not carry this run's time and a counter"
            ));
        }
    }
    // Every 200 the crowd saw is an order, and every order was a 200 (when
    // no answer was lost in transport).
    let answered: HashSet<&str> = o.answered.iter().map(String::as_str).collect();
    if !answered.is_subset(&ids) {
        problems.push("a purchase answered 200 has no order".into());
    }
    let transport_errors = o.statuses.keys().any(|k| k.starts_with("error"));
    if !transport_errors && answered.len() + o.placed_before != ids.len() {
        problems.push(format!(
            "{} orders exist but {} purchases answered 200",
            ids.len(),
            answered.len() + o.placed_before
        ));
    }
    if let Some(expected) = o.expected {
        if stats.orders != expected {
            problems.push(format!(
                "expected {expected} orders, found {}",
                stats.orders
            ));
        }
    }
    let server_errors = answers_where(o.statuses, |k| k.starts_with('5'));
    if server_errors > 0 {
        problems.push(format!("{server_errors} answers were 5xx"));
    }
    Check {
        orders: stats.orders,
        stock_left: stats.stock,
        oversold: (stats.units - stats.initial_stock).max(0) + (-stats.stock).max(0),
        duplicate_users,
        problems,
    }
}

/// Checks the contract's invariants through the admin API, and in SQL when
/// we started the service. `expected` is the exact order count, if known;
/// `placed_before` counts orders made before the load (the buy-out).
pub(crate) async fn check(
    target: &Target,
    voucher: i64,
    tally: &Tally,
    started_unix: i64,
    expected: Option<i64>,
    placed_before: usize,
) -> anyhow::Result<Check> {
    let admin = target.admin();
    let stats = admin.stats(voucher).await?;
    let orders = admin.orders(voucher).await?;
    let now = chrono::Utc::now().timestamp();
    let mut check = judge(&Observed {
        stats,
        orders: &orders,
        answered: &tally.order_ids,
        statuses: &tally.statuses,
        // Ids are stamped by Redis's clock: allow a few seconds of skew.
        id_seconds: started_unix - 5..=now + 5,
        expected,
        placed_before,
    });
    if let Some(url) = &target.database_url {
        check.problems.extend(sql_check(url, voucher).await?);
    }
    Ok(check)
}

async fn sql_check(url: &str, voucher: i64) -> anyhow::Result<Vec<String>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let books = testkit::Books::read(&mut conn, voucher).await?;
    Ok(books
        .problems()
        .into_iter()
        .map(|problem| format!("SQL: {problem}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn id(second: i64, sequence: u64) -> String {
        OrderId::from_parts(second - seckill::domain::EPOCH_UNIX, sequence)
            .expect("an id in range")
            .to_string()
    }

    /// A clean run: 3 units, 3 buyers, every 200 an order.
    fn clean() -> (Stats, Vec<(String, i64)>, BTreeMap<String, u64>) {
        let orders = vec![(id(NOW, 1), 1), (id(NOW, 2), 2), (id(NOW, 3), 3)];
        let statuses = BTreeMap::from([("200".to_owned(), 3), ("409 sold_out".to_owned(), 10)]);
        let stats = Stats {
            initial_stock: 3,
            stock: 0,
            orders: 3,
            units: 3,
            distinct_users: 3,
            pending: 0,
            unpaid: 3,
            paid: 0,
            cancelled: 0,
            expired: 0,
        };
        (stats, orders, statuses)
    }

    fn judge_with(
        stats: Stats,
        orders: &[(String, i64)],
        answered: &[String],
        statuses: &BTreeMap<String, u64>,
    ) -> Check {
        judge(&Observed {
            stats,
            orders,
            answered,
            statuses,
            id_seconds: NOW - 5..=NOW + 5,
            expected: Some(3),
            placed_before: 0,
        })
    }

    #[test]
    fn a_clean_run_passes() {
        let (stats, orders, statuses) = clean();
        let answered: Vec<String> = orders.iter().map(|(id, _)| id.clone()).collect();
        let check = judge_with(stats, &orders, &answered, &statuses);
        assert!(check.ok(), "{:?}", check.problems);
        assert_eq!((check.oversold, check.duplicate_users), (0, 0));
    }

    #[test]
    fn an_oversell_is_caught() {
        let (_, mut orders, statuses) = clean();
        orders.push((id(NOW, 4), 4));
        let stats = Stats {
            initial_stock: 3,
            stock: -1,
            orders: 4,
            units: 4,
            distinct_users: 4,
            pending: 0,
            unpaid: 4,
            paid: 0,
            cancelled: 0,
            expired: 0,
        };
        let answered: Vec<String> = orders.iter().map(|(id, _)| id.clone()).collect();
        let check = judge_with(stats, &orders, &answered, &statuses);
        assert!(!check.ok());
        assert_eq!(check.oversold, 2);
    }

    #[test]
    fn a_second_order_of_one_user_is_caught() {
        let (mut stats, mut orders, statuses) = clean();
        orders[2].1 = 1;
        stats.distinct_users = 2;
        let answered: Vec<String> = orders.iter().map(|(id, _)| id.clone()).collect();
        let check = judge_with(stats, &orders, &answered, &statuses);
        assert_eq!(check.duplicate_users, 1);
        assert!(!check.ok());
    }

    #[test]
    fn repeated_or_misdated_ids_lost_orders_and_5xx_are_caught() {
        let (stats, orders, statuses) = clean();
        let answered: Vec<String> = orders.iter().map(|(id, _)| id.clone()).collect();

        let mut repeated = orders.clone();
        repeated[1].0 = repeated[0].0.clone();
        assert!(!judge_with(stats, &repeated, &answered, &statuses).ok());

        let mut misdated = orders.clone();
        misdated[0].0 = id(NOW - 3600, 1);
        assert!(!judge_with(stats, &misdated, &answered, &statuses).ok());

        let phantom = [answered.clone(), vec![id(NOW, 99)]].concat();
        assert!(!judge_with(stats, &orders, &phantom, &statuses).ok());
        assert!(!judge_with(stats, &orders, &answered[..2], &statuses).ok());

        let mut failing = statuses.clone();
        failing.insert("503 unavailable".into(), 1);
        assert!(!judge_with(stats, &orders, &answered, &failing).ok());
    }
}
