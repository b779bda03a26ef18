//! `loadtest speed`: what a purchase costs the server next to an HTTP
//! request that does nothing, in figures that do not depend on the
//! machine's mood: CPU µs per request by process (service, Redis,
//! Postgres, driver) for `/healthz`, sync and async purchases; Redis
//! commands per purchase (sent by clients, counted with `MONITOR`, and
//! executed, scripts' own included, with `PING`s, from `INFO
//! commandstats`); the rates and their ratios. All in one run.

mod commands;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::{Admin, SaleMode};
use crate::asyncsale::{drain, print_goals, Goal};
use crate::cpu::Usage;
use crate::drive::Tally;
use crate::invariants::{check, Check};
use crate::round3 as round;
use crate::service::Target;
use crate::table::Table;
use crate::Report;
use commands::{commandstats, count_client_commands, Sent};

/// Flash crowds (each beside a /healthz crowd) of one run.
const FLASH_ROUNDS: usize = 3;

#[derive(clap::Args, Clone)]
pub struct SpeedArgs {
    /// Seconds of each timed run (/healthz, sync, async, /healthz again).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Distinct users of the timed runs; each buys once per voucher, and a
    /// run that uses them all up ends early and says so.
    #[arg(long, default_value_t = 300_000)]
    pub users: i64,
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    /// Purchases (of each mode) whose Redis commands are counted one by
    /// one with MONITOR, in a run of their own after the timed ones.
    #[arg(long, default_value_t = 2_000)]
    pub counted: i64,
    /// Users of the flash crowd (three requests each, 1,000 connections,
    /// 100 units) whose p99 is judged beside /healthz's at the same
    /// concurrency.
    #[arg(long, default_value_t = 10_000)]
    pub flash_users: i64,
}

/// One timed run's cost.
struct Cost {
    /// Requests (or purchases) per second.
    rate: f64,
    /// CPU µs per request, by process.
    cpu: BTreeMap<&'static str, f64>,
    /// Redis commands executed per request (scripts' own included), and
    /// PINGs per request.
    executed: f64,
    pings: f64,
}

impl Cost {
    /// Service, Redis and Postgres: the server's CPU per request.
    fn server(&self) -> f64 {
        crate::cpu::server_share(&self.cpu)
    }

    /// The mean of two runs of one kind.
    fn mean(a: &Cost, b: &Cost) -> Cost {
        let cpu = a
            .cpu
            .keys()
            .chain(b.cpu.keys())
            .map(|process| {
                let us = |cost: &Cost| cost.cpu.get(process).copied().unwrap_or(0.0);
                (*process, (us(a) + us(b)) / 2.0)
            })
            .collect();
        Cost {
            rate: (a.rate + b.rate) / 2.0,
            cpu,
            executed: (a.executed + b.executed) / 2.0,
            pings: (a.pings + b.pings) / 2.0,
        }
    }

    fn json(&self) -> Value {
        json!({
            "rate": round(self.rate),
            "cpu_us": self.cpu,
            "server_cpu_us": round(self.server()),
            "redis_commands_executed": round(self.executed),
            "redis_pings": round(self.pings),
        })
    }
}

