//! Async (Redis-first) sales beside the sync path, in one run on one
//! service: the sync group-commit rate on a voucher that cannot sell out;
//! the async acceptance rate (`202`s) on another, with the time the stream
//! writers take to store every accepted order; `/healthz` at the same
//! concurrency; an async flash crowd over scarce stock. The goals
//! are judged from those figures, and every voucher's invariants are
//! checked once its accepted orders are stored. Then, on two instances of
//! its own, a crowd during which one instance is killed with `kill -9`:
//! every `202` it gave must be stored once the survivor claimed its batch.

mod confirms;
mod drain;
mod goals;
mod killed;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

use crate::api::{Admin, NewSale, SaleMode};
use crate::cpu::Usage;
use crate::drive::Tally;
use crate::invariants::{check, Check};
use crate::service::Target;
use crate::{round, units, CrowdArgs, Report};
use confirms::{confirm_histogram, Histogram};
pub(crate) use drain::{drain, Drain};
pub(crate) use goals::{print_goals, Goal};
pub use killed::killed;

#[derive(Args, Clone)]
pub struct AsyncArgs {
    /// Seconds of each timed run (sync, async, /healthz).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Distinct users of the timed runs (a user buys once per voucher:
    /// when the load outruns them, the rest are `409 already_purchased`).
    #[arg(long, default_value_t = 200_000)]
    pub users: i64,
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    #[command(flatten)]
    pub crowd: CrowdArgs,
    /// Instances of the service this driver starts for the runs before
    /// the kill (with `--url`, the one given); requests are dealt to them
    /// in turn. The kill takes two instances of its own.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// How long the writers may take, after the load, to store every
    /// accepted order before the run says some were lost.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout: u64,
}

/// The histogram the writers record accepted -> committed into.
const CONFIRM_METRIC: &str = "seckill_async_confirm_seconds";

/// Runs the comparison; its goals go into the async row's `ratios`.
pub async fn run(target: &Target, args: &AsyncArgs) -> anyhow::Result<Vec<Report>> {
    let admin = target.admin();
    let seconds = Duration::from_secs(args.seconds);
    eprintln!("async: minting {} tokens", args.users);
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, args.users).await?;

    // The sync path's group-commit rate, on the same machine and users.
    let voucher = admin.endless_voucher(SaleMode::Sync).await?;
    let started = chrono::Utc::now().timestamp();
    let sync = target
        .buy_once(voucher, &tokens, seconds, args.connections, "sync")
        .await;
    let sync_check = check(target, voucher, &sync, started, None, 0).await?;
    let sync_rate = sync_check.orders as f64 / sync.elapsed.as_secs_f64().max(1e-9);

    let run = Accepted::run(target, &admin, &tokens, args).await?;

    let cpu_before = Usage::now(target).await;
    let health = target.healthz(seconds, args.connections).await;
    let cpu_per_healthz = Usage::now(target)
        .await
        .micros_per(&cpu_before, health.requests);

    let (flash_tally, flash_check, flash_drain) = flash(target, args).await?;

    let goals = run.goals(health.rps(), sync_rate, flash_drain.lost);
    print_goals("async", &goals);
    eprintln!(
        "CPU µs per accepted order (accepted and written): {:?}",
        run.cpu_per_order
    );
    eprintln!("CPU µs per /healthz request: {cpu_per_healthz:?}");
    if run.tally.count("409 already_purchased") > 0 {
        eprintln!(
            "async: the load outran its {} users (409 already_purchased); \
             the accepted rate is a floor, raise --users",
            args.users
        );
    }
    let extra = run.extra(health.rps(), sync_rate, &cpu_per_healthz, &goals);
    Ok(vec![
        Report {
            scenario: "sync",
            tally: sync,
            check: sync_check,
            ratios: None,
            extra: json!({
                "orders_per_sec": round(sync_rate),
                "connections": args.connections,
            }),
        },
        run.report(args, health.rps(), sync_rate, extra),
        Report {
            scenario: "async-flash",
            tally: flash_tally,
            check: flash_check,
            ratios: None,
            extra: json!({
                "users": args.crowd.flash_users,
                "stock": args.crowd.flash_stock,
                "stored_after_load_s": round(flash_drain.after_load.as_secs_f64()),
            }),
        },
    ])
}

/// The async run: accepted per second, then until every accepted order
/// is stored.
struct Accepted {
    tally: Tally,
    accepted: u64,
    drain: Drain,
    check: Check,
    /// Accepting and writing, until the last accepted order was stored.
    cpu_per_order: std::collections::BTreeMap<&'static str, f64>,
    confirms: Histogram,
    accept_rate: f64,
    drain_rate: f64,
}

impl Accepted {
    async fn run(
        target: &Target,
        admin: &Admin,
        tokens: &[Arc<str>],
        args: &AsyncArgs,
    ) -> anyhow::Result<Self> {
        let voucher = admin.endless_voucher(SaleMode::Async).await?;
        let confirms_before = confirm_histogram(target).await?;
        let cpu_before = Usage::now(target).await;
        let started = chrono::Utc::now().timestamp();
        let clock = Instant::now();
        let seconds = Duration::from_secs(args.seconds);
        let tally = target
            .buy_once(voucher, tokens, seconds, args.connections, "async")
            .await;
        let accepted = tally.count("202");
        let drain = drain(admin, voucher, accepted, clock, args.drain_timeout).await?;
        let cpu_per_order = Usage::now(target).await.micros_per(&cpu_before, accepted);
        let check = check(target, voucher, &tally, started, None, 0).await?;
        let confirms = confirm_histogram(target).await?.since(&confirms_before);
        let accept_rate = accepted as f64 / tally.elapsed.as_secs_f64().max(1e-9);
        let drain_rate = drain.stored as f64 / drain.until_stored.as_secs_f64().max(1e-9);
        Ok(Self {
            tally,
            accepted,
            drain,
            check,
            cpu_per_order,
            confirms,
            accept_rate,
            drain_rate,
        })
    }

