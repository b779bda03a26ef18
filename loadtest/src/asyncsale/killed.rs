//! An instance killed with `kill -9` mid-crowd: every `202` it gave must
//! be stored once the survivor claimed its batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

use super::drain::{stored, Drain};
use super::AsyncArgs;
use crate::api::{Admin, SaleMode};
use crate::invariants::check;
use crate::scrape::metric_sum;
use crate::service::Target;
use crate::{round, Report, TargetArgs};

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
pub async fn killed(target: &TargetArgs, args: &AsyncArgs) -> anyhow::Result<Report> {
    target
        .launch(2, Vec::new())
        .run(async |service| killed_crowd(service, args).await)
        .await
}

async fn killed_crowd(target: &Target, args: &AsyncArgs) -> anyhow::Result<Report> {
    let admin = target.admin();
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
    let (tally, (pid, killed_at)) = tokio::join!(crowd, kill_mid_batch(target, clock));
    let pid = pid.context("the second instance could not be killed")?;
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
    check
        .problems
        .extend(unstored(&stored, &settled, args.drain_timeout));
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

/// Kills the second instance once its writer holds entries, `KILL_AFTER` in; its pid, and when.
async fn kill_mid_batch(target: &Target, clock: Instant) -> (Option<u32>, Duration) {
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
}

/// The check's problems of storing: 202s unstored after the wait, or by reconciliation.
fn unstored(stored: &Drain, settled: &anyhow::Result<Value>, timeout_s: u64) -> Vec<String> {
    let mut problems = Vec::new();
    if stored.lost > 0 {
        problems.push(format!(
            "{} orders answered 202 not stored {timeout_s} s after the load",
            stored.lost
        ));
    }
    match settled {
        Ok(report) if report["unstored"].as_array().is_some_and(Vec::is_empty) => {}
        Ok(report) => problems.push(format!("reconciliation lists unstored orders: {report}")),
        Err(e) => problems.push(format!("{e:#}")),
    }
    problems
}

/// Reconciles the voucher until no accepted order waits in its stream;
/// the last report.
async fn settled(admin: &Admin, voucher: i64, timeout_s: u64) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        let report = admin.reconcile(voucher).await;
        if let Ok(report) = &report {
            if report["pending"].as_u64() == Some(0) {
                return Ok(report.clone());
            }
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "accepted orders still in the stream {timeout_s} s after the load: {:?}",
                report.map_err(|e| format!("{e:#}"))
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
