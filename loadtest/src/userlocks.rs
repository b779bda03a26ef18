//! What the per-user lock buys, measured: the same binary with
//! `SECKILL_USER_LOCKS=on` and `off`, on two instances, in rounds that
//! alternate the two. Two crowds each: one whose users each send three
//! purchases at once, spread over both instances (the duplicates the lock
//! is for), with a unit for every user; and the usual flash crowd (scarce
//! stock, three tries per user in random order). Per design: orders/s,
//! p50/p99, the answers, batch statements and their reruns, locks taken,
//! CPU per request by process. Every crowd's invariants are checked.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

use crate::api::SaleMode;
use crate::cpu::Usage;
use crate::crowds::{sale_steps, SaleSteps};
use crate::drive::Tally;
use crate::invariants::{check, Check};
use crate::service::Target;
use crate::table::Table;
use crate::{round, TargetArgs};

#[derive(Args, Clone)]
pub struct UserLocksArgs {
    /// Rounds; each runs both designs (in alternating order).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Users of the duplicates crowd, three purchases each at once.
    #[arg(long, default_value_t = 5_000)]
    pub dup_users: i64,
    /// Users of the flash crowd (three tries each) and its units.
    #[arg(long, default_value_t = 10_000)]
    pub flash_users: i64,
    #[arg(long, default_value_t = 100)]
    pub flash_stock: i64,
    /// Connections of both crowds.
    #[arg(long, default_value_t = 400)]
    pub connections: usize,
}

/// One crowd of one design in one round.
struct Run {
    design: &'static str,
    crowd: &'static str,
    tally: Tally,
    check: Check,
    /// Batch statements, their reruns and the locks taken, from the
    /// instances' `/metrics`.
    steps: SaleSteps,
    /// CPU µs per request, by process.
    cpu: BTreeMap<&'static str, f64>,
}

const DESIGNS: [(&str, &str); 2] = [("lock on", "on"), ("lock off", "off")];

pub async fn run(target: &TargetArgs, args: &UserLocksArgs) -> anyhow::Result<bool> {
    target.starts_its_own("userlocks starts its own instances (one design each)")?;
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        let mut designs = DESIGNS;
        if round % 2 == 1 {
            designs.reverse();
        }
        for (design, setting) in designs {
            eprintln!("userlocks: round {}/{}, {design}", round + 1, args.rounds);
            let env = vec![("SECKILL_USER_LOCKS".to_owned(), setting.to_owned())];
            let both = target
                .launch(2, env)
                .run(async |service| {
                    let dups = crowd(service, args, design, Crowd::Duplicates).await?;
                    let flash = crowd(service, args, design, Crowd::Flash).await?;
                    Ok([dups, flash])
                })
                .await?;
            runs.extend(both);
        }
    }
    let ok = runs.iter().all(|r| r.check.ok());
    let summary = summarize(&runs);
    print_table(&summary);
    for problem in runs.iter().flat_map(|r| &r.check.problems) {
        println!("    {problem}");
    }
    println!(
        "{}",
        json!({
            "scenario": "userlocks",
            "rounds": args.rounds,
            "dup_users": args.dup_users,
            "flash_users": args.flash_users,
            "flash_stock": args.flash_stock,
            "connections": args.connections,
            "ok": ok,
            "rows": summary,
        })
    );
    Ok(ok)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Crowd {
    Duplicates,
    Flash,
}

async fn crowd(
    target: &Target,
    args: &UserLocksArgs,
    design: &'static str,
    kind: Crowd,
) -> anyhow::Result<Run> {
    let admin = target.admin();
    let (users, stock) = match kind {
        Crowd::Duplicates => (args.dup_users, args.dup_users),
        Crowd::Flash => (args.flash_users, args.flash_stock),
    };
    let voucher = admin.create_voucher(SaleMode::Sync, stock, 2).await?;
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, users).await?;
    let plan = match kind {
        // A user's three purchases side by side, on both instances.
        Crowd::Duplicates => target.purchases_over(voucher, &tokens, 3, true),
        Crowd::Flash => {
            let mut plan = target.purchases(voucher, &tokens, 3);
            plan.shuffle(&mut rand::rng());
            plan
        }
    };
    let unread = "an instance's /metrics could not be read";
    let steps_before = sale_steps(target).await.context(unread)?;
    let cpu_before = Usage::now(target).await;
    let started = chrono::Utc::now().timestamp();
    let label = match kind {
        Crowd::Duplicates => "duplicates",
        Crowd::Flash => "flash",
    };
    let tally = target
        .send_each(plan, args.connections, &format!("{label}, {design}"))
        .await;
    let cpu = Usage::now(target)
        .await
        .micros_per(&cpu_before, tally.requests);
    let steps = sale_steps(target).await.context(unread)? - steps_before;
    let check = check(target, voucher, &tally, started, Some(stock.min(users)), 0).await?;
    Ok(Run {
        design,
        crowd: label,
        tally,
        check,
        steps,
        cpu,
    })
}

