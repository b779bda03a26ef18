//! `loadtest`: drives a seckill service with a crowd, then proves the
//! contract's invariants held and prints how fast it went.
//!
//! By default it starts the release `seckill` binary itself on a free port,
//! against a fresh database and the local Redis, and stops it afterwards;
//! `--url URL --admin-token T` targets an existing deployment instead. The
//! last line printed is one JSON object; the exit code is non-zero when an
//! invariant failed.

mod abuse;
mod api;
mod asyncsale;
mod ceilings;
mod cpu;
mod crowds;
mod drive;
mod failover;
mod groupcommit;
mod invariants;
mod lab;
mod lablife;
mod lifecycle;
mod lockbench;
mod report;
mod scrape;
mod service;
mod speed;
mod table;
mod userlocks;
mod waitingroom;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use api::Admin;
use crowds::{flash, hammer, soldout, throughput};
use drive::Tally;
use invariants::Check;
use service::{Launch, Target};
use table::Table;

#[derive(Parser)]
#[command(about = "Load tests for seckill: no oversell, and how fast")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    #[command(flatten)]
    target: TargetArgs,
    /// Write the run's tables into the guide (docs/guide/src/measured/),
    /// replacing what an earlier run wrote there.
    #[arg(long, global = true)]
    record: bool,
}

#[derive(Args)]
struct TargetArgs {
    /// Test this running service instead of starting one.
    #[arg(long, global = true, requires = "admin_token")]
    url: Option<String>,
    /// The admin token of the service given by --url.
    #[arg(long, global = true, env = "SECKILL_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// The seckill binary to start (default: built next to this driver).
    #[arg(long, global = true)]
    seckill_bin: Option<PathBuf>,
    /// SECKILL_PG_POOL for the service this driver starts.
    #[arg(long, global = true)]
    pg_pool: Option<u32>,
    /// Keep the database and the Redis keys of the service this driver starts.
    #[arg(long, global = true)]
    keep_db: bool,
    /// The database of the service given by --url, for pgbench and SQL
    /// checks (a service this driver starts is known already).
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Seconds of each pgbench run (one per client count).
    #[arg(long, global = true, default_value_t = 3)]
    pgbench_seconds: u64,
}

impl TargetArgs {
    /// `instances` of the service this driver starts, with `env` added.
    fn launch(&self, instances: usize, env: Vec<(String, String)>) -> Launch {
        Launch {
            seckill_bin: self.seckill_bin.clone(),
            pg_pool: self.pg_pool,
            keep_db: self.keep_db,
            instances,
            env,
            lab: false,
        }
    }
}

/// The flash crowd of a comparison (`groupcommit`, `async`): users with
/// three requests each, in random order, for scarce stock. Their kill runs
/// take twice the users, with stock for half of them.
#[derive(Args, Clone)]
pub struct CrowdArgs {
    /// Users of the flash crowd (three requests each).
    #[arg(long, default_value_t = 10_000)]
    pub flash_users: i64,
    /// Units on sale to the flash crowd.
    #[arg(long, default_value_t = 100)]
    pub flash_stock: i64,
    /// Connections of the flash crowd.
    #[arg(long, default_value_t = 1_000)]
    pub flash_connections: usize,
}

