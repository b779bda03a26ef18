//! Orders per second of three ways to sell one hot voucher, in the lab's
//! own run, on its first instance: `for_update` (the voucher's row locked
//! across a transaction of five statements), `stock_gt_zero` (the
//! conditional `UPDATE`, one statement after the "already bought?" read)
//! and the service's own sale, `POST /seckill/{id}` (the conditional
//! `UPDATE` of many purchases in one transaction: group commit).
//!
//! Each run is distinct users buying one unit each of a fresh voucher whose
//! stock cannot run out, for `--rate-seconds`; the three take turns,
//! `--repeat` rounds, each round starting with the next design, so that
//! the machine's drift spreads over all of them. The rate counts the
//! orders the voucher's stats hold at the end, over the run's time.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::LabArgs;
use crate::api::{Admin, SaleMode};
use crate::drive::{self, Plan, Request, Tally};
use crate::service::Target;
use crate::table::Table;
use crate::{median, round};

/// A design whose rate is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Design {
    /// Its name in the table.
    pub name: &'static str,
    /// The lab strategy; `None`: the service's own sale.
    pub strategy: Option<&'static str>,
    /// What one purchase does in Postgres.
    pub purchase: &'static str,
}

pub const DESIGNS: [Design; 3] = [
    Design {
        name: "`for_update`",
        strategy: Some("for_update"),
        purchase: "BEGIN; SELECT ... FOR UPDATE; order check; UPDATE; INSERT; COMMIT: the row held throughout",
    },
    Design {
        name: "`stock_gt_zero`",
        strategy: Some("stock_gt_zero"),
        purchase: "order check; one UPDATE ... stock > 0 with its INSERT, committed alone",
    },
    Design {
        name: "the service (group commit)",
        strategy: None,
        purchase: "the conditional UPDATE of up to 256 purchases in one transaction",
    },
];

/// One run of one design.
pub struct Run {
    pub design: Design,
    pub round: u32,
    pub orders: i64,
    pub orders_per_sec: f64,
    /// Every order its own user, and the stock plus the orders the initial
    /// stock.
    pub ok: bool,
    pub tally: Tally,
}

impl Run {
    fn json(&self) -> Value {
        json!({
            "design": self.design.strategy.unwrap_or("service"),
            "round": self.round,
            "requests": self.tally.requests,
            "orders": self.orders,
            "orders_per_sec": round(self.orders_per_sec),
            "p50_ms": round(self.tally.ms(0.50)),
            "p99_ms": round(self.tally.ms(0.99)),
            "exhausted": self.tally.exhausted,
            "ok": self.ok,
            "status": self.tally.statuses,
        })
    }
}

/// Every round of every design, in the order run.
pub async fn run(target: &Target, args: &LabArgs) -> anyhow::Result<Vec<Run>> {
    let admin = target.admin();
    eprintln!("lab rates: minting {} tokens", args.rate_users);
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, args.rate_users).await?;
    let base: Arc<str> = Arc::from(target.bases[0].as_str());
    let rounds = args.repeat.max(1);
    let mut runs = Vec::new();
    for round in 1..=rounds {
        let mut designs = DESIGNS;
        designs.rotate_left((round as usize - 1) % DESIGNS.len());
        for design in designs {
            let run = one(&admin, &base, &tokens, design, round, args).await?;
            eprintln!(
                "lab rates [{round}/{rounds}] {:<28} {:>8.0} orders/s{}",
                design.name,
                run.orders_per_sec,
                if run.ok { "" } else { "  BROKEN" }
            );
            runs.push(run);
        }
    }
    Ok(runs)
}