/// Per design and crowd: the median of the rounds, with the min-max.
fn summarize(runs: &[Run]) -> Vec<Value> {
    let mut rows = Vec::new();
    for crowd in ["duplicates", "flash"] {
        for (design, _) in DESIGNS {
            let of: Vec<&Run> = runs
                .iter()
                .filter(|r| r.design == design && r.crowd == crowd)
                .collect();
            if of.is_empty() {
                continue;
            }
            let spread = |f: &dyn Fn(&Run) -> f64| {
                let mut v: Vec<f64> = of.iter().map(|r| f(r)).collect();
                v.sort_by(f64::total_cmp);
                json!({
                    "median": round(v[v.len() / 2]),
                    "min": round(v[0]),
                    "max": round(v[v.len() - 1]),
                })
            };
            let answers = |code: &'static str| spread(&move |r: &Run| r.tally.count(code) as f64);
            rows.push(json!({
                "crowd": crowd,
                "design": design,
                "runs": of.len(),
                "requests_per_sec": spread(&|r| r.tally.rps()),
                "p50_ms": spread(&|r| r.tally.ms(0.5)),
                "p99_ms": spread(&|r| r.tally.ms(0.99)),
                "orders": spread(&|r| r.check.orders as f64),
                "already_purchased": answers("409 already_purchased"),
                "purchase_in_progress": answers("429 purchase_in_progress"),
                "sold_out": answers("409 sold_out"),
                "batch_statements": spread(&|r| r.steps.batches),
                "batch_reruns": spread(&|r| r.steps.reruns),
                "locks_taken": spread(&|r| r.steps.locks),
                "service_us_per_request": spread(&|r| r.cpu.get("service").copied().unwrap_or(f64::NAN)),
                "redis_us_per_request": spread(&|r| r.cpu.get("redis").copied().unwrap_or(f64::NAN)),
                "postgres_us_per_request": spread(&|r| r.cpu.get("postgres").copied().unwrap_or(f64::NAN)),
                "invariants_ok": of.iter().all(|r| r.check.ok()),
            }));
        }
    }
    rows
}

fn print_table(rows: &[Value]) {
    let mut table = Table::new([
        "crowd",
        "design",
        "req/s",
        "p99 ms",
        "already bought",
        "in progress",
        "batches",
        "reruns",
        "locks",
        "µs svc/redis/pg",
        "invariants",
    ]);
    let cell = |v: &Value| {
        let (m, lo, hi) = (&v["median"], &v["min"], &v["max"]);
        let f = |x: &Value| x.as_f64().map_or("-".to_owned(), |x| format!("{x:.0}"));
        format!("{} ({}-{})", f(m), f(lo), f(hi))
    };
    let median = |v: &Value| {
        v["median"]
            .as_f64()
            .map_or("-".to_owned(), |x| format!("{x:.0}"))
    };
    for r in rows {
        table.row([
            r["crowd"].as_str().unwrap_or_default().to_owned(),
            r["design"].as_str().unwrap_or_default().to_owned(),
            cell(&r["requests_per_sec"]),
            cell(&r["p99_ms"]),
            cell(&r["already_purchased"]),
            cell(&r["purchase_in_progress"]),
            cell(&r["batch_statements"]),
            cell(&r["batch_reruns"]),
            cell(&r["locks_taken"]),
            format!(
                "{}/{}/{}",
                median(&r["service_us_per_request"]),
                median(&r["redis_us_per_request"]),
                median(&r["postgres_us_per_request"])
            ),
            if r["invariants_ok"] == json!(true) {
                "ok"
            } else {
                "BROKEN"
            }
            .to_owned(),
        ]);
    }
    print!("{}", table.text());
    crate::table::record("userlocks", "", &table);
}
