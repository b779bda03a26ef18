//! `loadtest webhooks`: the order events pushed to a receiver in the
//! driver (`testkit::Receiver`, added up by `receiver`), which checks
//! every signature and can fail on cue. Per sale mode, on instances of its own:
//! - off against on: the sale's orders/s without webhooks and with a
//!   receiver acknowledging, in one run; every order's `order.created`
//!   received; the delivery lag (commit to acknowledgement), p50 and p99;
//! - the receiver down: failing from the sale's start for
//!   `--down-seconds`; the sale's rate beside the run without webhooks;
//!   then how long until the first delivery after it returns, and the
//!   backlog's drain rate from there;
//! - a kill: two instances delivering while a sale and cancels run, one
//!   killed with `kill -9` once deliveries are under way; every event
//!   delivered (duplicates counted), none out of order within its order.

mod receiver;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use crate::api::{Admin, SaleMode};
use crate::drive::{drive, Plan, Request, Tally};
use crate::service::Target;
use crate::{round, TargetArgs};
use receiver::{created, distinct, wait_for_created, Seen};
use testkit::{Answering, Receiver};

const SECRET: &str = "load-webhook-secret-8c1f5a9d3e7b2c6a0f4d";

#[derive(Args, Clone)]
pub struct WebhooksArgs {
    /// Buyers of each sale (each buys once; the stock covers them all).
    #[arg(long, default_value_t = 30_000)]
    pub users: i64,
    /// Longest a sale runs, in seconds.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Connections of the crowd.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    /// How long the receiver is down, from the start of its sale.
    #[arg(long, default_value_t = 60)]
    pub down_seconds: u64,
    /// Which sale modes to run.
    #[arg(long, value_enum, default_value_t = Modes::Both)]
    pub modes: Modes,
    /// Longest wait for every event to arrive after a phase, in seconds.
    #[arg(long, default_value_t = 120)]
    pub settle_seconds: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Modes {
    Sync,
    Async,
    Both,
}

impl Modes {
    fn list(self) -> Vec<SaleMode> {
        match self {
            Self::Sync => vec![SaleMode::Sync],
            Self::Async => vec![SaleMode::Async],
            Self::Both => vec![SaleMode::Sync, SaleMode::Async],
        }
    }
}

/// One sale's crowd: its tally and the orders it made.
struct Sale {
    tally: Tally,
    orders: u64,
    voucher: i64,
}

impl Sale {
    fn rate(&self) -> f64 {
        self.orders as f64 / self.tally.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Sells to `args.users` distinct buyers, each once, for at most
/// `args.seconds`.
async fn sale(
    target: &Target,
    mode: SaleMode,
    args: &WebhooksArgs,
    label: &str,
) -> anyhow::Result<Sale> {
    let admin = target.admin();
    let voucher = admin.create_voucher(mode, args.users, 2).await?;
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, args.users).await?;
    let tally = target
        .buy_once(
            voucher,
            &tokens,
            Duration::from_secs(args.seconds),
            args.connections,
            label,
        )
        .await;
    let orders = tally.count("200") + tally.count("202");
    Ok(Sale {
        tally,
        orders,
        voucher,
    })
}

/// The environment of instances that deliver to `url`.
fn webhook_env(url: &str) -> Vec<(String, String)> {
    vec![
        ("SECKILL_WEBHOOK_URL".into(), url.into()),
        ("SECKILL_WEBHOOK_SECRET".into(), SECRET.into()),
    ]
}

/// The voucher's books balance (`stock + pending + unpaid + paid =
/// initial`), after its async orders were all written.
async fn conserved(target: &Target, voucher: i64) -> anyhow::Result<bool> {
    let (stats, _) = target
        .admin()
        .stats_until(voucher, Duration::from_secs(60), |s| s.pending == 0)
        .await?;
    Ok(stats.conserved())
}

pub async fn run(target: &TargetArgs, args: &WebhooksArgs) -> anyhow::Result<bool> {
    target.starts_its_own("webhooks starts its own instances (with and without webhooks)")?;
    let mut rows = Vec::new();
    for mode in args.modes.list() {
        rows.push(off_and_on(target, args, mode).await?);
        rows.push(down(target, args, mode).await?);
        rows.push(kill(target, args, mode).await?);
    }
    let ok = rows.iter().all(|r| r["ok"] == true);
    println!("\nwebhooks: {} rows", rows.len());
    for row in &rows {
        println!("  {row}");
    }
    println!(
        "{}",
        json!({
            "scenario": "webhooks",
            "users": args.users,
            "seconds": args.seconds,
            "connections": args.connections,
            "down_seconds": args.down_seconds,
            "ok": ok,
            "rows": rows,
        })
    );
    Ok(ok)
}

/// The same sale without webhooks and with a receiver acknowledging.
async fn off_and_on(
    target: &TargetArgs,
    args: &WebhooksArgs,
    mode: SaleMode,
) -> anyhow::Result<Value> {
    eprintln!("webhooks: {}: off, then on", mode.name());
    let off = target
        .launch(1, Vec::new())
        .run(async |service| sale(service, mode, args, "webhooks off").await)
        .await?;

    let (receiver, url) = Receiver::start(SECRET.as_bytes(), Answering::Acknowledge).await?;
    let (on, balanced, received) = target
        .launch(1, webhook_env(&url))
        .run(async |service| {
            let on = sale(service, mode, args, "webhooks on").await?;
            let balanced = conserved(service, on.voucher).await?;
            let settle = Duration::from_secs(args.settle_seconds);
            let received = wait_for_created(&receiver, on.orders as usize, settle).await;
            Ok((on, balanced, received))
        })
        .await?;
    let seen = Seen::of(&receiver);
    let ratio = on.rate() / off.rate().max(1e-9);
    let ok = balanced && received as u64 == on.orders && seen.clean();
    Ok(json!({
        "mode": mode.name(),
        "phase": "off_vs_on",
        "orders_per_s_off": round(off.rate()),
        "orders_per_s_on": round(on.rate()),
        "ratio": round(ratio),
        "orders": on.orders,
        "created_received": received,
        "bad_signatures": seen.bad_signatures,
        "lag_ms_p50": seen.lag_ms.value_at_quantile(0.5),
        "lag_ms_p99": seen.lag_ms.value_at_quantile(0.99),
        "ok": ok,
    }))
}

/// The receiver failing from the sale's start for `--down-seconds`.
async fn down(target: &TargetArgs, args: &WebhooksArgs, mode: SaleMode) -> anyhow::Result<Value> {
    eprintln!(
        "webhooks: {}: the receiver down for {} s",
        mode.name(),
        args.down_seconds
    );
    let (receiver, url) = Receiver::start(SECRET.as_bytes(), Answering::Fail).await?;
    let (sold, balanced, backlog, back, received) = target
        .launch(1, webhook_env(&url))
        .run(async |service| {
            let began = Instant::now();
            let sold = sale(service, mode, args, "receiver down").await?;
            let balanced = conserved(service, sold.voucher).await?;
            let down_for = Duration::from_secs(args.down_seconds);
            tokio::time::sleep(down_for.saturating_sub(began.elapsed())).await;
            let backlog = sold.orders as usize - receiver.deliveries(created);
            receiver.set(Answering::Acknowledge);
            let back = Instant::now();
            let settle = Duration::from_secs(args.settle_seconds);
            let received = wait_for_created(&receiver, sold.orders as usize, settle).await;
            Ok((sold, balanced, backlog, back, received))
        })
        .await?;
    let seen = Seen::of(&receiver);
    let after: Vec<&(Instant, u64)> = seen.arrivals.iter().filter(|(at, _)| *at >= back).collect();
    let first = after.first().map(|(at, _)| at.duration_since(back));
    let drain = match (after.first(), after.last()) {
        (Some((from, _)), Some((to, _))) if to > from => {
            let events: u64 = after.iter().skip(1).map(|(_, n)| n).sum();
            events as f64 / to.duration_since(*from).as_secs_f64()
        }
        _ => 0.0,
    };
    let ok = balanced && received as u64 == sold.orders && seen.clean();
    Ok(json!({
        "mode": mode.name(),
        "phase": "receiver_down",
        "orders_per_s": round(sold.rate()),
        "orders": sold.orders,
        "backlog_at_return": backlog,
        "first_delivery_after_return_s": first.map(|d| round(d.as_secs_f64())),
        "drain_events_per_s": round(drain),
        "created_received": received,
        "ok": ok,
    }))
}

/// Two instances delivering while a sale and its cancels run; instance 0
/// killed with `kill -9` once deliveries are under way.
async fn kill(target: &TargetArgs, args: &WebhooksArgs, mode: SaleMode) -> anyhow::Result<Value> {
    eprintln!("webhooks: {}: an instance killed mid-delivery", mode.name());
    let (receiver, url) = Receiver::start(SECRET.as_bytes(), Answering::Acknowledge).await?;
    let (tally, killed, orders, events) = target
        .launch(2, webhook_env(&url))
        .run(async |service| {
            let admin = service.admin_on(1);
            let voucher = admin.create_voucher(mode, args.users, 2).await?;
            let tokens: Vec<Arc<str>> = admin.shared_tokens(1, args.users).await?;
            let plan = service.purchases(voucher, &tokens, 1);
            // Killed while deliveries are under way: once a tenth of the
            // buyers' events came, or half-way through the sale's time.
            let half = Instant::now() + Duration::from_secs(args.seconds) / 2;
            let tenth = (args.users / 10).max(1) as usize;
            let killer = async {
                while receiver.deliveries(created) < tenth && Instant::now() < half {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                service.kill(0)
            };
            let (tally, killed) = tokio::join!(
                drive(
                    &service.base,
                    Plan::Once(Duration::from_secs(args.seconds), plan),
                    args.connections,
                    "kill"
                ),
                killer
            );
            // Cancel every other order through the survivor: a second event
            // for half the orders, in order after their first.
            let orders = wait_stored(&admin, voucher, mode).await?;
            let admin_token: Arc<str> = Arc::from(service.admin_token.as_str());
            let survivor: Arc<str> = Arc::from(service.bases[1].as_str());
            let cancels: Vec<Request> = orders
                .iter()
                .step_by(2)
                .map(|id| {
                    Request::post_to(
                        survivor.clone(),
                        format!("/orders/{id}/cancel"),
                        admin_token.clone(),
                    )
                })
                .collect();
            let cancelled = drive(
                &service.bases[1],
                Plan::Fixed(cancels),
                args.connections,
                "cancels",
            )
            .await;
            let events = orders.len() + cancelled.count("200") as usize;
            let settle = Duration::from_secs(args.settle_seconds);
            let pause = Duration::from_millis(100);
            receiver
                .wait_until(settle, pause, |d| distinct(d) >= events)
                .await;
            Ok((tally, killed.is_some(), orders.len(), events))
        })
        .await?;
    let seen = Seen::of(&receiver);
    let delivered = seen.times_seen.len();
    let ok = killed && delivered == events && seen.clean();
    Ok(json!({
        "mode": mode.name(),
        "phase": "kill",
        "killed": killed,
        "answered": tally.count("200") + tally.count("202"),
        "orders_stored": orders,
        "events": events,
        "delivered": delivered,
        "duplicates": seen.duplicates(),
        "out_of_order": seen.out_of_order,
        "ok": ok,
    }))
}

/// The voucher's stored order ids, once no accepted order is pending.
async fn wait_stored(admin: &Admin, voucher: i64, mode: SaleMode) -> anyhow::Result<Vec<String>> {
    if mode == SaleMode::Async {
        let limit = Duration::from_secs(60);
        admin
            .stats_until(voucher, limit, |s| s.pending == 0)
            .await?;
    }
    Ok(admin
        .orders(voucher)
        .await?
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}