pub async fn run(target: &Target, args: &SpeedArgs) -> anyhow::Result<Vec<Report>> {
    let admin = target.admin();
    let seconds = Duration::from_secs(args.seconds);
    eprintln!("speed: minting {} tokens", args.users + 2 * args.counted);
    let tokens = admin.shared_tokens(1, args.users).await?;

    // /healthz runs before and after the purchases, and is judged by the
    // mean of the two: the machine's speed drifts during a run, and a
    // floor measured at one end alone would bill that drift to the ratios.
    let healthz = || async {
        let (tally, cost) = measured(target, || async {
            let tally = target.healthz(seconds, args.connections).await;
            let n = tally.requests;
            Ok((tally, n))
        })
        .await?;
        Ok::<_, anyhow::Error>(Cost {
            rate: tally.rps(),
            ..cost
        })
    };
    let health_first = healthz().await?;

    let (sync, sync_check, sync_cost) = purchases(target, &tokens, args, SaleMode::Sync).await?;
    let (accepted_run, async_check, async_cost) =
        purchases(target, &tokens, args, SaleMode::Async).await?;
    let health_last = healthz().await?;
    let health_cost = Cost::mean(&health_first, &health_last);

    // Client commands, one by one: MONITOR slows Redis, so it watches runs
    // of their own, of fresh users.
    let admin = &admin;
    let counted = |first: i64, mode: SaleMode| async move {
        let tokens = admin.shared_tokens(first, args.counted).await?;
        let voucher = admin.endless_voucher(mode).await?;
        count_client_commands(target, voucher, &tokens, args.connections).await
    };
    let sync_sent = counted(args.users + 1, SaleMode::Sync).await?;
    let async_sent = counted(args.users + args.counted + 1, SaleMode::Async).await?;
    let flash = flash_rounds(target, args).await?;

    let goals = goals(
        &health_cost,
        [&sync_cost, &async_cost],
        [&sync_sent, &async_sent],
        flash.median_ratio,
    );
    print_costs(&[
        ("/healthz, first", &health_first),
        ("/healthz, last", &health_last),
        ("/healthz, mean", &health_cost),
        ("sync purchase", &sync_cost),
        ("async purchase", &async_cost),
    ]);
    print_sent_and_flash([&sync_sent, &async_sent], &flash);
    print_goals("speed", &goals);

    Ok(reports(
        args,
        [&health_first, &health_last, &health_cost],
        [
            (sync, sync_check, sync_cost),
            (accepted_run, async_check, async_cost),
        ],
        [&sync_sent, &async_sent],
        flash,
        &goals,
    ))
}

/// The run's reports: sync's, with every cost and goal; async's; the flash median's.
fn reports(
    args: &SpeedArgs,
    [health_first, health_last, health_cost]: [&Cost; 3],
    purchases: [(Tally, Check, Cost); 2],
    [sync_sent, async_sent]: [&Sent; 2],
    flash: FlashRounds,
    goals: &[Goal],
) -> Vec<Report> {
    let [(sync, sync_check, sync_cost), (accepted_run, async_check, async_cost)] = purchases;
    let costs = json!({
        "healthz": health_cost.json(),
        "healthz_runs": [health_first.json(), health_last.json()],
        "sync": sync_cost.json(),
        "async": async_cost.json(),
        "client_commands_per_purchase": {
            "sync": round(sync_sent.per_purchase),
            "async": round(async_sent.per_purchase),
            "sync_by_name": sync_sent.by_name,
            "async_by_name": async_sent.by_name,
            "sync_scripts_by_name": sync_sent.scripts_by_name,
            "async_scripts_by_name": async_sent.scripts_by_name,
        },
        "flash_p99_ratios": flash.ratios,
        "flash_locks_taken": flash.locks,
        "goals": goals.iter().map(Goal::json).collect::<Vec<_>>(),
    });
    vec![
        Report {
            scenario: "speed-sync",
            tally: sync,
            check: sync_check,
            ratios: Some(costs),
            extra: json!({ "connections": args.connections }),
        },
        Report {
            scenario: "speed-async",
            tally: accepted_run,
            check: async_check,
            ratios: None,
            extra: json!({ "connections": args.connections }),
        },
        flash.median,
    ]
}

/// A run of purchases of `mode` by distinct users, its invariants and
/// what each purchase cost. An async purchase's cost includes its writing
/// to Postgres; the rate is of the load alone, not of the drain after it.
async fn purchases(
    target: &Target,
    tokens: &[Arc<str>],
    args: &SpeedArgs,
    mode: SaleMode,
) -> anyhow::Result<(Tally, Check, Cost)> {
    let admin = target.admin();
    let (label, taken) = match mode {
        SaleMode::Sync => ("sync", "200"),
        SaleMode::Async => ("async", "202"),
    };
    let voucher = admin.endless_voucher(mode).await?;
    let started = chrono::Utc::now().timestamp();
    let seconds = Duration::from_secs(args.seconds);
    let (tally, cost) = measured(target, || async {
        let clock = Instant::now();
        let tally = target
            .buy_once(voucher, tokens, seconds, args.connections, label)
            .await;
        let n = tally.count(taken);
        if mode == SaleMode::Async {
            wait_stored(target, &admin, voucher, n, clock).await?;
        }
        Ok((tally, n))
    })
    .await?;
    let checked = check(target, voucher, &tally, started, None, 0).await?;
    let cost = Cost {
        rate: tally.count(taken) as f64 / tally.elapsed.as_secs_f64().max(1e-9),
        ..cost
    };
    Ok((tally, checked, cost))
}