#[derive(Subcommand)]
enum Scenario {
    /// A crowd of users, a few requests each in random order, for scarce stock.
    Flash(FlashArgs),
    /// One user, many concurrent requests: exactly one order.
    Hammer(HammerArgs),
    /// Distinct users against stock that cannot run out: orders per second.
    Throughput(TimedArgs),
    /// A sold-out voucher flooded: rejections per second, beside /healthz.
    Soldout(TimedArgs),
    /// Every scenario in turn, with their default sizes.
    All,
    /// Mint tokens through --url's admin API into a JSON file for k6/oha.
    Tokens(TokensArgs),
    /// The lock library alone: lock+unlock pairs/s beside raw EVALSHA, and
    /// a waiter's wake-up delay after an unlock.
    Lock(LockBenchArgs),
    /// Every lab strategy on one and two instances, with and without a
    /// stall past the lease: which anomalies appear (LAB.md).
    Lab(lab::LabArgs),
    /// Group commit against one order per transaction, on one and two
    /// instances, and with one of two instances killed mid-crowd.
    Groupcommit(groupcommit::GroupCommitArgs),
    /// Async (Redis-first) sales beside the sync path: accepted/s against
    /// /healthz, accepted -> confirmed, the writers' drain rate against
    /// group commit's, an async flash crowd; the goals judged.
    Async(asyncsale::AsyncArgs),
    /// What a purchase costs the server beside /healthz: CPU µs per request
    /// by process, Redis commands per purchase and PINGs, the rates and
    /// their ratios, sync and async, in one run (the speed goals judged).
    Speed(speed::SpeedArgs),
    /// The order lifecycle on two instances: payments racing the deadline,
    /// delivered twice; cancels; expiry under load and all at once; returned
    /// units sold again; conservation sampled throughout.
    Lifecycle(lifecycle::LifecycleArgs),
    /// An honest crowd of buyers beside each attack the service's limits
    /// are for (floods from one address, one token on many connections, a
    /// bot farm, slow bodies), on instances of its own with limits on;
    /// what a refused request costs beside /healthz.
    Abuse(abuse::AbuseArgs),
    /// A sale behind a waiting room on instances of its own: a crowd
    /// joining before the start, another after it, bots joining again and
    /// again, everyone polling as told; fairness, pace, no purchase without
    /// an admission, a poll's CPU beside /healthz, proof of work's cost.
    Waitingroom(waitingroom::WaitingRoomArgs),
    /// A sale through `kill -9`s of the Postgres primary, on a three-node
    /// Patroni cluster of its own (scripts/ha.sh): per kill, the time to
    /// the next committed order, the 503s, answered orders missing (none),
    /// throughput before and after; single-node vs replicated throughput.
    Failover(failover::FailoverArgs),
    /// The same binary with the per-user lock on and off
    /// (SECKILL_USER_LOCKS), two instances, rounds alternating the two: a
    /// crowd sending each user's purchases at once over both instances,
    /// and a flash crowd; what the lock buys and costs, with the spread.
    Userlocks(userlocks::UserLocksArgs),
}

#[derive(Args, Clone)]
struct LockBenchArgs {
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent tasks, each with its own lock (and redis-benchmark clients).
    #[arg(long, default_value_t = 50)]
    tasks: usize,
    /// Wake-up samples.
    #[arg(long, default_value_t = 200)]
    wakeups: usize,
    /// Sequential RedLock lock+unlock rounds over five redis-server nodes
    /// of its own, all up and then two frozen (0: skip).
    #[arg(long, default_value_t = 2_000)]
    redlock_rounds: usize,
    /// Seconds of purchases through the service with its users' locks as
    /// RedLocks over those nodes, all up and then two frozen (0: skip).
    #[arg(long, default_value_t = 5)]
    redlock_purchase_seconds: u64,
}

#[derive(Args, Clone)]
struct TokensArgs {
    /// Users 1..=N get a token.
    #[arg(long, default_value_t = 10_000)]
    users: i64,
    /// Where to write `[{"user_id": .., "token": ".."}, ...]`.
    #[arg(long, default_value = "tokens.json")]
    out: PathBuf,
}

#[derive(Args, Clone)]
pub(crate) struct FlashArgs {
    #[arg(long, default_value_t = 10_000)]
    pub users: i64,
    #[arg(long, default_value_t = 100)]
    pub stock: i64,
    /// Requests per user.
    #[arg(long, default_value_t = 3)]
    pub per_user: usize,
    #[arg(long, default_value_t = 1_000)]
    pub connections: usize,
}

