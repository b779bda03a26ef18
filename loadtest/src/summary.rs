//! The reports of the scenarios that share one service (flash, hammer,
//! throughput, soldout, async, speed): their table, HTML sections and JSON.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::drive::Tally;
use crate::invariants::Check;
use crate::table::{self, Table};
use crate::{report, round};

/// The outcome of one scenario.
pub(crate) struct Report {
    pub scenario: &'static str,
    pub tally: Tally,
    pub check: Check,
    pub ratios: Option<Value>,
    pub extra: Value,
}

/// Prints the runs' table, saves their HTML report and prints the JSON
/// line (totals on top when there are several); whether every run held.
pub(crate) fn finish(name: &str, reports: &[Report]) -> bool {
    let sections: Vec<report::Section> = reports.iter().map(report_section).collect();
    print_table(name, reports);
    report::save(
        name,
        &report::html(&format!("seckill load test: {name}"), &sections, &[], &[]),
    );
    let ok = reports.iter().all(|r| r.check.ok());
    let json = if let [only] = reports {
        report_json(only)
    } else {
        // Totals on top; each scenario's own figures below.
        let mut status = BTreeMap::<String, u64>::new();
        for r in reports {
            for (k, v) in &r.tally.statuses {
                *status.entry(format!("{}: {k}", r.scenario)).or_default() += v;
            }
        }
        json!({
            "scenario": name,
            "requests": reports.iter().map(|r| r.tally.requests).sum::<u64>(),
            "status": status,
            "orders": reports.iter().map(|r| r.check.orders).sum::<i64>(),
            "oversold": reports.iter().map(|r| r.check.oversold).sum::<i64>(),
            "duplicate_users": reports.iter().map(|r| r.check.duplicate_users).sum::<i64>(),
            "invariants_ok": ok,
            "ratios": reports.iter().filter_map(|r| r.ratios.clone()).collect::<Vec<_>>(),
            "scenarios": reports.iter().map(report_json).collect::<Vec<_>>(),
        })
    };
    println!("{json}");
    ok
}

/// A scenario's part of the HTML report; `throughput` also charts its
/// orders per second beside the ceilings measured in the same run.
fn report_section(r: &Report) -> report::Section<'_> {
    let mut facts = vec![
        ("requests".to_owned(), r.tally.requests.to_string()),
        ("orders".to_owned(), r.check.orders.to_string()),
        (
            "p50 / p99 ms".to_owned(),
            format!("{:.2} / {:.2}", r.tally.ms(0.5), r.tally.ms(0.99)),
        ),
        (
            "invariants".to_owned(),
            if r.check.ok() {
                "ok".to_owned()
            } else {
                r.check.problems.join("; ")
            },
        ),
    ];
    if let Value::Object(extra) = &r.extra {
        facts.extend(extra.iter().map(|(k, v)| (k.clone(), v.to_string())));
    }
    let ceilings = (r.scenario == "throughput").then(|| {
        [
            ("pgbench, 1 order per transaction", "pgbench_tps"),
            (
                "pgbench, 100 orders per transaction",
                "pgbench_batch_orders_per_sec",
            ),
            ("naive BEGIN/UPDATE/INSERT/COMMIT", "pgbench_naive_tps"),
        ]
        .iter()
        .filter_map(|(label, key)| {
            Some(report::Ceiling {
                label: (*label).to_owned(),
                per_sec: r.extra[key].as_f64()?,
            })
        })
        .collect()
    });
    report::Section {
        title: r.scenario.to_owned(),
        tally: &r.tally,
        facts,
        ceilings,
    }
}

fn report_json(r: &Report) -> Value {
    let mut v = json!({
        "scenario": r.scenario,
        "requests": r.tally.requests,
        "status": r.tally.statuses,
        "orders": r.check.orders,
        "stock_left": r.check.stock_left,
        "oversold": r.check.oversold,
        "duplicate_users": r.check.duplicate_users,
        "invariants_ok": r.check.ok(),
        "problems": r.check.problems,
        "rps": round(r.tally.rps()),
        "p50_ms": round(r.tally.ms(0.50)),
        "p99_ms": round(r.tally.ms(0.99)),
        "p999_ms": round(r.tally.ms(0.999)),
        "max_ms": round(r.tally.latency.max() as f64 / 1000.0),
        "seconds": round(r.tally.elapsed.as_secs_f64()),
    });
    if let Some(ratios) = &r.ratios {
        v["ratios"] = ratios.clone();
    }
    if let (Value::Object(v), Value::Object(extra)) = (&mut v, &r.extra) {
        for (k, x) in extra {
            v.entry(k.clone()).or_insert(x.clone());
        }
    }
    v
}

fn print_table(name: &str, reports: &[Report]) {
    let mut table = Table::new([
        "scenario",
        "requests",
        "rps",
        "p50 ms",
        "p99 ms",
        "max ms",
        "orders",
        "stock",
        "oversold",
        "dup users",
        "invariants",
    ]);
    for r in reports {
        let t = &r.tally;
        table.row([
            r.scenario.to_owned(),
            t.requests.to_string(),
            format!("{:.0}", t.rps()),
            format!("{:.2}", t.ms(0.50)),
            format!("{:.2}", t.ms(0.99)),
            format!("{:.1}", t.latency.max() as f64 / 1000.0),
            r.check.orders.to_string(),
            r.check.stock_left.to_string(),
            r.check.oversold.to_string(),
            r.check.duplicate_users.to_string(),
            if r.check.ok() { "ok" } else { "FAILED" }.to_owned(),
        ]);
    }
    print!("{}", table.text());
    table::record(name, "Runs", &table);
    for r in reports {
        let statuses: Vec<String> = r
            .tally
            .statuses
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        println!("  {}: {}", r.scenario, statuses.join(", "));
        if let Value::Object(extra) = &r.extra {
            let notes: Vec<String> = extra.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("    {}", notes.join(", "));
        }
        if let Some(ratios) = &r.ratios {
            println!("    ratios {ratios}");
        }
        for p in &r.check.problems {
            println!("    INVARIANT BROKEN: {p}");
        }
    }
}
