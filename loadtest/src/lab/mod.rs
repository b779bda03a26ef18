//! `loadtest lab`: every lab strategy on one and on two instances, with no
//! stall and with a stall past the lease (before the sale, and before the
//! release), judged on the lab's rows; one table, and its JSON.
//!
//! Without a stall a row is a crowd: each user sends its requests at once
//! (spread over the instances) for scarce stock. With a stall a row is a
//! set of pairs: a user's request A takes the guard and stalls for 1.7
//! leases; its request B starts 1.2 leases later on the other instance (if
//! there are two), retries while told "in progress", and stalls the same
//! way. That interleaving is the one every lease-expiry story tells.
//!
//! With `--repeat N` each cell is run N times (a fresh voucher each time),
//! and the grid shows each anomaly's spread over the runs (min-max).

mod cell;
mod grid;
mod rates;
mod report;
mod row;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::service::{self, Launch, Target};
use crate::TargetArgs;
use cell::{crowd, pairs, Cell};
use grid::{cells, grid, table, CellRuns};
use row::Row;

/// The strategies, in the order LAB.md tells them.
pub const STRATEGIES: [&str; 13] = [
    "naive",
    "version",
    "stock_gt_zero",
    "lock_before_commit",
    "process_mutex",
    "setnx",
    "setnx_owner",
    "reentrant",
    "fenced",
    "for_update",
    "redis_decr",
    "redis_lua",
    "redis_stream",
];

/// The designs whose stock lives in Redis: their rows are a crowd and a
/// crowd in which every other request crashes between Redis and Postgres.
fn redis_stock(strategy: &str) -> bool {
    strategy.starts_with("redis_")
}

/// The designs whose guard is held inside an open Postgres transaction:
/// their rows are a crowd only. A stall there would hold a pooled
/// connection (and for `for_update` the voucher's row) for 1.7 leases per
/// pair, so 50 pairs would queue past the service's deadline on the pool
/// and the row: the cell would measure the queue, not the design. Neither
/// holds a lease for a stall to outlive.
fn in_transaction(strategy: &str) -> bool {
    ["lock_before_commit", "for_update"].contains(&strategy)
}

/// The scenarios a strategy runs, in the grid's order.
fn stalls(strategy: &str) -> Vec<Stall> {
    if redis_stock(strategy) {
        vec![Stall::None, Stall::Crash]
    } else if in_transaction(strategy) {
        vec![Stall::None]
    } else {
        vec![Stall::None, Stall::Sale, Stall::Release]
    }
}

#[derive(clap::Args, Clone)]
pub struct LabArgs {
    /// Crowd rows: users, each sending --per-user requests at once.
    #[arg(long, default_value_t = 300)]
    pub users: i64,
    #[arg(long, default_value_t = 2)]
    pub per_user: usize,
    /// Crowd rows: units for sale.
    #[arg(long, default_value_t = 100)]
    pub stock: i64,
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    /// Stall rows: users, each sending one stalled pair.
    #[arg(long, default_value_t = 50)]
    pub pairs: i64,
    /// Lease of the lab's locks (SECKILL_LAB_LEASE_MS of the instances).
    #[arg(long, default_value_t = 500)]
    pub lease_ms: u64,
    /// Orders of each order-lifecycle design's row.
    #[arg(long, default_value_t = 200)]
    pub lifecycle_orders: i64,
    /// Only this strategy (repeatable; all when not given).
    #[arg(long)]
    pub strategy: Vec<String>,
    /// Seconds of each run of the rates (orders/s of `for_update`,
    /// `stock_gt_zero` and the service's group commit, one instance,
    /// `--repeat` rounds); 0 leaves them out.
    #[arg(long, default_value_t = 5)]
    pub rate_seconds: u64,
    /// Distinct users of each run of the rates (each buys once).
    #[arg(long, default_value_t = 100_000)]
    pub rate_users: i64,
    /// Runs of each cell (a fresh voucher each); the grid shows each
    /// anomaly's min-max over them. Rounds of the rates, too.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
}

impl LabArgs {
    /// The lease, at least 50 ms so that stalls and delays stay apart.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.max(50))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    None,
    Sale,
    Release,
    /// Every other request dies between the Redis step and Postgres.
    Crash,
}

impl Stall {
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Sale => "sale",
            Self::Release => "release",
            Self::Crash => "crash",
        }
    }
}

/// What LAB.md claims of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Holds,
    Breaks,
    /// The lab makes no claim (a stall where the strategy has no guard).
    Nothing,
}

