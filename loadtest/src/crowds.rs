//! The basic scenarios: a flash crowd for scarce stock, one user
//! hammering one voucher, distinct users against stock that cannot run
//! out (throughput, beside the ceilings of Postgres and Redis), and a
//! sold-out voucher flooded beside `/healthz`.

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use serde_json::{json, Value};

use crate::api::{NewSale, SaleMode};
use crate::drive::{drive, Plan, Request};
use crate::invariants::check;
use crate::service::Target;
use crate::{ceilings, round, scrape, units, FlashArgs, HammerArgs, Report, TimedArgs};

pub(crate) async fn flash(target: &Target, args: &FlashArgs) -> anyhow::Result<Report> {
    let admin = target.admin();
    let quantities = args.quantity;
    let sale = NewSale::free(SaleMode::Sync, args.stock, 2).allowing(quantities.high());
    let voucher = admin.create_sale(sale).await?;
    eprintln!("flash: minting {} tokens", args.users);
    let tokens: Vec<Arc<str>> = admin.shared_tokens(1, args.users).await?;
    let mut plan = quantities.purchases(target, voucher, &tokens, 1, args.per_user);
    plan.shuffle(&mut rand::rng());
    let started = chrono::Utc::now().timestamp();
    let before = sale_steps(target).await;
    let tally = target.send_each(plan, args.connections, "flash").await;
    // Counted only when both readings were had: a missed first reading
    // would bill the instances' whole past to this crowd.
    let steps = match (before, sale_steps(target).await) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    // With one unit each the orders are exactly the stock (or the users);
    // with more, the units are judged instead.
    let expected = quantities.ones().then(|| args.stock.min(args.users));
    let mut check = check(target, voucher, &tally, started, expected, 0).await?;
    let judged = units::check(&admin, voucher, quantities, 1..args.users + 1, args.stock);
    check.problems.extend(judged.await?);
    // The HTTP ceiling at the same concurrency and request count.
    let health_plan = vec![Request::get("/healthz"); usize::try_from(tally.requests).unwrap_or(0)];
    let health = target
        .send_each(health_plan, args.connections, "healthz")
        .await;
    Ok(Report {
        scenario: "flash",
        tally,
        check,
        ratios: None,
        extra: json!({
            "users": args.users,
            "stock": args.stock,
            "per_user": args.per_user,
            "quantity": format!("{}", quantities),
            "connections": args.connections,
            "instances": target.bases.len(),
            "healthz_rps": round(health.rps()),
            "healthz_p99_ms": round(health.ms(0.99)),
            "locks_taken": steps.map(|s| s.locks),
            "gate_waits": steps.map(|s| s.gate_waits),
        }),
    })
}

/// How far the purchases of a crowd went inside the service, counted by
/// its metrics over every instance: a crowd for 100 units needs about 100
/// locks, and every lock more is a purchase that went on to be told "sold
/// out" by a batch instead of by the flag or the gate.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct SaleSteps {
    /// Users' locks taken (`seckill_lock_acquire_seconds`).
    pub locks: f64,
    /// Purchases that waited at the gate (`seckill_gate_waits_total`).
    pub gate_waits: f64,
    /// Sale statements committed (`seckill_sale_batch_size`).
    pub batches: f64,
    /// Sale statements run again (`seckill_sale_batch_reruns_total`).
    pub reruns: f64,
}

impl std::ops::Sub for SaleSteps {
    type Output = Self;
    fn sub(self, earlier: Self) -> Self {
        Self {
            locks: self.locks - earlier.locks,
            gate_waits: self.gate_waits - earlier.gate_waits,
            batches: self.batches - earlier.batches,
            reruns: self.reruns - earlier.reruns,
        }
    }
}

/// The sale steps counted so far, or `None` when an instance's metrics
/// cannot be read (the crowd is judged without them).
pub(crate) async fn sale_steps(target: &Target) -> Option<SaleSteps> {
    let mut steps = SaleSteps::default();
    for base in &target.bases {
        let text = scrape::metrics_text(base).await.ok()?;
        steps.locks += scrape::sum_of(&text, "seckill_lock_acquire_seconds_count");
        steps.gate_waits += scrape::sum_of(&text, "seckill_gate_waits_total");
        steps.batches += scrape::sum_of(&text, "seckill_sale_batch_size_count");
        steps.reruns += scrape::sum_of(&text, "seckill_sale_batch_reruns_total");
    }
    Some(steps)
}

pub(crate) async fn hammer(target: &Target, args: &HammerArgs) -> anyhow::Result<Report> {
    let admin = target.admin();
    let voucher = admin.create_voucher(SaleMode::Sync, 10, 2).await?;
    let token: Arc<str> = admin.tokens(1, 1).await?.remove(0).into();
    let plan = vec![Request::purchase(voucher, token); args.requests];
    let started = chrono::Utc::now().timestamp();
    let tally = target.send_each(plan, args.connections, "hammer").await;
    let check = check(target, voucher, &tally, started, Some(1), 0).await?;
    Ok(Report {
        scenario: "hammer",
        tally,
        check,
        ratios: None,
        extra: json!({ "requests": args.requests, "connections": args.connections }),
    })
}

