//! Async (Redis-first) sales beside the sync path, in one run on one
//! service: the sync group-commit rate on a voucher that cannot sell out;
//! the async acceptance rate (`202`s) on another, with the time the stream
//! writers take to store every accepted order; `/healthz` at the same
//! concurrency; an async flash crowd over scarce stock. The goals
//! are judged from those figures, and every voucher's invariants are
//! checked once its accepted orders are stored. Then, on two instances of
//! its own, a crowd during which one instance is killed with `kill -9`:
//! every `202` it gave must be stored once the survivor claimed its batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

use crate::api::{Admin, SaleMode};
use crate::cpu::Usage;
use crate::drive::Tally;
use crate::invariants::check;
use crate::invariants::Check;
use crate::scrape::{metric_sum, metrics_text};
use crate::service::Target;
use crate::table::Table;
use crate::{round, CrowdArgs, Report, TargetArgs};

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
    /// How long the writers may take, after the load, to store every
    /// accepted order before the run says some were lost.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout: u64,
}

/// The histogram the writers record accepted -> committed into.
const CONFIRM_METRIC: &str = "seckill_async_confirm_seconds";

/// Runs the comparison; its goals go into the async row's `ratios`.
pub async fn run(target: &Target, args: &AsyncArgs) -> Result<Vec<Report>, String> {
    let admin = Admin::new(target);
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

    // Async: accepted per second, then until every accepted one is stored.
    let voucher = admin.endless_voucher(SaleMode::Async).await?;
    let confirms_before = confirm_histogram(target).await?;
    let cpu_before = Usage::now(target).await;
    let started = chrono::Utc::now().timestamp();
    let clock = Instant::now();
    let accepted_run = target
        .buy_once(voucher, &tokens, seconds, args.connections, "async")
        .await;
    let accepted = accepted_run.count("202");
    let drain = drain(&admin, voucher, accepted, clock, args.drain_timeout).await?;
    // Accepting and writing, until the last accepted order was stored.
    let cpu_per_order = Usage::now(target).await.micros_per(&cpu_before, accepted);
    let check_async = check(target, voucher, &accepted_run, started, None, 0).await?;
    let confirms = confirm_histogram(target).await?.since(&confirms_before);
    let accept_rate = accepted as f64 / accepted_run.elapsed.as_secs_f64().max(1e-9);
    let drain_rate = drain.stored as f64 / drain.until_stored.as_secs_f64().max(1e-9);

    let cpu_before = Usage::now(target).await;
    let health = target.healthz(seconds, args.connections).await;
    let cpu_per_healthz = Usage::now(target)
        .await
        .micros_per(&cpu_before, health.requests);

    let (flash_tally, flash_check, flash_drain) = flash(target, args).await?;

    let p99 = confirms.quantile_bound(0.99);
    let within_1s = confirms.share_within(1.0);
    let ratios = json!({
        "accepted_vs_healthz": round(accept_rate / health.rps()),
        "drain_vs_sync": round(drain_rate / sync_rate),
    });
    let goals = vec![
        Goal {
            measure: "async accepted/s as a share of /healthz req/s",
            measured: round(accept_rate / health.rps()),
            goal: ">= 0.7",
            met: accept_rate / health.rps() >= 0.7,
        },
        Goal {
            measure: "accepted -> confirmed, p99 (s, bucket bound)",
            measured: p99.unwrap_or(f64::NAN),
            goal: "<= 1",
            met: within_1s.is_some_and(|share| share >= 0.99),
        },
        Goal {
            measure: "writer drain rate / sync group-commit rate",
            measured: round(drain_rate / sync_rate),
            goal: ">= 1",
            met: drain_rate >= sync_rate,
        },
        Goal {
            measure: "accepted but not stored (both async vouchers)",
            measured: (drain.lost + flash_drain.lost) as f64,
            goal: "0",
            met: drain.lost + flash_drain.lost == 0,
        },
    ];
    print_goals("async", &goals);
    eprintln!("CPU µs per accepted order (accepted and written): {cpu_per_order:?}");
    eprintln!("CPU µs per /healthz request: {cpu_per_healthz:?}");
    if accepted_run.count("409 already_purchased") > 0 {
        eprintln!(
            "async: the load outran its {} users (409 already_purchased); \
             the accepted rate is a floor, raise --users",
            args.users
        );
    }

    let mut async_check = check_async;
    if drain.lost > 0 {
        async_check.problems.push(format!(
            "{} accepted orders not stored {} s after the load",
            drain.lost, args.drain_timeout
        ));
    }
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
        Report {
            scenario: "async",
            tally: accepted_run,
            check: async_check,
            ratios: Some(ratios),
            extra: json!({
                "accepted": accepted,
                "accepted_per_sec": round(accept_rate),
                "backlog_at_end": drain.backlog_at_end,
                "stored_after_load_s": round(drain.after_load.as_secs_f64()),
                "drain_per_sec": round(drain_rate),
                "sync_orders_per_sec": round(sync_rate),
                "healthz_rps": round(health.rps()),
                "confirm_p99_s_bound": p99,
                "confirmed_within_1s": within_1s.map(round),
                "confirms_counted": confirms.count,
                "cpu_us_per_order": cpu_per_order,
                "cpu_us_per_healthz": cpu_per_healthz,
                "goals": goals.iter().map(Goal::json).collect::<Vec<_>>(),
            }),
        },
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

/// A crowd three times each over scarce async stock: exactly the stock
/// is accepted and, once written, stored.
async fn flash(target: &Target, args: &AsyncArgs) -> Result<(Tally, Check, Drain), String> {
    let admin = Admin::new(target);
    let voucher = admin
        .create_voucher(SaleMode::Async, args.crowd.flash_stock, 2)
        .await?;
    let tokens: Vec<Arc<str>> = admin
        .shared_tokens(args.users + 1, args.crowd.flash_users)
        .await?;
    let mut plan = target.purchases(voucher, &tokens, 3);
    plan.shuffle(&mut rand::rng());
    let started = chrono::Utc::now().timestamp();
    let clock = Instant::now();
    let tally = target
        .send_each(plan, args.crowd.flash_connections, "async flash")
        .await;
    let accepted = tally.count("202");
    let drain = drain(&admin, voucher, accepted, clock, args.drain_timeout).await?;
    let expected = args.crowd.flash_stock.min(args.crowd.flash_users);
    let mut check = check(target, voucher, &tally, started, Some(expected), 0).await?;
    if accepted != expected as u64 {
        check
            .problems
            .push(format!("{accepted} purchases accepted of {expected} units"));
    }
    Ok((tally, check, drain))
}

/// When the second instance is killed, counted from the crowd's start.
const KILL_AFTER: Duration = Duration::from_millis(300);

/// The counter of entries a writer claimed from another consumer.
const CLAIMED_METRIC: &str = "seckill_async_claimed_total";
/// The gauge of entries an instance's writers read and have not acknowledged.
const IN_FLIGHT_METRIC: &str = "seckill_async_in_flight";

/// Two instances of our own on one async voucher (stock for half the
/// users); the second is killed with `kill -9` in the middle of a crowd,
/// its writer as good as always holding a batch read and not acknowledged.
/// Every `202` must be stored once the survivor claimed what it held.
pub async fn killed(target: &TargetArgs, args: &AsyncArgs) -> Result<Report, String> {
    let service = Target::start(target.launch(2, Vec::new())).await?;
    let result = killed_crowd(&service, args).await;
    service.stop().await;
    result
}

async fn killed_crowd(target: &Target, args: &AsyncArgs) -> Result<Report, String> {
    let admin = Admin::new(target);
    let users = args.crowd.flash_users * 2;
    let voucher = admin
        .create_voucher(SaleMode::Async, args.crowd.flash_users, 2)
        .await?;
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, users).await?;
    let mut plan = target.purchases(voucher, &tokens, 3);
    plan.shuffle(&mut rand::rng());
    let claimed_before = metric_sum(&target.bases[0], CLAIMED_METRIC).await?;
    let started = chrono::Utc::now().timestamp();
    let clock = Instant::now();
    let crowd = target.send_each(plan, args.crowd.flash_connections, "async kill -9");
    let kill = async {
        tokio::time::sleep(KILL_AFTER).await;
        // Mid-batch: once its writer holds entries it has not acknowledged.
        let watching = Instant::now();
        while watching.elapsed() < Duration::from_secs(3) {
            match metric_sum(&target.bases[1], IN_FLIGHT_METRIC).await {
                Ok(held) if held > 0.0 => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        (target.kill(1), clock.elapsed())
    };
    let (tally, (pid, killed_at)) = tokio::join!(crowd, kill);
    let pid = pid.ok_or("the second instance could not be killed")?;
    eprintln!("kill -9 of instance 2 (pid {pid}) after {killed_at:?}");
    if killed_at >= tally.elapsed {
        eprintln!(
            "async kill -9: the crowd ended before the kill; raise --flash-users \
             for a kill under load"
        );
    }
    let stored = stored(&admin, voucher, &tally.order_ids, clock, args.drain_timeout).await?;
    // A batch the dead instance committed and never acknowledged is
    // stored already, and waits in the stream until the survivor claims it
    // (after max(5 s, 3 x the dependency deadline)), finds it held and
    // acknowledges it: until then reconciliation reports it pending.
    let settled = settled(&admin, voucher, args.drain_timeout).await;
    let claimed = metric_sum(&target.bases[0], CLAIMED_METRIC).await? - claimed_before;
    let mut check = check(target, voucher, &tally, started, None, 0).await?;
    if stored.lost > 0 {
        check.problems.push(format!(
            "{} orders answered 202 not stored {} s after the load",
            stored.lost, args.drain_timeout
        ));
    }
    match &settled {
        Ok(report) if report["unstored"].as_array().is_some_and(Vec::is_empty) => {}
        Ok(report) => check
            .problems
            .push(format!("reconciliation lists unstored orders: {report}")),
        Err(e) => check.problems.push(e.clone()),
    }
    eprintln!(
        "async kill -9: {} accepted, every 202 stored {:.2} s after the load ({} lost); \
         {} entries claimed by the survivor, the stream empty {:.2} s after the load",
        tally.count("202"),
        stored.after_load.as_secs_f64(),
        stored.lost,
        claimed,
        settled.as_ref().map_or(f64::NAN, |_| clock
            .elapsed()
            .saturating_sub(tally.elapsed)
            .as_secs_f64()),
    );
    Ok(Report {
        scenario: "async-kill",
        extra: json!({
            "users": users,
            "stock": args.crowd.flash_users,
            "instances": 2,
            "killed_after_s": round(killed_at.as_secs_f64()),
            "accepted": tally.count("202"),
            "claimed_by_survivor": claimed,
            "stored_after_load_s": round(stored.after_load.as_secs_f64()),
            "reconciled": settled.ok(),
            "lost": stored.lost,
        }),
        tally,
        check,
        ratios: None,
    })
}

/// Reconciles the voucher until no accepted order waits in its stream;
/// the last report.
async fn settled(admin: &Admin<'_>, voucher: i64, timeout_s: u64) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        let report = admin.reconcile(voucher).await;
        if let Ok(report) = &report {
            if report["pending"].as_u64() == Some(0) {
                return Ok(report.clone());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "accepted orders still in the stream {timeout_s} s after the load: {report:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls the voucher's orders until every one of `answered` is stored (or
/// the timeout passes). `clock` started with the load.
async fn stored(
    admin: &Admin<'_>,
    voucher: i64,
    answered: &[String],
    clock: Instant,
    timeout_s: u64,
) -> Result<Drain, String> {
    let look = || async move {
        let orders = admin.orders(voucher).await?;
        let ids: std::collections::HashSet<&str> =
            orders.iter().map(|(id, _)| id.as_str()).collect();
        let missing = answered
            .iter()
            .filter(|id| !ids.contains(id.as_str()))
            .count();
        Ok((count(orders.len()), count(missing)))
    };
    wait_stored(clock, timeout_s, Duration::from_millis(200), look).await
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How the writers caught up with what was accepted.
pub(crate) struct Drain {
    /// Orders stored when the wait ended.
    stored: i64,
    /// Accepted orders still unstored when the load ended.
    backlog_at_end: i64,
    /// From the load's end until every accepted order was stored.
    after_load: Duration,
    /// From the load's start until every accepted order was stored.
    until_stored: Duration,
    /// Accepted orders still unstored when the wait gave up.
    pub lost: i64,
}

/// Polls the voucher's stats until `accepted` orders are stored (or the
/// timeout passes). `clock` started with the load.
pub(crate) async fn drain(
    admin: &Admin<'_>,
    voucher: i64,
    accepted: u64,
    clock: Instant,
    timeout_s: u64,
) -> Result<Drain, String> {
    let accepted = i64::try_from(accepted).unwrap_or(i64::MAX);
    let look = || async move {
        let stored = admin.stats(voucher).await?.orders;
        Ok((stored, (accepted - stored).max(0)))
    };
    wait_stored(clock, timeout_s, Duration::from_millis(20), look).await
}

/// Asks `look` for (orders stored, accepted orders not stored yet) every
/// `every` until none is missing or `timeout_s` passed. `clock` started
/// with the load, which has just ended.
async fn wait_stored<F, Fut>(
    clock: Instant,
    timeout_s: u64,
    every: Duration,
    mut look: F,
) -> Result<Drain, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(i64, i64), String>>,
{
    let load_ended = clock.elapsed();
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    let mut backlog_at_end = None;
    loop {
        let (stored, missing) = look().await?;
        backlog_at_end.get_or_insert(missing);
        if missing == 0 || Instant::now() >= deadline {
            let until_stored = clock.elapsed();
            return Ok(Drain {
                stored,
                backlog_at_end: backlog_at_end.unwrap_or(missing),
                after_load: until_stored.saturating_sub(load_ended),
                until_stored,
                lost: missing,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// A Prometheus histogram's cumulative buckets, summed over instances.
#[derive(Default)]
struct Histogram {
    /// (upper bound, cumulative count), ascending; `+Inf` last.
    buckets: Vec<(f64, f64)>,
    count: f64,
}

impl Histogram {
    /// The observations made between `earlier` and this one.
    fn since(&self, earlier: &Histogram) -> Histogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(bound, _)| *bound == le)
                .map_or(0.0, |(_, n)| *n)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n - before(*le)))
                .collect(),
            count: self.count - earlier.count,
        }
    }

    /// The smallest bucket bound below which `q` of the observations fall.
    fn quantile_bound(&self, q: f64) -> Option<f64> {
        (self.count > 0.0).then_some(())?;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= q * self.count)
            .map(|(le, _)| *le)
    }

    /// The share of observations at or below `bound` (a bucket bound).
    fn share_within(&self, bound: f64) -> Option<f64> {
        (self.count > 0.0).then_some(())?;
        self.buckets
            .iter()
            .find(|(le, _)| *le == bound)
            .map(|(_, n)| n / self.count)
    }
}

/// Reads [`CONFIRM_METRIC`] off every instance's `/metrics`.
async fn confirm_histogram(target: &Target) -> Result<Histogram, String> {
    let mut total = Histogram::default();
    for base in &target.bases {
        let one = parse_histogram(&metrics_text(base).await?, CONFIRM_METRIC);
        for (le, n) in one.buckets {
            match total.buckets.iter_mut().find(|(bound, _)| *bound == le) {
                Some((_, sum)) => *sum += n,
                None => total.buckets.push((le, n)),
            }
        }
        total.count += one.count;
    }
    total.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(total)
}

/// `name`'s buckets and count in Prometheus text (empty when absent: no
/// observation yet).
fn parse_histogram(text: &str, name: &str) -> Histogram {
    let mut histogram = Histogram::default();
    let bucket = format!("{name}_bucket{{");
    let count = format!("{name}_count");
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if let Some(labels) = series.strip_prefix(&bucket) {
            let le = labels
                .split("le=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .and_then(|le| match le {
                    "+Inf" => Some(f64::INFINITY),
                    le => le.parse::<f64>().ok(),
                });
            if let Some(le) = le {
                histogram.buckets.push((le, value));
            }
        } else if series == count || series.starts_with(&format!("{count}{{")) {
            histogram.count += value;
        }
    }
    histogram
}

/// One of the goals, measured in this run.
pub(crate) struct Goal {
    pub measure: &'static str,
    pub measured: f64,
    pub goal: &'static str,
    pub met: bool,
}

impl Goal {
    /// Whether the goal was met; `None` when its figure could not be
    /// measured in this run (NaN), which judges nothing.
    fn verdict(&self) -> Option<bool> {
        (!self.measured.is_nan()).then_some(self.met)
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "measure": self.measure,
            "measured": self.measured,
            "goal": self.goal,
            "met": self.verdict(),
        })
    }
}

/// Prints the goals judged, and records them under the guide's page `page`.
pub(crate) fn print_goals(page: &str, goals: &[Goal]) {
    let mut table = Table::new(["goal", "measured", "target", "met"]);
    for g in goals {
        table.row([
            g.measure.to_owned(),
            match g.verdict() {
                None => "not measured".to_owned(),
                Some(_) => g.measured.to_string(),
            },
            g.goal.to_owned(),
            match g.verdict() {
                None => "-",
                Some(true) => "yes",
                Some(false) => "NO",
            }
            .to_owned(),
        ]);
    }
    eprint!("{}", table.text());
    crate::table::record(page, "Goals", &table);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goal_not_measured_is_not_judged() {
        let goal = |measured: f64, met: bool| Goal {
            measure: "m",
            measured,
            goal: "<= 1",
            met,
        };
        assert_eq!(goal(f64::NAN, false).verdict(), None);
        assert_eq!(goal(f64::NAN, false).json()["met"], Value::Null);
        assert_eq!(goal(0.5, true).json()["met"], json!(true));
        assert_eq!(goal(2.0, false).json()["met"], json!(false));
    }

    const EXPOSITION: &str = "\
# TYPE seckill_async_confirm_seconds histogram
seckill_async_confirm_seconds_bucket{le=\"0.01\"} 10
seckill_async_confirm_seconds_bucket{le=\"0.1\"} 95
seckill_async_confirm_seconds_bucket{le=\"1\"} 99
seckill_async_confirm_seconds_bucket{le=\"+Inf\"} 100
seckill_async_confirm_seconds_sum 12.5
seckill_async_confirm_seconds_count 100
seckill_sale_commit_seconds_count 7
";

    #[test]
    fn a_histogram_is_read_from_prometheus_text() {
        let h = parse_histogram(EXPOSITION, CONFIRM_METRIC);
        assert_eq!(h.count, 100.0);
        assert_eq!(
            h.buckets,
            vec![
                (0.01, 10.0),
                (0.1, 95.0),
                (1.0, 99.0),
                (f64::INFINITY, 100.0)
            ]
        );
        assert_eq!(h.quantile_bound(0.5), Some(0.1));
        assert_eq!(h.quantile_bound(0.99), Some(1.0));
        assert_eq!(h.share_within(1.0), Some(0.99));
        assert!(parse_histogram("", CONFIRM_METRIC)
            .quantile_bound(0.99)
            .is_none());
    }

    #[test]
    fn only_the_observations_of_the_run_count() {
        let before = parse_histogram(EXPOSITION, CONFIRM_METRIC);
        let after = parse_histogram(
            &EXPOSITION
                .replace("} 99\n", "} 199\n")
                .replace("} 100\n", "} 200\n")
                .replace("_count 100", "_count 200"),
            CONFIRM_METRIC,
        );
        let run = after.since(&before);
        assert_eq!(run.count, 100.0);
        // The run's 100 observations all fell between 0.1 and 1 s.
        assert_eq!(run.quantile_bound(0.5), Some(1.0));
        assert_eq!(run.share_within(0.1), Some(0.0));
    }
}