/// The claims, row by row; they are what the tests assert too.
pub fn expect(strategy: &str, instances: usize, stall: Stall) -> Expect {
    use Expect::{Breaks, Holds, Nothing};
    match (strategy, instances, stall) {
        ("redis_decr", _, _) | ("redis_lua", _, Stall::Crash) => Breaks,
        ("redis_lua" | "redis_stream", _, _) => Holds,
        // The lock is given back before the commit: the user's next
        // request checks in between, on one instance as on two.
        ("lock_before_commit", _, _) => Breaks,
        ("for_update", _, _) => Holds,
        ("naive" | "version" | "stock_gt_zero", _, Stall::None) => Breaks,
        ("naive" | "version" | "stock_gt_zero", _, _) => Nothing,
        ("process_mutex", 1, _) => Holds,
        ("process_mutex", _, Stall::Release) => Nothing,
        ("process_mutex", _, _) => Breaks,
        (_, _, Stall::None) => Holds,
        ("reentrant", _, Stall::Release) | ("fenced", _, _) => Holds,
        _ => Breaks,
    }
}

impl Expect {
    pub fn name(self) -> &'static str {
        match self {
            Self::Holds => "holds",
            Self::Breaks => "breaks",
            Self::Nothing => "-",
        }
    }
}

/// The lab starts its own two instances with the lab on: no deployment
/// should serve it. `Ok(false)`: a design broke a guarantee it gives.
pub async fn run(target: &TargetArgs, args: &LabArgs) -> anyhow::Result<bool> {
    target.starts_its_own("lab starts its own two instances of seckill-lab (SECKILL_LAB=1)")?;
    let lease = args.lease();
    let launch = Launch {
        lab: true,
        ..target.launch(
            2,
            vec![
                ("SECKILL_LAB".into(), "1".into()),
                ("SECKILL_LAB_LEASE_MS".into(), lease.as_millis().to_string()),
            ],
        )
    };
    let target = Target::start(launch).await?;
    let steps = service::unless_interrupted(async {
        let result = run_grid(&target, args).await;
        let rates = match &result {
            Ok(_) if args.rate_seconds > 0 && args.strategy.is_empty() => {
                rates::run(&target, args).await
            }
            _ => Ok(Vec::new()),
        };
        let life = match (&result, &target.database_url) {
            (Ok(_), Some(url)) => {
                let prefix = format!("lablife:{}:", uuid::Uuid::new_v4().simple());
                let orders = args.lifecycle_orders;
                Some(seckill_lab::lifecycle::run(url, &service::redis_url(), &prefix, orders).await)
            }
            _ => None,
        };
        Ok((result, rates, life))
    })
    .await;
    target.stop().await;
    let (result, rates, life) = steps?;
    let rows = result?;
    let rates = rates?;
    let life = life.transpose()?.unwrap_or_default();
    Ok(report::finish(args, &rows, &rates, &life))
}

/// Runs every row against `target` (started with the lab on, two
/// instances); rows in the order printed.
async fn run_grid(target: &Target, args: &LabArgs) -> anyhow::Result<Vec<Row>> {
    if target.bases.len() < 2 {
        anyhow::bail!("the lab needs two instances");
    }
    let strategies: Vec<&'static str> = STRATEGIES
        .into_iter()
        .filter(|s| args.strategy.is_empty() || args.strategy.iter().any(|a| a == s))
        .collect();
    if strategies.is_empty() {
        anyhow::bail!(
            "no such strategy in {:?}; the strategies are {STRATEGIES:?}",
            args.strategy
        );
    }
    let admin = target.admin();
    let users = args.users.max(args.pairs);
    eprintln!("lab: minting {users} tokens");
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, users).await?;
    let bases: Vec<Arc<str>> = target.bases.iter().map(|b| Arc::from(b.as_str())).collect();

    let repeat = args.repeat.max(1);
    let total: usize = strategies
        .iter()
        .map(|s| 2 * stalls(s).len())
        .sum::<usize>()
        * repeat as usize;
    let mut rows = Vec::with_capacity(total);
    for strategy in strategies {
        for instances in [1, 2] {
            for stall in stalls(strategy) {
                for run in 1..=repeat {
                    let started = Instant::now();
                    let mut label = format!("{strategy} x{instances} {}", stall.name());
                    if repeat > 1 {
                        label = format!("{label} {run}/{repeat}");
                    }
                    let cell = Cell {
                        admin: &admin,
                        bases: &bases[..instances],
                        tokens: &tokens,
                        strategy,
                        stall,
                        run,
                        args,
                        label: &label,
                    };
                    let row = match stall {
                        Stall::None | Stall::Crash => crowd(target, &cell).await?,
                        _ => pairs(&cell).await?,
                    };
                    eprintln!(
                        "lab [{:>w$}/{total}] {label:<lw$} {:>5.1} s  {}",
                        rows.len() + 1,
                        started.elapsed().as_secs_f64(),
                        row.verdict(),
                        w = total.to_string().len().max(2),
                        lw = if repeat > 1 { 34 } else { 28 },
                    );
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}
