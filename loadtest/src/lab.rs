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

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::api::{Admin, LabStats};
use crate::drive::{self, Request, Tally};
use crate::service::Target;
use crate::table::Table;

/// The strategies, in the order LAB.md tells them.
pub const STRATEGIES: [&str; 11] = [
    "naive",
    "version",
    "stock_gt_zero",
    "process_mutex",
    "setnx",
    "setnx_owner",
    "reentrant",
    "fenced",
    "redis_decr",
    "redis_lua",
    "redis_stream",
];

/// The designs whose stock lives in Redis: their rows are a crowd and a
/// crowd in which every other request crashes between Redis and Postgres.
fn redis_stock(strategy: &str) -> bool {
    strategy.starts_with("redis_")
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
    /// Runs of each cell (a fresh voucher each); the grid shows each
    /// anomaly's min-max over them.
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

pub struct Row {
    pub strategy: &'static str,
    pub instances: usize,
    pub stall: Stall,
    /// Which run of its cell this row is (1 to `--repeat`).
    pub run: u32,
    /// Users that sent requests in this row.
    pub users: i64,
    pub stats: LabStats,
    pub tally: Tally,
}

impl Row {
    pub fn oversold(&self) -> i64 {
        (self.stats.orders - self.stats.initial_stock).max(0)
    }

    /// Units left unsold while buyers went without: the smaller of the
    /// stock left and the users who got no order.
    pub fn undersold(&self) -> i64 {
        let refused = self.users - self.stats.distinct_users;
        self.stats.stock.max(0).min(refused.max(0))
    }

    pub fn duplicate_users(&self) -> i64 {
        self.stats.orders - self.stats.distinct_users
    }

    /// Units Redis handed out that Postgres holds no order for (the
    /// Redis-stock designs; 0 for the others).
    pub fn lost(&self) -> i64 {
        match self.stats.redis_stock {
            Some(left) if redis_stock(self.strategy) => {
                (self.stats.initial_stock - left - self.stats.orders).max(0)
            }
            _ => 0,
        }
    }

    /// Every anomaly the lab counts, with its count in this row.
    pub fn anomalies(&self) -> Anomalies {
        [
            ("oversold", self.oversold()),
            ("undersold", self.undersold()),
            ("users with two orders", self.duplicate_users()),
            ("foreign releases", self.stats.foreign_releases),
            ("lost", self.lost()),
        ]
    }

    pub fn broke(&self) -> bool {
        self.anomalies().iter().any(|(_, n)| *n > 0)
    }

    pub fn expected(&self) -> Expect {
        expect(self.strategy, self.instances, self.stall)
    }

    /// A row that broke a guarantee its design gives: every design after
    /// `naive` keeps stock right, and the rows LAB.md says hold must hold.
    pub fn failed(&self) -> bool {
        (!["naive", "redis_decr"].contains(&self.strategy) && self.oversold() > 0)
            || (self.expected() == Expect::Holds && self.broke())
    }

    fn verdict(&self) -> &'static str {
        match (self.expected(), self.broke()) {
            _ if self.failed() => "FAILED",
            (Expect::Breaks, false) => "race not seen",
            (Expect::Breaks, true) | (Expect::Holds, false) => "as expected",
            (Expect::Nothing, _) => "-",
            (Expect::Holds, true) => unreachable!("a holding row that broke failed"),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "strategy": self.strategy,
            "instances": self.instances,
            "stall": self.stall.name(),
            "run": self.run,
            "users": self.users,
            "requests": self.tally.requests,
            "status": self.tally.statuses,
            "initial_stock": self.stats.initial_stock,
            "orders": self.stats.orders,
            "stock_left": self.stats.stock,
            "oversold": self.oversold(),
            "undersold": self.undersold(),
            "duplicate_users": self.duplicate_users(),
            "foreign_releases": self.stats.foreign_releases,
            "lost": self.lost(),
            "rps": round(self.tally.rps()),
            "p99_ms": round(self.tally.ms(0.99)),
            "expected": match self.expected() {
                Expect::Holds => "holds",
                Expect::Breaks => "breaks",
                Expect::Nothing => "-",
            },
            "verdict": self.verdict(),
        })
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Runs every row against `target` (started with the lab on, two
/// instances); rows in the order printed.
pub async fn run(target: &Target, args: &LabArgs) -> Result<Vec<Row>, String> {
    if target.bases.len() < 2 {
        return Err("the lab needs two instances".into());
    }
    let strategies: Vec<&'static str> = STRATEGIES
        .into_iter()
        .filter(|s| args.strategy.is_empty() || args.strategy.iter().any(|a| a == s))
        .collect();
    if strategies.is_empty() {
        return Err(format!(
            "no such strategy in {:?}; the strategies are {STRATEGIES:?}",
            args.strategy
        ));
    }
    let admin = Admin::new(target);
    let users = args.users.max(args.pairs);
    eprintln!("lab: minting {users} tokens");
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, users).await?;
    let bases: Vec<Arc<str>> = target.bases.iter().map(|b| Arc::from(b.as_str())).collect();

    let stalls = |strategy: &str| {
        if redis_stock(strategy) {
            vec![Stall::None, Stall::Crash]
        } else {
            vec![Stall::None, Stall::Sale, Stall::Release]
        }
    };
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

/// One cell of the grid: a strategy on some instances under one stall.
#[derive(Clone, Copy)]
struct Cell<'a> {
    admin: &'a Admin<'a>,
    bases: &'a [Arc<str>],
    tokens: &'a [Arc<str>],
    strategy: &'static str,
    stall: Stall,
    /// Which run of the cell this is.
    run: u32,
    args: &'a LabArgs,
    /// The progress display's name of the cell.
    label: &'a str,
}

impl Cell<'_> {
    /// The cell's row, from what `users` users made of it.
    fn row(&self, users: i64, stats: LabStats, tally: Tally) -> Row {
        Row {
            strategy: self.strategy,
            instances: self.bases.len(),
            stall: self.stall,
            run: self.run,
            users,
            stats,
            tally,
        }
    }
}

