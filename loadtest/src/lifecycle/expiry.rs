//! Expiry: how late unpaid orders expire while a sale goes on, and a
//! whole sale's orders expiring at one instant beside another voucher's
//! purchases.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::api::SaleMode;
use crate::drive::{answers_where, drive, Plan, Tally};
use crate::{round, round3};

use super::{books, paced, priced_sale, sampled, wait_for, Caller, Part, Stage};

/// 'lateness': selling at full speed on both instances with a one-second
/// payment window, so orders expire all through the sale (their users buy
/// again): how late after `pay_by` each expiry was, from the rows.
pub(super) async fn lateness(stage: &Stage<'_>) -> anyhow::Result<Part> {
    let (target, admin, args) = (stage.target, &stage.admin, stage.args);
    let mut part = Part::new("lateness");
    let voucher = admin
        .create_sale(priced_sale(SaleMode::Sync, i64::from(i32::MAX), 1, 1))
        .await?;
    let users = i64::try_from(args.seconds).unwrap_or(1) * 2_000;
    let tokens = admin.shared_tokens(stage.first_user, users).await?;
    let plan = target.purchases(voucher, &tokens, 1);
    let work = drive(
        &target.base,
        Plan::Timed(Duration::from_secs(args.seconds), plan),
        args.connections,
        "sell, expire",
    );
    let tally = sampled(&mut part, target, &[voucher], work).await;
    let load_end = Utc::now();
    let end = wait_for(
        admin,
        voucher,
        Duration::from_secs(30),
        "every order expired",
        |s| s.unpaid == 0,
    )
    .await?;
    report_sale(&mut part, &tally);
    part.fact("expired", end.expired);
    let url = target
        .database_url
        .as_deref()
        .context("lateness needs the service's database")?;
    let late = lateness_ms(url, voucher, load_end).await?;
    part.fact("expired_during_load", late.count);
    part.fact("late_ms_p50", late.p50);
    part.fact("late_ms_p99", late.p99);
    part.fact("late_ms_max", late.max);
    if late.p99 > 1000.0 {
        part.problems
            .push(format!("expiry lateness p99 {} ms > 1 s", late.p99));
    }
    if !end.conserved() {
        part.problems.push(format!("at the end: {end:?}"));
    }
    Ok(part)
}

fn report_sale(part: &mut Part, tally: &Tally) {
    part.fact("purchases", tally.requests);
    part.fact("purchase_statuses", json!(tally.statuses));
    part.fact("purchases_per_sec", (tally.rps() * 10.0).round() / 10.0);
    part.fact("purchase_p99_ms", (tally.ms(0.99) * 100.0).round() / 100.0);
    report_errors(part, tally);
}

/// A problem when any purchase of `tally` failed (5xx or transport).
fn report_errors(part: &mut Part, tally: &Tally) {
    let errors = answers_where(&tally.statuses, |k| {
        k.starts_with('5') || k.starts_with("error")
    });
    if errors > 0 {
        part.problems
            .push(format!("{errors} purchases failed (5xx or transport)"));
    }
}

struct Lateness {
    count: i64,
    p50: f64,
    p99: f64,
    max: f64,
}

/// How late the voucher's expiries were (closed_at - pay_by, ms), for the
/// orders due by `due_by`.
async fn lateness_ms(url: &str, voucher: i64, due_by: DateTime<Utc>) -> anyhow::Result<Lateness> {
    let mut conn = PgConnection::connect(url).await?;
    let (count, p50, p99, max): (i64, Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        "WITH l AS (SELECT extract(epoch FROM closed_at - pay_by)::float8 * 1000 AS ms
                    FROM voucher_orders WHERE voucher_id = $1 AND status = 'expired' AND pay_by <= $2)
         SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms) FROM l",
    )
    .bind(voucher)
    .bind(due_by)
    .fetch_one(&mut conn)
    .await?;
    let round = |x: Option<f64>| (x.unwrap_or(0.0) * 10.0).round() / 10.0;
    Ok(Lateness {
        count,
        p50: round(p50),
        p99: round(p99),
        max: round(max),
    })
}