/// The commands each purchase sent, by name, and each flash round's ratio
/// and locks.
fn print_sent_and_flash([sync_sent, async_sent]: [&Sent; 2], flash: &FlashRounds) {
    eprintln!(
        "Redis commands sent per purchase, by name: sync {:?}",
        sync_sent.by_name
    );
    eprintln!(
        "                                          async {:?}",
        async_sent.by_name
    );
    eprintln!(
        "Redis commands run by scripts per purchase, by name: sync {:?}",
        sync_sent.scripts_by_name
    );
    eprintln!(
        "                                                     async {:?}",
        async_sent.scripts_by_name
    );
    eprintln!(
        "flash crowd p99 / /healthz p99 of each round: {:?}",
        flash.ratios
    );
    let shown: Vec<String> = flash
        .locks
        .iter()
        .map(|locks| locks.map_or("unknown".into(), |n| format!("{n:.0}")))
        .collect();
    eprintln!(
        "users' locks taken by each round's crowd (100 units): [{}]",
        shown.join(", ")
    );
}

/// The flash crowd's rounds, sorted by their p99 over the /healthz
/// crowd's right after them.
struct FlashRounds {
    ratios: Vec<f64>,
    /// Users' locks each round's crowd took; null where an instance's
    /// metrics could not be read.
    locks: Vec<Option<f64>>,
    median_ratio: f64,
    /// The median round's report.
    median: Report,
}

/// The crowd's tail beside the HTTP floor's, at the same concurrency:
/// each crowd's p99 over that of the /healthz crowd right after it, in
/// FLASH_ROUNDS rounds, judged by the median round. A p99 of 30,000
/// requests is their 300 slowest, and one stall of the machine moves it by
/// half.
async fn flash_rounds(target: &Target, args: &SpeedArgs) -> anyhow::Result<FlashRounds> {
    let mut rounds = Vec::with_capacity(FLASH_ROUNDS);
    for _ in 0..FLASH_ROUNDS {
        let crowd = crate::crowds::flash(
            target,
            &crate::FlashArgs {
                users: args.flash_users,
                stock: 100,
                per_user: 3,
                connections: 1_000,
                quantity: Default::default(),
                instances: 1,
            },
        )
        .await?;
        let ratio =
            crowd.tally.ms(0.99) / crowd.extra["healthz_p99_ms"].as_f64().unwrap_or(f64::NAN);
        rounds.push((ratio, crowd));
    }
    rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let ratios = rounds.iter().map(|(ratio, _)| round(*ratio)).collect();
    let locks = rounds
        .iter()
        .map(|(_, crowd)| crowd.extra["locks_taken"].as_f64())
        .collect();
    let (median_ratio, median) = rounds.swap_remove(FLASH_ROUNDS / 2);
    Ok(FlashRounds {
        ratios,
        locks,
        median_ratio: round(median_ratio),
        median,
    })
}

/// The goals, judged from the run's costs: `/healthz`'s, sync's
/// and async's; the client commands each purchase sent; the flash crowd's
/// median ratio.
fn goals(
    health_cost: &Cost,
    [sync_cost, async_cost]: [&Cost; 2],
    [sync_sent, async_sent]: [&Sent; 2],
    flash_p99_ratio: f64,
) -> Vec<Goal> {
    let healthz_service = health_cost.cpu.get("service").copied().unwrap_or(f64::NAN);
    let ratio = |cost: &Cost| round(cost.server() / healthz_service);
    vec![
        goal(
            "server CPU per sync purchase / service CPU per /healthz",
            ratio(sync_cost),
            "<= 6",
            |m| m <= 6.0,
        ),
        goal(
            "server CPU per async purchase / service CPU per /healthz",
            ratio(async_cost),
            "<= 4",
            |m| m <= 4.0,
        ),
        goal(
            "sync purchases/s, one hot voucher",
            round(sync_cost.rate),
            ">= 10000",
            |m| m >= 10_000.0,
        ),
        goal(
            "async purchases accepted/s",
            round(async_cost.rate),
            ">= 15000",
            |m| m >= 15_000.0,
        ),
        goal(
            "sync purchases/s / /healthz req/s",
            round(sync_cost.rate / health_cost.rate),
            ">= 0.15",
            |m| m >= 0.15,
        ),
        goal(
            "async purchases/s / /healthz req/s",
            round(async_cost.rate / health_cost.rate),
            ">= 0.25",
            |m| m >= 0.25,
        ),
        goal(
            "Redis client commands per sync purchase",
            round(sync_sent.per_purchase),
            "<= 2.1",
            |m| m <= 2.1,
        ),
        goal(
            "Redis client commands per async purchase",
            round(async_sent.per_purchase),
            "<= 1.15",
            |m| m <= 1.15,
        ),
        goal(
            "flash crowd p99 / /healthz p99, 1,000 connections (median of 3)",
            flash_p99_ratio,
            "<= 1.1",
            |m| m <= 1.1,
        ),
        goal(
            "PINGs per purchase (sync + async)",
            round(sync_cost.pings + async_cost.pings),
            "0",
            |m| m == 0.0,
        ),
    ]
}