async fn one(
    admin: &Admin,
    base: &Arc<str>,
    tokens: &[Arc<str>],
    design: Design,
    round: u32,
    args: &LabArgs,
) -> anyhow::Result<Run> {
    let (voucher, path) = match design.strategy {
        Some(strategy) => {
            let voucher = admin.lab_voucher(i64::from(i32::MAX)).await?;
            (voucher, format!("/lab/{strategy}/seckill/{voucher}"))
        }
        None => {
            let voucher = admin.endless_voucher(SaleMode::Sync).await?;
            (voucher, format!("/seckill/{voucher}"))
        }
    };
    let plan: Vec<Request> = tokens
        .iter()
        .map(|token| Request::post_to(base.clone(), path.clone(), token.clone()))
        .collect();
    let label = format!("rate {}", design.strategy.unwrap_or("service"));
    let limit = Duration::from_secs(args.rate_seconds);
    let tally = drive::drive(base, Plan::Once(limit, plan), args.connections, &label).await;
    let (orders, ok) = match design.strategy {
        Some(_) => {
            let s = admin.lab_stats(voucher).await?;
            let ok = s.orders == s.distinct_users && s.stock + s.orders == s.initial_stock;
            (s.orders, ok)
        }
        None => {
            let s = admin.stats(voucher).await?;
            (s.orders, s.conserved() && s.orders == s.distinct_users)
        }
    };
    let orders_per_sec = orders as f64 / tally.elapsed.as_secs_f64().max(1e-9);
    Ok(Run {
        design,
        round,
        orders,
        orders_per_sec,
        ok,
        tally,
    })
}

/// A row per design: its median rate over the rounds and their spread,
/// the median latencies, the answers that were not an order.
pub fn table(runs: &[Run]) -> Table {
    let rounds = runs.iter().map(|r| r.round).max().unwrap_or(0);
    let mut table = Table::new([
        "design",
        "one purchase in Postgres",
        "runs",
        "orders/s",
        "min-max",
        "p50 ms",
        "p99 ms",
        "not 200",
        "invariants",
    ]);
    for design in DESIGNS {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.design == design).collect();
        if mine.is_empty() {
            continue;
        }
        let rates: Vec<f64> = mine.iter().map(|r| r.orders_per_sec).collect();
        let (min, max) = rates
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        let not_ok: u64 = mine
            .iter()
            .map(|r| r.tally.requests - r.tally.count("200"))
            .sum();
        table.row([
            design.name.to_owned(),
            design.purchase.to_owned(),
            format!("{}/{rounds}", mine.len()),
            format!("{:.0}", median(rates)),
            format!("{min:.0}-{max:.0}"),
            format!(
                "{:.1}",
                median(mine.iter().map(|r| r.tally.ms(0.50)).collect())
            ),
            format!(
                "{:.1}",
                median(mine.iter().map(|r| r.tally.ms(0.99)).collect())
            ),
            not_ok.to_string(),
            if mine.iter().all(|r| r.ok) {
                "ok"
            } else {
                "BROKEN"
            }
            .to_owned(),
        ]);
    }
    table
}

pub fn json(runs: &[Run]) -> Value {
    Value::Array(runs.iter().map(Run::json).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(design: Design, round: u32, rate: f64) -> Run {
        Run {
            design,
            round,
            orders: rate as i64,
            orders_per_sec: rate,
            ok: true,
            tally: Tally::new(),
        }
    }

    #[test]
    fn a_row_per_design_with_its_median_and_spread() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let runs = [
            run(DESIGNS[0], 1, 400.0),
            run(DESIGNS[1], 1, 1500.0),
            run(DESIGNS[0], 2, 300.0),
            run(DESIGNS[1], 2, 1700.0),
            run(DESIGNS[0], 3, 500.0),
        ];
        let md = table(&runs).markdown();
        assert!(
            md.contains("| `for_update` | BEGIN; SELECT ... FOR UPDATE;"),
            "{md}"
        );
        assert!(md.contains("| 3/3 | 400 | 300-500 |"), "{md}");
        assert!(md.contains("| 2/3 | 1600 | 1500-1700 |"), "{md}");
        assert!(!md.contains("group commit"), "a design not run has no row");
    }
}