/// 'mass-expiry': `args.expiring` unpaid orders of one sale, their deadlines
/// moved to one instant (as if every buyer had bought in the same second),
/// expire while another voucher sells at full speed; its p99 beside a run
/// of the same load just before.
pub(super) async fn mass_expiry(stage: &Stage<'_>) -> anyhow::Result<Part> {
    let (target, admin, args) = (stage.target, &stage.admin, stage.args);
    let mut part = Part::new("mass-expiry");
    let caller = Caller::new(target, "", 16, 1);
    let url = target
        .database_url
        .as_deref()
        .context("mass-expiry needs the service's database")?;
    let new_sale = |stock| priced_sale(SaleMode::Sync, stock, 1, 86_400);
    let expiring = admin.create_sale(new_sale(args.expiring)).await?;
    let other = admin.create_sale(new_sale(i64::from(i32::MAX))).await?;
    eprintln!("mass-expiry: minting {} tokens", args.expiring);
    let buyers = admin.shared_tokens(stage.first_user, args.expiring).await?;
    let plan = target.purchases(expiring, &buyers, 1);
    let bought = target.send_each(plan, args.connections, "buy").await;
    if bought.count("200") != u64::try_from(args.expiring).unwrap_or(0) {
        anyhow::bail!("buying the expiring sale: {:?}", bought.statuses);
    }
    // The other voucher sells at a steady rate (an open load: latency is
    // not hidden by fewer requests sent), alone and then beside the expiry.
    let crowd = i64::try_from(args.seconds).unwrap_or(1) * i64::from(args.beside_rate);
    let before = admin
        .shared_tokens(stage.first_user + args.expiring, crowd)
        .await?;
    let during = admin
        .shared_tokens(stage.first_user + args.expiring + crowd, crowd)
        .await?;
    let baseline = paced(&caller, other, &before, args.beside_rate).await;
    let mut conn = PgConnection::connect(url).await?;
    let (due, moved) = move_deadlines(&mut conn, expiring).await?;
    part.fact("deadlines_moved", moved);
    let due_at = Instant::now() + (due - Utc::now()).to_std().unwrap_or_default();
    let watch = async {
        loop {
            if let Ok(s) = admin.stats(expiring).await {
                if s.unpaid == 0 {
                    return Instant::now();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let work = async { tokio::join!(paced(&caller, other, &during, args.beside_rate), watch) };
    let (beside, all_back) = sampled(&mut part, target, &[expiring, other], work).await;
    let end = admin.stats(expiring).await?;
    let seconds = all_back.saturating_duration_since(due_at).as_secs_f64();
    let rows_seconds = expired_after(&mut conn, expiring, due).await?;
    let rate = args.expiring as f64 / rows_seconds.max(0.001);
    part.fact("expiring", args.expiring);
    part.fact("expired", end.expired);
    part.fact("all_expired_after_deadline_s", round3(rows_seconds));
    part.fact("seen_all_back_after_deadline_s", round3(seconds));
    part.fact("expirations_per_sec", rate.round());
    let late = lateness_ms(url, expiring, Utc::now()).await?;
    part.fact("late_ms_p99", late.p99);
    compare_p99(&mut part, &baseline, &beside, due_at, all_back);
    part.fact("other_voucher_purchases_per_sec", args.beside_rate);
    report_errors(&mut part, &baseline);
    report_errors(&mut part, &beside);
    if end.expired != args.expiring || end.stock != args.expiring || !end.conserved() {
        part.problems
            .push(format!("not every unit came back: {end:?}"));
    }
    if let Some(url) = &target.database_url {
        part.problems.extend(books(url, expiring).await?);
    }
    Ok(part)
}

/// Moves every unpaid order's deadline of `voucher` to one second from
/// now: that instant, and how many moved.
async fn move_deadlines(
    conn: &mut PgConnection,
    voucher: i64,
) -> anyhow::Result<(DateTime<Utc>, i64)> {
    sqlx::query_as(
        "WITH due AS (SELECT now() + interval '1 second' AS at),
              moved AS (UPDATE voucher_orders SET pay_by = (SELECT at FROM due)
                        WHERE voucher_id = $1 AND status = 'unpaid' RETURNING 1)
         SELECT (SELECT at FROM due), (SELECT count(*) FROM moved)",
    )
    .bind(voucher)
    .fetch_one(conn)
    .await
    .context("moving the deadlines")
}

/// Seconds from `due` to the last expiry of `voucher`'s orders, from the
/// rows (NaN when none expired).
async fn expired_after(
    conn: &mut PgConnection,
    voucher: i64,
    due: DateTime<Utc>,
) -> anyhow::Result<f64> {
    let (first, last): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT min(closed_at), max(closed_at) FROM voucher_orders WHERE voucher_id = $1 AND status = 'expired'",
    )
    .bind(voucher)
    .fetch_one(conn)
    .await?;
    Ok(match (first, last) {
        (Some(_), Some(last)) => (last - due).num_milliseconds() as f64 / 1000.0,
        _ => f64::NAN,
    })
}

/// The concurrent voucher's p99 while the expiry ran (from `due_at` to
/// `all_back`), against the same load alone.
fn compare_p99(
    part: &mut Part,
    baseline: &Tally,
    beside: &Tally,
    due_at: Instant,
    all_back: Instant,
) {
    let window = |t: &Tally| {
        let from = due_at.saturating_duration_since(t.origin).as_millis();
        let to = all_back.saturating_duration_since(t.origin).as_millis();
        let mut h = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("a histogram");
        for s in t
            .samples
            .iter()
            .filter(|s| (from..=to.max(from + 1000)).contains(&u128::from(s.at_ms)))
        {
            h.saturating_record(u64::from(s.micros));
        }
        h
    };
    let during_expiry = window(beside);
    let p99_alone = baseline.ms(0.99);
    let p99_beside = during_expiry.value_at_quantile(0.99) as f64 / 1000.0;
    part.fact("other_voucher_p99_ms_alone", round(p99_alone));
    part.fact("other_voucher_p99_ms_during_expiry", round(p99_beside));
    part.fact("other_voucher_p99_ratio", round(p99_beside / p99_alone));
}
