//! The lab's report: the grid and the lifecycle's table, a chart per
//! anomaly, the designs that broke a guarantee, and the JSON line.

use serde_json::json;

use super::rates::{self, Run};
use super::{cells, grid, table, CellRuns, LabArgs, Row};
use crate::report::{self, Bars};
use crate::table as tables;
use seckill_lab::lifecycle::LifeRow;

/// Prints and saves everything the lab found; whether every design kept
/// the guarantees it gives.
pub(super) fn finish(args: &LabArgs, rows: &[Row], rates: &[Run], life: &[LifeRow]) -> bool {
    print!("{}", table(rows).text());
    let grid = grid(rows);
    tables::record("lab", "", &grid);
    let rates_table = rates::table(rates);
    if !rates.is_empty() {
        print!("\n{}", rates_table.text());
        tables::record("lab-rates", "", &rates_table);
    }
    let life_table = life_table(life);
    print!("\n{}", life_table.text());
    tables::record("lab-lifecycle", "", &life_table);
    let cells = cells(rows);
    let repeat = args.repeat.max(1);
    report::save(
        "lab",
        &report::html(
            "seckill lab: every design, broken with real rows",
            &[],
            &[
                ("Each design in each scenario", grid.html()),
                ("One hot voucher: orders per second", rates_table.html()),
                ("After the grab: the lifecycle's designs", life_table.html()),
            ],
            &charts(&cells, repeat),
        ),
    );
    let ok = print_failures(rows, life, repeat) && rates.iter().all(|r| r.ok);
    println!(
        "{}",
        json!({
            "scenario": "lab",
            "lease_ms": args.lease().as_millis(),
            "users": args.users,
            "per_user": args.per_user,
            "stock": args.stock,
            "pairs": args.pairs,
            "repeat": repeat,
            "ok": ok,
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "cells": cells.iter().map(CellRuns::json).collect::<Vec<_>>(),
            "rate_seconds": args.rate_seconds,
            "rates": rates::json(rates),
            "lifecycle_rows": life.iter().map(LifeRow::json).collect::<Vec<_>>(),
        })
    );
    ok
}

/// A chart per anomaly, of the cells where it happened (the most any run
/// of a cell counted): a reader takes in the grid first, then how large
/// each failure was.
fn charts(cells: &[CellRuns<'_>], repeat: u32) -> [Bars; 5] {
    let most = if repeat > 1 {
        format!(" (the most of {repeat} runs)")
    } else {
        String::new()
    };
    let anomaly = |title: &str, value: fn(&Row) -> i64| Bars {
        title: format!("{title}, where it happened{most}"),
        rows: cells
            .iter()
            .filter(|c| c.max(value) > 0)
            .map(|c| (c.label(), c.max(value) as f64))
            .collect(),
    };
    [
        anomaly("Oversold units", Row::oversold),
        anomaly("Undersold units", Row::undersold),
        anomaly("Users with two orders", Row::duplicate_users),
        anomaly("Releases of another request's lock", |r| {
            r.stats.foreign_releases
        }),
        anomaly("Accepted by Redis, never stored", Row::lost),
    ]
}

/// Says which designs broke a guarantee they give; whether none did.
fn print_failures(rows: &[Row], life: &[LifeRow], repeat: u32) -> bool {
    let failed: Vec<&Row> = rows.iter().filter(|r| r.failed()).collect();
    let life_failed: Vec<&LifeRow> = life.iter().filter(|r| r.failed()).collect();
    for r in &life_failed {
        println!(
            "  FAILED: the service's design in {}: a lifecycle guarantee broke",
            r.scenario.name()
        );
    }
    for r in &failed {
        let run = if repeat > 1 {
            format!(" (run {} of {repeat})", r.run)
        } else {
            String::new()
        };
        println!(
            "  FAILED: {} on {} instance(s), stall {}{run}: a guarantee of its design broke",
            r.strategy,
            r.instances,
            r.stall.name()
        );
    }
    failed.is_empty() && life_failed.is_empty()
}

/// The naive lifecycle designs beside the right ones, a row each.
fn life_table(rows: &[LifeRow]) -> tables::Table {
    let mut table = tables::Table::new([
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