    /// The goals, judged against `/healthz`'s rate and the sync
    /// path's; `flash_lost`: the flash crowd's accepted orders not stored.
    fn goals(&self, healthz_rps: f64, sync_rate: f64, flash_lost: i64) -> Vec<Goal> {
        let lost = self.drain.lost + flash_lost;
        vec![
            Goal {
                measure: "async accepted/s as a share of /healthz req/s",
                measured: round(self.accept_rate / healthz_rps),
                goal: ">= 0.7",
                met: self.accept_rate / healthz_rps >= 0.7,
            },
            Goal {
                measure: "accepted -> confirmed, p99 (s, bucket bound)",
                measured: self.confirms.quantile_bound(0.99).unwrap_or(f64::NAN),
                goal: "<= 1",
                met: self
                    .confirms
                    .share_within(1.0)
                    .is_some_and(|share| share >= 0.99),
            },
            Goal {
                measure: "writer drain rate / sync group-commit rate",
                measured: round(self.drain_rate / sync_rate),
                goal: ">= 1",
                met: self.drain_rate >= sync_rate,
            },
            Goal {
                measure: "accepted but not stored (both async vouchers)",
                measured: lost as f64,
                goal: "0",
                met: lost == 0,
            },
        ]
    }

    /// The async row's own figures.
    fn extra(
        &self,
        healthz_rps: f64,
        sync_rate: f64,
        cpu_per_healthz: &std::collections::BTreeMap<&'static str, f64>,
        goals: &[Goal],
    ) -> Value {
        json!({
            "accepted": self.accepted,
            "accepted_per_sec": round(self.accept_rate),
            "backlog_at_end": self.drain.backlog_at_end,
            "stored_after_load_s": round(self.drain.after_load.as_secs_f64()),
            "drain_per_sec": round(self.drain_rate),
            "sync_orders_per_sec": round(sync_rate),
            "healthz_rps": round(healthz_rps),
            "confirm_p99_s_bound": self.confirms.quantile_bound(0.99),
            "confirmed_within_1s": self.confirms.share_within(1.0).map(round),
            "confirms_counted": self.confirms.count,
            "cpu_us_per_order": self.cpu_per_order,
            "cpu_us_per_healthz": cpu_per_healthz,
            "goals": goals.iter().map(Goal::json).collect::<Vec<_>>(),
        })
    }

    /// The async row, with the accepted orders not stored as a problem.
    fn report(self, args: &AsyncArgs, healthz_rps: f64, sync_rate: f64, extra: Value) -> Report {
        let mut check = self.check;
        if self.drain.lost > 0 {
            check.problems.push(format!(
                "{} accepted orders not stored {} s after the load",
                self.drain.lost, args.drain_timeout
            ));
        }
        Report {
            scenario: "async",
            tally: self.tally,
            check,
            ratios: Some(json!({
                "accepted_vs_healthz": round(self.accept_rate / healthz_rps),
                "drain_vs_sync": round(self.drain_rate / sync_rate),
            })),
            extra,
        }
    }
}

/// A crowd three times each over scarce async stock: exactly the stock
/// is accepted and, once written, stored.
async fn flash(target: &Target, args: &AsyncArgs) -> anyhow::Result<(Tally, Check, Drain)> {
    let admin = target.admin();
    let quantities = args.crowd.quantity;
    let stock = args.crowd.flash_stock;
    let sale = NewSale::free(SaleMode::Async, stock, 2).allowing(quantities.high());
    let voucher = admin.create_sale(sale).await?;
    let first = args.users + 1;
    let tokens: Vec<Arc<str>> = admin.shared_tokens(first, args.crowd.flash_users).await?;
    let mut plan = quantities.purchases(target, voucher, &tokens, first, 3);
    plan.shuffle(&mut rand::rng());
    let started = chrono::Utc::now().timestamp();
    let clock = Instant::now();
    let tally = target
        .send_each(plan, args.crowd.flash_connections, "async flash")
        .await;
    let accepted = tally.count("202");
    let drain = drain(&admin, voucher, accepted, clock, args.drain_timeout).await?;
    let users = first..first + args.crowd.flash_users;
    if quantities.ones() {
        let expected = stock.min(args.crowd.flash_users);
        let mut check = check(target, voucher, &tally, started, Some(expected), 0).await?;
        if accepted != expected as u64 {
            check
                .problems
                .push(format!("{accepted} purchases accepted of {expected} units"));
        }
        return Ok((tally, check, drain));
    }
    let mut check = check(target, voucher, &tally, started, None, 0).await?;
    check
        .problems
        .extend(units::check(&admin, voucher, quantities, users, stock).await?);
    Ok((tally, check, drain))
}