#[derive(Args, Clone)]
struct HammerArgs {
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    #[arg(long, default_value_t = 200)]
    connections: usize,
}

#[derive(Args, Clone)]
struct TimedArgs {
    /// Seconds of load (throughput: 20, soldout: 10 when not given).
    #[arg(long)]
    seconds: Option<u64>,
    /// Distinct users with tokens.
    #[arg(long, default_value_t = 100_000)]
    users: i64,
    #[arg(long, default_value_t = 200)]
    connections: usize,
}

/// The outcome of one scenario.
struct Report {
    scenario: &'static str,
    tally: Tally,
    check: Check,
    ratios: Option<Value>,
    extra: Value,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.record {
        table::start_recording();
    }
    if let Scenario::Lock(args) = &cli.scenario {
        let args = lockbench::LockArgs {
            seconds: args.seconds,
            tasks: args.tasks,
            wakeups: args.wakeups,
            redlock_rounds: args.redlock_rounds,
            redlock_purchase_seconds: args.redlock_purchase_seconds,
            launch: cli.target.launch(1, Vec::new()),
        };
        return match lockbench::run(&args).await {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loadtest: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Scenario::Lab(args) = &cli.scenario {
        return exit(run_lab(&cli.target, args).await);
    }
    if let Scenario::Lifecycle(args) = &cli.scenario {
        return exit(run_lifecycle(&cli.target, args).await);
    }
    if let Scenario::Userlocks(args) = &cli.scenario {
        return exit(userlocks::run(&cli.target, args).await);
    }
    if let Scenario::Groupcommit(args) = &cli.scenario {
        return exit(groupcommit::run(&cli.target, args).await);
    }
    if let Scenario::Abuse(args) = &cli.scenario {
        return exit(abuse::run(&cli.target, args).await);
    }
    if let Scenario::Waitingroom(args) = &cli.scenario {
        return exit(waitingroom::run(&cli.target, args).await);
    }
    if let Scenario::Failover(args) = &cli.scenario {
        return exit(failover::run(&cli.target, args).await);
    }
    if let Scenario::Tokens(args) = &cli.scenario {
        return match write_tokens(&cli.target, args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loadtest: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let target = match &cli.target.url {
        Some(url) => {
            let mut target =
                Target::remote(url, cli.target.admin_token.as_deref().unwrap_or_default());
            target.database_url = cli.target.database_url.clone();
            target
        }
        None => match Target::start(cli.target.launch(1, Vec::new())).await {
            Ok(target) => target,
            Err(e) => {
                eprintln!("loadtest: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let result = run(&cli.scenario, &target, cli.target.pgbench_seconds).await;
    target.stop().await;
    // Killing an instance takes instances of our own.
    let result = match (&cli.scenario, result) {
        (Scenario::Async(args), Ok(mut reports)) if cli.target.url.is_none() => {
            asyncsale::killed(&cli.target, args).await.map(|killed| {
                reports.push(killed);
                reports
            })
        }
        (_, result) => result,
    };
    exit(result.map(|reports| {
        let sections: Vec<report::Section> = reports.iter().map(report_section).collect();
        let name = match (&cli.scenario, reports.as_slice()) {
            (Scenario::Async(_), _) => "async",
            (Scenario::Speed(_), _) => "speed",
            (_, [only]) => only.scenario,
            _ => "all",
        };
        print_table(name, &reports);
        save_report(
            name,
            &report::html(&format!("seckill load test: {name}"), &sections, &[], &[]),
        );
        let ok = reports.iter().all(|r| r.check.ok());
        let json = if let [only] = reports.as_slice() {
            report_json(only)
        } else {
            // Totals on top; each scenario's own figures below.
            let mut status = std::collections::BTreeMap::<String, u64>::new();
            for r in &reports {
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
    }))
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

/// Writes a report under `target/loadtest/` and says where.
fn save_report(name: &str, page: &str) {
    let dir = std::path::Path::new("target").join("loadtest");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
        let path = dir.join(format!("{name}-{stamp}.html"));
        std::fs::write(&path, page).map(|()| path)
    });
    match written {
        Ok(path) => eprintln!("report: {}", path.display()),
        Err(error) => eprintln!("report not written: {error}"),
    }
}

/// The lab starts its own two instances with the lab on: no deployment
/// should serve it. `Ok(false)`: a design broke a guarantee it gives.
async fn run_lab(target: &TargetArgs, args: &lab::LabArgs) -> Result<bool, String> {
    if target.url.is_some() {
        return Err(
            "lab starts its own two instances of seckill-lab (SECKILL_LAB=1); drop --url".into(),
        );
    }
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
    let result = lab::run(&target, args).await;
    let life = match (&result, &target.database_url) {
        (Ok(_), Some(url)) => {
            let prefix = format!("lablife:{}:", uuid::Uuid::new_v4().simple());
            Some(lablife::run(url, &service::redis_url(), &prefix, args.lifecycle_orders).await)
        }
        _ => None,
    };
    target.stop().await;
    let rows = result?;
    let life = life.transpose()?.unwrap_or_default();
    print!("{}", lab::table(&rows).text());
    let grid = lab::grid(&rows);
    table::record("lab", "", &grid);
    let life_table = lablife::table(&life);
    print!("\n{}", life_table.text());
    table::record("lab-lifecycle", "", &life_table);
    // A chart per anomaly, of the cells where it happened (the most any
    // run of a cell counted): a reader takes in the grid first, then how
    // large each failure was.
    let cells = lab::cells(&rows);
    let repeat = args.repeat.max(1);
    let most = if repeat > 1 {
        format!(" (the most of {repeat} runs)")
    } else {
        String::new()
    };
    let anomaly = |title: &str, value: fn(&lab::Row) -> i64| report::Bars {
        title: format!("{title}, where it happened{most}"),
        rows: cells
            .iter()
            .filter(|c| c.max(value) > 0)
            .map(|c| (c.label(), c.max(value) as f64))
            .collect(),
    };
    let bars = [
        anomaly("Oversold units", lab::Row::oversold),
        anomaly("Undersold units", lab::Row::undersold),
        anomaly("Users with two orders", lab::Row::duplicate_users),
        anomaly("Releases of another request's lock", |r| {
            r.stats.foreign_releases
        }),
        anomaly("Accepted by Redis, never stored", lab::Row::lost),
    ];
    save_report(
        "lab",
        &report::html(
            "seckill lab: every design, broken with real rows",
            &[],
            &[
                ("Each design in each scenario", grid.html()),
                ("After the grab: the lifecycle's designs", life_table.html()),
            ],
            &bars,
        ),
    );
    let failed: Vec<&lab::Row> = rows.iter().filter(|r| r.failed()).collect();
    let life_failed: Vec<&lablife::LifeRow> = life.iter().filter(|r| r.failed()).collect();
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
    println!(
        "{}",
        json!({
            "scenario": "lab",
            "lease_ms": lease.as_millis(),
            "users": args.users,
            "per_user": args.per_user,
            "stock": args.stock,
            "pairs": args.pairs,
            "repeat": repeat,
            "ok": failed.is_empty() && life_failed.is_empty(),
            "rows": rows.iter().map(lab::Row::json).collect::<Vec<_>>(),
            "cells": cells.iter().map(lab::CellRuns::json).collect::<Vec<_>>(),
            "lifecycle_rows": life.iter().map(lablife::LifeRow::json).collect::<Vec<_>>(),
        })
    );
    Ok(failed.is_empty() && life_failed.is_empty())
}

/// The lifecycle signs payment notifications: it starts its own two
/// instances with a payment secret of its own.
async fn run_lifecycle(
    target: &TargetArgs,
    args: &lifecycle::LifecycleArgs,
) -> Result<bool, String> {
    if target.url.is_some() {
        return Err(
            "lifecycle starts its own two instances (it signs payments); drop --url".into(),
        );
    }
    // At least 32 bytes, or the service refuses to start.
    let secret = format!("load-payment-secret-{}", uuid::Uuid::new_v4().simple());
    let launch = target.launch(2, vec![("SECKILL_PAYMENT_SECRET".into(), secret.clone())]);
    let target = Target::start(launch).await?;
    let result = lifecycle::run(&target, &secret, args).await;
    target.stop().await;
    result
}

/// The exit code of a run: failure when it could not run (the reason is
/// printed) or when what it checked did not hold.
fn exit(result: Result<bool, String>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("loadtest: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Tokens die with the process that signed them (unless it has a fixed
/// SECKILL_TOKEN_SECRET), so they are minted by a service that stays up.
async fn write_tokens(target: &TargetArgs, args: &TokensArgs) -> Result<(), String> {
    let (Some(url), Some(admin_token)) = (&target.url, &target.admin_token) else {
        return Err("tokens needs a running service: --url URL --admin-token T".into());
    };
    let target = Target::remote(url, admin_token);
    let tokens = Admin::new(&target).tokens(1, args.users).await?;
    let list: Vec<Value> = tokens
        .iter()
        .zip(1_i64..)
        .map(|(token, user_id)| json!({ "user_id": user_id, "token": token }))
        .collect();
    let text = serde_json::to_string(&list).map_err(|e| e.to_string())?;
    std::fs::write(&args.out, text).map_err(|e| format!("{}: {e}", args.out.display()))?;
    eprintln!("wrote {} tokens to {}", list.len(), args.out.display());
    Ok(())
}

async fn run(
    scenario: &Scenario,
    target: &Target,
    pgbench_seconds: u64,
) -> Result<Vec<Report>, String> {
    let timed = |seconds| TimedArgs {
        seconds: Some(seconds),
        users: 100_000,
        connections: 200,
    };
    Ok(match scenario {
        Scenario::Flash(args) => vec![flash(target, args).await?],
        Scenario::Hammer(args) => vec![hammer(target, args).await?],
        Scenario::Throughput(args) => vec![throughput(target, args, pgbench_seconds).await?],
        Scenario::Soldout(args) => vec![soldout(target, args).await?],
        Scenario::Async(args) => asyncsale::run(target, args).await?,
        Scenario::Speed(args) => speed::run(target, args).await?,
        Scenario::Tokens(_)
        | Scenario::Lock(_)
        | Scenario::Lab(_)
        | Scenario::Groupcommit(_)
        | Scenario::Lifecycle(_)
        | Scenario::Abuse(_)
        | Scenario::Waitingroom(_)
        | Scenario::Userlocks(_)
        | Scenario::Failover(_) => {
            unreachable!("handled before a target starts")
        }
        Scenario::All => vec![
            flash(
                target,
                &FlashArgs {
                    users: 10_000,
                    stock: 100,
                    per_user: 3,
                    connections: 1_000,
                },
            )
            .await?,
            hammer(
                target,
                &HammerArgs {
                    requests: 10_000,
                    connections: 200,
                },
            )
            .await?,
            throughput(target, &timed(20), pgbench_seconds).await?,
            soldout(target, &timed(10)).await?,
        ],
    })
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        // Clap checks every subcommand's arguments only when one is used:
        // two flattened flags with one id would panic at that moment.
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "loadtest",
            "async",
            "--flash-users",
            "7",
            "--flash-stock",
            "3",
        ])
        .expect("async parses");
        let Scenario::Async(args) = cli.scenario else {
            panic!("not the async scenario")
        };
        assert_eq!((args.crowd.flash_users, args.crowd.flash_stock), (7, 3));
        assert_eq!(args.crowd.flash_connections, 1_000);
    }
}