fn lab_path(strategy: &str, voucher: i64, stall: Stall, lease: Duration) -> String {
    let path = format!("/lab/{strategy}/seckill/{voucher}");
    match stall {
        Stall::None => path,
        Stall::Crash => format!("{path}?stall_at=crash"),
        at => format!(
            "{path}?stall_at={}&stall_ms={}",
            at.name(),
            lease.as_millis() * 17 / 10
        ),
    }
}

/// Each user's requests at once, spread over the instances, for scarce
/// stock. With `Stall::Crash`, every other user's requests crash between
/// Redis and Postgres; a stream design's writers are then given time to
/// recover what their dead consumer left.
async fn crowd(target: &Target, cell: &Cell<'_>) -> Result<Row, String> {
    let (admin, args, bases) = (cell.admin, cell.args, cell.bases);
    let voucher = admin.lab_voucher(args.stock).await?;
    let plain = lab_path(cell.strategy, voucher, Stall::None, args.lease());
    let crashing = lab_path(cell.strategy, voucher, cell.stall, args.lease());
    // A user's requests stand next to each other in the plan, so that
    // different connections send them at the same moment.
    let users = usize::try_from(args.users).unwrap_or(0);
    let plan: Vec<Request> = cell.tokens[..users]
        .iter()
        .enumerate()
        .flat_map(|(u, token)| (0..args.per_user).map(move |i| (u, i, token.clone())))
        .map(|(u, i, token)| {
            let path = if u % 2 == 1 { &crashing } else { &plain };
            Request::post_to(bases[(u + i) % bases.len()].clone(), path.clone(), token)
        })
        .collect();
    let tally = target.send_each(plan, args.connections, cell.label).await;
    let mut stats = admin.lab_stats(voucher).await?;
    if cell.strategy == "redis_stream" {
        // Accepted orders are written by the stream's writers: wait (at
        // most 20 leases) until every unit Redis handed out is stored.
        let deadline = Instant::now() + args.lease() * 20;
        while stats
            .redis_stock
            .is_some_and(|left| stats.initial_stock - left > stats.orders)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stats = admin.lab_stats(voucher).await?;
        }
    }
    Ok(cell.row(args.users, stats, tally))
}

