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
mod cli;
mod cpu;
mod crowds;
mod drive;
mod failover;
mod groupcommit;
mod invariants;
mod jwt;
mod lab;
mod lifecycle;
mod lockbench;
mod report;
mod scrape;
mod service;
mod speed;
mod summary;
mod table;
mod units;
mod userlocks;
mod waitingroom;
mod webhooks;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};

use cli::{Cli, Scenario, TokensArgs};
pub(crate) use cli::{CrowdArgs, FlashArgs, HammerArgs, TargetArgs, TimedArgs};
use crowds::{flash, hammer, soldout, throughput};
use service::Target;
pub(crate) use summary::Report;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.record {
        table::start_recording();
    }
    let target = &cli.target;
    // The scenarios that start what they need, or need no service.
    let result = match &cli.scenario {
        Scenario::Lock(args) => lock(target, args).await,
        Scenario::Lab(args) => lab::run(target, args).await,
        Scenario::Lifecycle(args) => run_lifecycle(target, args).await,
        Scenario::Userlocks(args) => userlocks::run(target, args).await,
        Scenario::Groupcommit(args) => groupcommit::run(target, args).await,
        Scenario::Abuse(args) => abuse::run(target, args).await,
        Scenario::Flood(args) => abuse::flood_process(args).await,
        Scenario::Waitingroom(args) => waitingroom::run(target, args).await,
        Scenario::Failover(args) => failover::run(target, args).await,
        Scenario::Webhooks(args) => webhooks::run(target, args).await,
        Scenario::Jwt(args) => jwt::run(target, args).await,
        Scenario::Tokens(args) => write_tokens(target, args).await.map(|()| true),
        _ => on_one_service(&cli).await,
    };
    exit(result)
}

/// The lock library alone; its JSON line printed.
async fn lock(target: &TargetArgs, args: &lockbench::LockArgs) -> anyhow::Result<bool> {
    let json = lockbench::run(args, &target.launch(1, Vec::new())).await?;
    println!("{json}");
    Ok(true)
}

/// The scenarios that share one service: the one given by --url, or one
/// this driver starts (an async run then kills instances of its own).
async fn on_one_service(cli: &Cli) -> anyhow::Result<bool> {
    let target = match &cli.target.url {
        Some(url) => {
            let mut target =
                Target::remote(url, cli.target.admin_token.as_deref().unwrap_or_default());
            target.database_url = cli.target.database_url.clone();
            target
        }
        None => {
            let instances = match &cli.scenario {
                Scenario::Flash(args) => args.instances,
                Scenario::Async(args) => args.instances,
                _ => 1,
            };
            Target::start(cli.target.launch(instances, Vec::new())).await?
        }
    };
    let result = run(&cli.scenario, &target, cli.target.pgbench_seconds);
    let result = service::unless_interrupted(result).await;
    target.stop().await;
    // Killing an instance takes instances of our own.
    let mut reports = result?;
    if let Scenario::Async(args) = &cli.scenario {
        if cli.target.url.is_none() {
            reports.push(asyncsale::killed(&cli.target, args).await?);
        }
    }
    let name = match (&cli.scenario, reports.as_slice()) {
        (Scenario::Async(_), _) => "async",
        (Scenario::Speed(_), _) => "speed",
        (_, [only]) => only.scenario,
        _ => "all",
    };
    Ok(summary::finish(name, &reports))
}

/// The lifecycle signs payment notifications: it starts its own two
/// instances with a payment secret of its own.
async fn run_lifecycle(
    target: &TargetArgs,
    args: &lifecycle::LifecycleArgs,
) -> anyhow::Result<bool> {
    target.starts_its_own("lifecycle starts its own two instances (it signs payments)")?;
    // At least 32 bytes, or the service refuses to start.
    let secret = format!("load-payment-secret-{}", uuid::Uuid::new_v4().simple());
    target
        .launch(2, vec![("SECKILL_PAYMENT_SECRET".into(), secret.clone())])
        .run(async |service| lifecycle::run(service, &secret, args).await)
        .await
}

/// The exit code of a run: failure when it could not run (the reason is
/// printed) or when what it checked did not hold.
fn exit(result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("loadtest: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Tokens die with the process that signed them (unless it has a fixed
/// SECKILL_TOKEN_SECRET), so they are minted by a service that stays up.
async fn write_tokens(target: &TargetArgs, args: &TokensArgs) -> anyhow::Result<()> {
    let (Some(url), Some(admin_token)) = (&target.url, &target.admin_token) else {
        anyhow::bail!("tokens needs a running service: --url URL --admin-token T");
    };
    let target = Target::remote(url, admin_token);
    let tokens = target.admin().tokens(1, args.users).await?;
    let list: Vec<Value> = tokens
        .iter()
        .zip(1_i64..)
        .map(|(token, user_id)| json!({ "user_id": user_id, "token": token }))
        .collect();
    let text = serde_json::to_string(&list)?;
    std::fs::write(&args.out, text).with_context(|| args.out.display().to_string())?;
    eprintln!("wrote {} tokens to {}", list.len(), args.out.display());
    Ok(())
}

async fn run(
    scenario: &Scenario,
    target: &Target,
    pgbench_seconds: u64,
) -> anyhow::Result<Vec<Report>> {
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
        | Scenario::Flood(_)
        | Scenario::Waitingroom(_)
        | Scenario::Userlocks(_)
        | Scenario::Failover(_)
        | Scenario::Webhooks(_)
        | Scenario::Jwt(_) => {
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
                    quantity: Default::default(),
                    instances: 1,
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

/// The middle value (the mean of the two middle ones for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