pub(crate) async fn throughput(
    target: &Target,
    args: &TimedArgs,
    pgbench_seconds: u64,
) -> anyhow::Result<Report> {
    let admin = target.admin();
    let seconds = args.seconds.unwrap_or(20);
    let voucher = admin.endless_voucher(SaleMode::Sync).await?;
    eprintln!("throughput: minting {} tokens", args.users);
    let tokens = admin.shared_tokens(1, args.users).await?;
    let started = chrono::Utc::now().timestamp();
    // Each user once: a user who comes back is a repeat buyer (409), not a
    // sale, and would cap the rate at users / seconds.
    let limit = Duration::from_secs(seconds);
    let tally = target
        .buy_once(voucher, &tokens, limit, args.connections, "throughput")
        .await;
    let check = check(target, voucher, &tally, started, None, 0).await?;
    let orders_per_sec = check.orders as f64 / tally.elapsed.as_secs_f64();

    let mut extra = json!({
        "orders_per_sec": round(orders_per_sec),
        "seconds": seconds,
        "connections": args.connections,
        "users_ran_out": tally.exhausted,
    });
    let mut ratios = serde_json::Map::new();
    match &target.database_url {
        Some(url) => match ceilings::postgres(url, pgbench_seconds).await {
            Ok(pg) => {
                extra["pgbench_tps"] = json!(round(pg.single.tps));
                extra["pgbench_clients"] = json!(pg.single.clients);
                extra["pgbench_batch_orders_per_sec"] = json!(round(pg.batch.tps));
                extra["pgbench_batch_clients"] = json!(pg.batch.clients);
                extra["pgbench_batch_size"] = json!(ceilings::CEILING_BATCH);
                extra["pgbench_naive_tps"] = json!(round(pg.naive.tps));
                extra["pgbench_naive_clients"] = json!(pg.naive.clients);
                ratios.insert(
                    "orders_vs_pgbench".into(),
                    json!(round(orders_per_sec / pg.single.tps)),
                );
                ratios.insert(
                    "orders_vs_pgbench_batch".into(),
                    json!(round(orders_per_sec / pg.batch.tps)),
                );
                ratios.insert(
                    "orders_vs_pgbench_naive".into(),
                    json!(round(orders_per_sec / pg.naive.tps)),
                );
            }
            Err(e) => eprintln!("throughput: no Postgres ceiling: {e:#}"),
        },
        None => eprintln!("throughput: no Postgres ceiling without --database-url"),
    }
    let redis_url = testkit::redis_url();
    let prefix = format!("loadtest:{}:", uuid::Uuid::new_v4().simple());
    match ceilings::redis(&redis_url, &prefix, 50, 200_000).await {
        Ok(rate) => {
            extra["redis_lock_acquire_per_sec"] = json!(round(rate));
            ratios.insert(
                "orders_vs_redis_acquire".into(),
                json!(round(orders_per_sec / rate)),
            );
        }
        Err(e) => eprintln!("throughput: no Redis ceiling: {e:#}"),
    }
    Ok(Report {
        scenario: "throughput",
        tally,
        check,
        ratios: (!ratios.is_empty()).then_some(Value::Object(ratios)),
        extra,
    })
}

pub(crate) async fn soldout(target: &Target, args: &TimedArgs) -> anyhow::Result<Report> {
    let admin = target.admin();
    let seconds = args.seconds.unwrap_or(10);
    let voucher = admin.create_voucher(SaleMode::Sync, 1, 2).await?;
    let buyer = admin.tokens(args.users + 1, 1).await?.remove(0);
    admin.buy_out(voucher, &buyer).await?;
    let users = args.users.min(10_000);
    let plan: Vec<Request> = admin
        .tokens(1, users)
        .await?
        .into_iter()
        .map(|t| Request::purchase(voucher, t.into()))
        .collect();
    let started = chrono::Utc::now().timestamp();
    let load = Duration::from_secs(seconds);
    let tally = drive(
        &target.base,
        Plan::Timed(load, plan),
        args.connections,
        "soldout",
    )
    .await;
    let check = check(target, voucher, &tally, started, Some(1), 1).await?;
    let health = target.healthz(load, args.connections).await;
    let rejections = tally.count("409 sold_out") as f64 / tally.elapsed.as_secs_f64();
    Ok(Report {
        scenario: "soldout",
        ratios: Some(json!({ "rejections_vs_healthz": round(rejections / health.rps()) })),
        extra: json!({
            "rejections_per_sec": round(rejections),
            "healthz_rps": round(health.rps()),
            "seconds": seconds,
            "connections": args.connections,
        }),
        tally,
        check,
    })
}