/// Stalled pairs (see the module's text), every user at once.
async fn pairs(cell: &Cell<'_>) -> Result<Row, String> {
    let (admin, args, bases) = (cell.admin, cell.args, cell.bases);
    // Plenty of stock: these rows are about users, not units.
    let voucher = admin.lab_voucher(args.pairs * 10).await?;
    let path = lab_path(cell.strategy, voucher, cell.stall, args.lease());
    let users = usize::try_from(args.pairs).unwrap_or(0);
    let progress = ProgressBar::new(users as u64).with_prefix(cell.label.to_owned());
    progress.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:40}] {pos}/{len} pairs")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let client = drive::client(users * 2);
    let (lease, started) = (args.lease(), Instant::now());
    let tasks: Vec<_> = cell.tokens[..users]
        .iter()
        .map(|token| {
            let a = Request::post_to(bases[0].clone(), path.clone(), token.clone());
            let b = Request::post_to(bases[bases.len() - 1].clone(), path.clone(), token.clone());
            let (client, progress) = (client.clone(), progress.clone());
            tokio::spawn(async move {
                let first = drive::exchange(&client, "", &a);
                let second = async {
                    let mut answers = Vec::new();
                    tokio::time::sleep(lease * 12 / 10).await;
                    let give_up = Instant::now() + lease * 4;
                    loop {
                        let answered = drive::exchange(&client, "", &b).await;
                        let again =
                            answered.key == "429 purchase_in_progress" && Instant::now() < give_up;
                        answers.push(answered);
                        if !again {
                            break answers;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                };
                let (first, mut answers) = tokio::join!(first, second);
                answers.push(first);
                progress.inc(1);
                answers
            })
        })
        .collect();
    // The pairs hand back answers, counted in the run's one tally (a tally
    // each would zero a 150 KB histogram per user, as drive.rs says).
    let mut tally = Tally::starting_at(started);
    for task in tasks {
        for answered in task.await.map_err(|e| format!("a pair panicked: {e}"))? {
            tally.record(answered);
        }
    }
    tally.elapsed = started.elapsed();
    progress.finish_and_clear();
    Ok(cell.row(args.pairs, admin.lab_stats(voucher).await?, tally))
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

/// The lab's table: a row per strategy, instance count and stall (and
/// run, when a cell was run more than once).
pub fn table(rows: &[Row]) -> Table {
    let repeated = rows.iter().any(|r| r.run > 1);
    let mut table = Table::new(
        [
            "strategy",
            "inst",
            "stall",
            "run",
            "orders",
            "stock",
            "oversold",
            "undersold",
            "dup users",
            "foreign",
            "lost",
            "rps",
            "p99 ms",
            "expected",
            "verdict",
        ]
        .into_iter()
        .filter(|h| repeated || *h != "run"),
    );
    for r in rows {
        let run = repeated.then(|| r.run.to_string());
        table.row(
            [
                r.strategy.to_owned(),
                r.instances.to_string(),
                r.stall.name().to_owned(),
            ]
            .into_iter()
            .chain(run)
            .chain([
                r.stats.orders.to_string(),
                r.stats.stock.to_string(),
                r.oversold().to_string(),
                r.undersold().to_string(),
                r.duplicate_users().to_string(),
                r.stats.foreign_releases.to_string(),
                r.lost().to_string(),
                format!("{:.0}", r.tally.rps()),
                format!("{:.1}", r.tally.ms(0.99)),
                r.expected().name().to_owned(),
                r.verdict().to_owned(),
            ]),
        );
    }
    table
}

/// Every anomaly the lab counts, named, with its count in one run.
pub type Anomalies = [(&'static str, i64); 5];

/// One cell of the grid: every run of a strategy on some instances under
/// one stall, in the order run.
pub struct CellRuns<'a> {
    pub strategy: &'static str,
    pub instances: usize,
    pub stall: Stall,
    pub runs: Vec<&'a Row>,
}

impl CellRuns<'_> {
    pub fn label(&self) -> String {
        format!(
            "{} x{} {}",
            self.strategy,
            self.instances,
            self.stall.name()
        )
    }

    /// The most any run counted of one anomaly.
    pub fn max(&self, value: impl Fn(&Row) -> i64) -> i64 {
        self.runs.iter().map(|r| value(r)).max().unwrap_or(0)
    }

    /// What the cell shows: see `cell_text`.
    pub fn text(&self) -> String {
        let anomalies: Vec<Anomalies> = self.runs.iter().map(|r| r.anomalies()).collect();
        let failed = self.runs.iter().filter(|r| r.failed()).count();
        cell_text(
            &anomalies,
            failed,
            expect(self.strategy, self.instances, self.stall),
        )
    }

    /// Each anomaly's count in every run, with its least and most.
    pub fn json(&self) -> Value {
        let anomalies: Vec<Anomalies> = self.runs.iter().map(|r| r.anomalies()).collect();
        let spread: serde_json::Map<String, Value> = (0..anomalies.first().map_or(0, |a| a.len()))
            .map(|i| {
                let counts: Vec<i64> = anomalies.iter().map(|a| a[i].1).collect();
                let key = match anomalies[0][i].0 {
                    "users with two orders" => "duplicate_users",
                    "foreign releases" => "foreign_releases",
                    name => name,
                };
                (
                    key.to_owned(),
                    json!({
                        "min": counts.iter().min(),
                        "max": counts.iter().max(),
                        "runs": counts,
                    }),
                )
            })
            .collect();
        json!({
            "strategy": self.strategy,
            "instances": self.instances,
            "stall": self.stall.name(),
            "runs": self.runs.len(),
            "failed_runs": self.runs.iter().filter(|r| r.failed()).count(),
            "anomalies": spread,
            "text": self.text(),
        })
    }
}

/// The rows grouped into cells, in the order first run.
pub fn cells(rows: &[Row]) -> Vec<CellRuns<'_>> {
    let mut cells: Vec<CellRuns> = Vec::new();
    for r in rows {
        let same = |c: &&mut CellRuns| {
            c.strategy == r.strategy && c.instances == r.instances && c.stall == r.stall
        };
        match cells.iter_mut().find(same) {
            Some(cell) => cell.runs.push(r),
            None => cells.push(CellRuns {
                strategy: r.strategy,
                instances: r.instances,
                stall: r.stall,
                runs: vec![r],
            }),
        }
    }
    cells
}

/// What a cell shows at a glance, from its runs' anomaly counts: `holds`
/// when every run held, or each anomaly seen with its count (`min-max`
/// over the runs when they differ, and in how many runs it was seen when
/// not in all). `failed` runs broke a guarantee of their design; a cell
/// `expected` to break that never did says the race did not happen.
/// One run reads as it always did: `oversold 3, users with two orders 2`.
pub fn cell_text(runs: &[Anomalies], failed: usize, expected: Expect) -> String {
    let n = runs.len();
    let found: Vec<String> = (0..runs.first().map_or(0, |a| a.len()))
        .filter_map(|i| {
            let counts: Vec<i64> = runs.iter().map(|a| a[i].1).collect();
            let seen = counts.iter().filter(|c| **c > 0).count();
            if seen == 0 {
                return None;
            }
            let (min, max) = (counts.iter().min()?, counts.iter().max()?);
            let count = if min == max {
                min.to_string()
            } else {
                format!("{min}-{max}")
            };
            let what = runs[0][i].0;
            Some(if seen < n {
                format!("{what} {count} ({seen} of {n} runs)")
            } else {
                format!("{what} {count}")
            })
        })
        .collect();
    let cell = if found.is_empty() {
        "holds".to_owned()
    } else {
        format!("**{}**", found.join(", "))
    };
    if failed > 0 {
        if n == 1 {
            format!("{cell} (FAILED: its design promises better)")
        } else {
            format!("{cell} (FAILED in {failed} of {n} runs: its design promises better)")
        }
    } else if expected == Expect::Breaks && found.is_empty() {
        if n == 1 {
            format!("{cell} (the race did not happen this run)")
        } else {
            format!("{cell} (the race did not happen in any of {n} runs)")
        }
    } else {
        cell
    }
}

/// The strategy x scenario grid: a row per strategy, a column per
/// instance count and stall, each cell `holds` or the anomalies with counts
/// (their min-max over the runs, when a cell ran more than once; the first
/// header then says how many runs).
pub fn grid(rows: &[Row]) -> Table {
    let cells = cells(rows);
    let mut scenarios: Vec<(usize, Stall)> = Vec::new();
    let mut strategies: Vec<&str> = Vec::new();
    for c in &cells {
        if !scenarios.contains(&(c.instances, c.stall)) {
            scenarios.push((c.instances, c.stall));
        }
        if !strategies.contains(&c.strategy) {
            strategies.push(c.strategy);
        }
    }
    let most = cells.iter().map(|c| c.runs.len()).max().unwrap_or(1);
    let corner = if most > 1 {
        format!("strategy ({most} runs per cell, min-max)")
    } else {
        "strategy".to_owned()
    };
    let mut grid = Table::new(
        std::iter::once(corner).chain(scenarios.iter().map(|(n, stall)| {
            let who = if *n == 1 { "1 instance" } else { "2 instances" };
            format!("{who}, stall: {}", stall.name())
        })),
    );
    for strategy in strategies {
        let row = scenarios.iter().map(|(n, stall)| {
            cells
                .iter()
                .find(|c| c.strategy == strategy && c.instances == *n && c.stall == *stall)
                .map_or("·".to_owned(), CellRuns::text)
        });
        grid.row(std::iter::once(format!("`{strategy}`")).chain(row));
    }
    grid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(strategy: &'static str, instances: usize, stall: Stall, stats: LabStats) -> Row {
        Row {
            strategy,
            instances,
            stall,
            run: 1,
            users: 10,
            stats,
            tally: Tally::new(),
        }
    }

    fn stats(initial: i64, stock: i64, orders: i64, users: i64, foreign: i64) -> LabStats {
        LabStats {
            initial_stock: initial,
            stock,
            orders,
            distinct_users: users,
            foreign_releases: foreign,
            redis_stock: None,
        }
    }

    #[test]
    fn each_anomaly_is_measured() {
        let oversold = row("naive", 1, Stall::None, stats(5, -3, 8, 8, 0));
        assert_eq!((oversold.oversold(), oversold.undersold()), (3, 0));
        // 4 units left while 10 - 6 = 4 users went without.
        let undersold = row("version", 1, Stall::None, stats(10, 4, 6, 6, 0));
        assert_eq!((undersold.oversold(), undersold.undersold()), (0, 4));
        let dup = row("stock_gt_zero", 1, Stall::None, stats(5, 0, 5, 4, 0));
        assert_eq!((dup.duplicate_users(), dup.undersold()), (1, 0));
        let foreign = row("setnx", 2, Stall::Release, stats(100, 90, 10, 10, 3));
        assert!(foreign.broke());
        let clean = row("fenced", 2, Stall::Sale, stats(100, 90, 10, 10, 0));
        assert!(!clean.broke() && !clean.failed());
    }

    #[test]
    fn a_holding_row_that_breaks_fails_and_oversell_fails_past_naive() {
        let broken = row("fenced", 2, Stall::Sale, stats(100, 89, 11, 10, 0));
        assert!(broken.failed());
        assert_eq!(broken.verdict(), "FAILED");
        let expected = row("reentrant", 2, Stall::Sale, stats(100, 89, 11, 10, 0));
        assert!(!expected.failed());
        assert_eq!(expected.verdict(), "as expected");
        let unseen = row("setnx", 1, Stall::Sale, stats(100, 90, 10, 10, 0));
        assert_eq!(unseen.verdict(), "race not seen");
        let naive = row("naive", 1, Stall::None, stats(5, -1, 6, 6, 0));
        assert!(!naive.failed());
        let version = row("version", 1, Stall::Sale, stats(5, -1, 6, 6, 0));
        assert!(version.failed(), "only naive may oversell");
    }

    #[test]
    fn the_claims_match_the_lab_text() {
        assert_eq!(expect("process_mutex", 1, Stall::Sale), Expect::Holds);
        assert_eq!(expect("process_mutex", 2, Stall::None), Expect::Breaks);
        assert_eq!(expect("setnx_owner", 2, Stall::None), Expect::Holds);
        assert_eq!(expect("setnx_owner", 1, Stall::Release), Expect::Breaks);
        assert_eq!(expect("reentrant", 2, Stall::Release), Expect::Holds);
        assert_eq!(expect("reentrant", 1, Stall::Sale), Expect::Breaks);
        for instances in [1, 2] {
            for stall in [Stall::None, Stall::Sale, Stall::Release] {
                assert_eq!(expect("fenced", instances, stall), Expect::Holds);
            }
        }
    }

    /// A run's anomalies from its counts, in `Row::anomalies`' order:
    /// oversold, undersold, users with two orders, foreign releases, lost.
    fn counts(c: [i64; 5]) -> Anomalies {
        let names = [
            "oversold",
            "undersold",
            "users with two orders",
            "foreign releases",
            "lost",
        ];
        std::array::from_fn(|i| (names[i], c[i]))
    }

    #[test]
    fn one_run_reads_as_it_always_did() {
        let naive = counts([144, 0, 118, 0, 0]);
        assert_eq!(
            cell_text(&[naive], 0, Expect::Breaks),
            "**oversold 144, users with two orders 118**"
        );
        assert_eq!(cell_text(&[counts([0; 5])], 0, Expect::Holds), "holds");
        assert_eq!(
            cell_text(&[counts([0; 5])], 0, Expect::Breaks),
            "holds (the race did not happen this run)"
        );
        assert_eq!(
            cell_text(&[counts([0, 0, 1, 0, 0])], 1, Expect::Holds),
            "**users with two orders 1** (FAILED: its design promises better)"
        );
        // A single run's cell is the row's own text.
        let r = row("naive", 1, Stall::None, stats(5, -3, 8, 7, 0));
        assert_eq!(
            cell_text(&[r.anomalies()], 0, r.expected()),
            "**oversold 3, users with two orders 1**"
        );
    }

    #[test]
    fn runs_show_each_anomaly_min_max_or_one_number_when_they_agree() {
        let runs = [
            counts([130, 0, 111, 0, 0]),
            counts([144, 0, 118, 0, 0]),
            counts([138, 0, 118, 0, 0]),
        ];
        assert_eq!(
            cell_text(&runs, 0, Expect::Breaks),
            "**oversold 130-144, users with two orders 111-118**"
        );
        let agree = [counts([0, 0, 50, 50, 0]); 5];
        assert_eq!(
            cell_text(&agree, 0, Expect::Breaks),
            "**users with two orders 50, foreign releases 50**"
        );
        assert_eq!(cell_text(&[counts([0; 5]); 5], 0, Expect::Holds), "holds");
    }

    #[test]
    fn runs_that_disagree_on_whether_it_broke_say_in_how_many_it_did() {
        let runs = [
            counts([0, 0, 3, 0, 0]),
            counts([0; 5]),
            counts([0, 0, 1, 0, 0]),
            counts([0; 5]),
            counts([0; 5]),
        ];
        assert_eq!(
            cell_text(&runs, 0, Expect::Breaks),
            "**users with two orders 0-3 (2 of 5 runs)**"
        );
        // The same count in the runs that broke: still a range from 0.
        let once = [counts([0; 5]), counts([0, 4, 0, 0, 0])];
        assert_eq!(
            cell_text(&once, 0, Expect::Breaks),
            "**undersold 0-4 (1 of 2 runs)**"
        );
        assert_eq!(
            cell_text(&[counts([0; 5]); 5], 0, Expect::Breaks),
            "holds (the race did not happen in any of 5 runs)"
        );
        assert_eq!(
            cell_text(&runs, 2, Expect::Holds),
            "**users with two orders 0-3 (2 of 5 runs)** (FAILED in 2 of 5 runs: its design promises better)"
        );
    }

    #[test]
    fn the_grid_groups_runs_into_cells_and_says_how_many() {
        let mut second = row("naive", 1, Stall::None, stats(5, -1, 6, 6, 0));
        second.run = 2;
        let rows = [
            row("naive", 1, Stall::None, stats(5, -3, 8, 8, 0)),
            second,
            row("fenced", 1, Stall::None, stats(5, 0, 5, 5, 0)),
        ];
        let cells = cells(&rows);
        assert_eq!(cells.len(), 2);
        assert_eq!(cells[0].runs.len(), 2);
        assert_eq!(cells[0].max(Row::oversold), 3);
        assert_eq!(
            cells[0].json()["anomalies"]["oversold"]["runs"],
            json!([3, 1])
        );
        let md = grid(&rows).markdown();
        assert!(
            md.starts_with("| strategy (2 runs per cell, min-max) |"),
            "{md}"
        );
        assert!(md.contains("| `naive` | **oversold 1-3** |"), "{md}");
        assert!(md.contains("| `fenced` | holds |"), "{md}");
        // One run a cell: the header is as it always was.
        assert!(grid(&rows[..1])
            .markdown()
            .starts_with("| strategy | 1 instance, stall: none |"));
    }
}
