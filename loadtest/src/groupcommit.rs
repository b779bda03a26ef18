//! Group commit against one order per transaction, in one run: each design
//! (`SECKILL_SALE_BATCH_MAX=1` and the default) on one and two instances,
//! with a throughput run (distinct users, stock that cannot run out) and a
//! flash crowd; then two batching instances, one of them killed with
//! `kill -9` in the middle of a crowd. Every row's invariants are checked,
//! and every order acknowledged with a 200 must exist.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

use crate::api::SaleMode;
use crate::drive::Tally;
use crate::invariants::check;
use crate::invariants::Check;
use crate::service::{Launch, Target};
use crate::table::Table;
use crate::{round, CrowdArgs, TargetArgs};

#[derive(Args, Clone)]
pub struct GroupCommitArgs {
    /// Seconds of each throughput run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Distinct users of the throughput runs.
    #[arg(long, default_value_t = 100_000)]
    pub users: i64,
    /// Connections of the throughput runs.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    #[command(flatten)]
    pub crowd: CrowdArgs,
    /// The batched design's cap (SECKILL_SALE_BATCH_MAX).
    #[arg(long, default_value_t = 256)]
    pub batch_max: u32,
}

/// One row of the comparison.
pub struct Row {
    pub design: &'static str,
    pub instances: usize,
    pub scenario: &'static str,
    pub tally: Tally,
    pub check: Check,
    /// Committed orders per second of the run.
    pub orders_per_sec: f64,
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "design": self.design,
            "instances": self.instances,
            "scenario": self.scenario,
            "requests": self.tally.requests,
            "orders": self.check.orders,
            "orders_per_sec": round(self.orders_per_sec),
            "rps": round(self.tally.rps()),
            "p50_ms": round(self.tally.ms(0.50)),
            "p99_ms": round(self.tally.ms(0.99)),
            "invariants_ok": self.check.ok(),
            "problems": self.check.problems,
            "status": self.tally.statuses,
        })
    }
}

/// Runs every row; `Ok(false)` when an invariant broke somewhere.
pub async fn run(target: &TargetArgs, args: &GroupCommitArgs) -> anyhow::Result<bool> {
    target.starts_its_own("groupcommit starts its own instances (one design each)")?;
    let mut rows = Vec::new();
    for (design, batch_max) in [("single", 1), ("batched", args.batch_max)] {
        for instances in [1, 2] {
            let both = launch(target, instances, batch_max)
                .run(async |service| {
                    Ok([
                        throughput(service, args).await?,
                        flash(service, args, None).await?,
                    ])
                })
                .await?;
            for (scenario, (tally, check, orders_per_sec)) in
                ["throughput", "flash"].into_iter().zip(both)
            {
                rows.push(Row {
                    design,
                    instances,
                    scenario,
                    tally,
                    check,
                    orders_per_sec,
                });
            }
        }
    }
    // Two batching instances; the second is killed mid-crowd.
    let (tally, check, orders_per_sec) = launch(target, 2, args.batch_max)
        .run(async |service| flash(service, args, Some(KILL_AFTER)).await)
        .await?;
    rows.push(Row {
        design: "batched",
        instances: 2,
        scenario: "kill -9",
        tally,
        check,
        orders_per_sec,
    });

    print_table(&rows);
    let ok = rows.iter().all(|r| r.check.ok());
    println!(
        "{}",
        json!({
            "scenario": "groupcommit",
            "batch_max": args.batch_max,
            "ok": ok,
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        })
    );
    Ok(ok)
}

fn launch(target: &TargetArgs, instances: usize, batch_max: u32) -> Launch {
    target.launch(
        instances,
        vec![("SECKILL_SALE_BATCH_MAX".into(), batch_max.to_string())],
    )
}

async fn throughput(
    target: &Target,
    args: &GroupCommitArgs,
) -> anyhow::Result<(Tally, Check, f64)> {
    let admin = target.admin();
    let voucher = admin.endless_voucher(SaleMode::Sync).await?;
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, args.users).await?;
    let started = chrono::Utc::now().timestamp();
    let label = format!("throughput x{}", target.bases.len());
    let limit = Duration::from_secs(args.seconds);
    let tally = target
        .buy_once(voucher, &tokens, limit, args.connections, &label)
        .await;
    let check = check(target, voucher, &tally, started, None, 0).await?;
    let rate = check.orders as f64 / tally.elapsed.as_secs_f64().max(1e-9);
    Ok((tally, check, rate))
}

/// When the second instance is killed, counted from the crowd's start.
const KILL_AFTER: Duration = Duration::from_millis(700);

async fn flash(
    target: &Target,
    args: &GroupCommitArgs,
    kill_after: Option<Duration>,
) -> anyhow::Result<(Tally, Check, f64)> {
    let admin = target.admin();
    // With a kill, a crowd that lasts: stock for half of the users.
    let (users, stock) = match kill_after {
        Some(_) => (args.crowd.flash_users * 2, args.crowd.flash_users),
        None => (args.crowd.flash_users, args.crowd.flash_stock),
    };
    let voucher = admin.create_voucher(SaleMode::Sync, stock, 2).await?;
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, users).await?;
    let mut plan = target.purchases(voucher, &tokens, 3);
    plan.shuffle(&mut rand::rng());
    let started = chrono::Utc::now().timestamp();
    let clock = Instant::now();
    let label = format!("flash x{}", target.bases.len());
    let crowd = target.send_each(plan, args.crowd.flash_connections, &label);
    let tally = match kill_after {
        None => crowd.await,
        Some(after) => {
            let kill = async {
                tokio::time::sleep(after).await;
                if let Some(pid) = target.kill(1) {
                    eprintln!(
                        "kill -9 of instance 2 (pid {pid}) after {:?}",
                        clock.elapsed()
                    );
                }
            };
            tokio::join!(crowd, kill).0
        }
    };
    // All the stock sells when every instance lived; after a kill, what
    // sold is what sold, and every 200 must be among it.
    let expected = kill_after.is_none().then_some(stock.min(users));
    let check = check(target, voucher, &tally, started, expected, 0).await?;
    let rate = check.orders as f64 / tally.elapsed.as_secs_f64().max(1e-9);
    Ok((tally, check, rate))
}

pub fn print_table(rows: &[Row]) {
    let mut table = Table::new([
        "design",
        "inst",
        "scenario",
        "requests",
        "orders",
        "orders/s",
        "p50 ms",
        "p99 ms",
        "invariants",
    ]);
    for r in rows {
        table.row([
            r.design.to_owned(),
            r.instances.to_string(),
            r.scenario.to_owned(),
            r.tally.requests.to_string(),
            r.check.orders.to_string(),
            format!("{:.0}", r.orders_per_sec),
            format!("{:.2}", r.tally.ms(0.50)),
            format!("{:.2}", r.tally.ms(0.99)),
            if r.check.ok() { "ok" } else { "BROKEN" }.to_owned(),
        ]);
    }
    print!("{}", table.text());
    for problem in rows.iter().flat_map(|r| &r.check.problems) {
        println!("    {problem}");
    }
    crate::table::record("groupcommit", "", &table);
}
