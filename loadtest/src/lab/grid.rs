//! The lab's tables: a row per run, and the grid of cells with each
//! anomaly's spread over the runs.

use serde_json::{json, Value};

use super::{expect, Expect, Row, Stall};
use crate::table::Table;

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