/// Runs `work` (which says how many units it did) and what it cost per
/// unit: CPU by process, Redis commands executed and PINGs.
async fn measured<F, Fut>(target: &Target, work: F) -> anyhow::Result<(Tally, Cost)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(Tally, u64)>>,
{
    let stats_before = commandstats().await?;
    let cpu_before = Usage::now(target).await;
    let (tally, units) = work().await?;
    let cpu = Usage::now(target).await.micros_per(&cpu_before, units);
    let stats = commandstats().await?;
    let delta = |name: &str| {
        stats.get(name).copied().unwrap_or(0) - stats_before.get(name).copied().unwrap_or(0)
    };
    // Less the INFO calls of this measurement.
    let executed: u64 = stats
        .keys()
        .filter(|name| *name != "info")
        .map(|name| delta(name))
        .sum();
    let per = |n: u64| n as f64 / units.max(1) as f64;
    Ok((
        tally,
        Cost {
            rate: 0.0,
            cpu,
            executed: per(executed),
            pings: per(delta("ping")),
        },
    ))
}

/// Waits until `accepted` orders of `voucher` are stored. Asked of
/// Postgres directly when its URL is known: the service's stats of an
/// async sale read its whole stream, which would bill the wait to the
/// service.
async fn wait_stored(
    target: &Target,
    admin: &Admin,
    voucher: i64,
    accepted: u64,
    clock: Instant,
) -> anyhow::Result<()> {
    use sqlx::Connection;
    let Some(url) = &target.database_url else {
        let drained = drain(admin, voucher, accepted, clock, 120).await?;
        return match drained.lost {
            0 => Ok(()),
            lost => Err(anyhow::anyhow!("{lost} accepted orders not stored")),
        };
    };
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let stored: i64 =
            sqlx::query_scalar("SELECT count(*) FROM voucher_orders WHERE voucher_id = $1")
                .bind(voucher)
                .fetch_one(&mut conn)
                .await?;
        if stored >= i64::try_from(accepted).unwrap_or(i64::MAX) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "{} accepted orders not stored after 120 s",
                accepted as i64 - stored
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn goal(
    measure: &'static str,
    measured: f64,
    target: &'static str,
    met: impl Fn(f64) -> bool,
) -> Goal {
    Goal {
        measure,
        measured,
        goal: target,
        met: met(measured),
    }
}

fn print_costs(rows: &[(&str, &Cost)]) {
    let mut table = Table::new([
        "per request",
        "rate/s",
        "service µs",
        "Redis µs",
        "Postgres µs",
        "driver µs",
        "Redis commands",
        "PINGs",
    ]);
    for (name, cost) in rows {
        let us = |part: &str| {
            cost.cpu
                .get(part)
                .map_or("-".to_owned(), |v| format!("{v:.1}"))
        };
        table.row([
            (*name).to_owned(),
            format!("{:.0}", cost.rate),
            us("service"),
            us("redis"),
            us("postgres"),
            us("driver"),
            format!("{:.2}", cost.executed),
            format!("{:.2}", cost.pings),
        ]);
    }
    eprint!("{}", table.text());
    crate::table::record("speed", "CPU per request, by process", &table);
}
