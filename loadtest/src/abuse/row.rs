//! One row: a voucher of its own, the honest crowd with one attacker
//! beside it, and what the row's answers mean for its invariants.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flood::{flood_until, FloodProcess};
use super::slow::{slow_bodies, slow_watch, Slow};
use super::{AbuseArgs, Attack, People, Placement, ATTACKER};
use crate::api::{Admin, SaleMode};
use crate::cpu::Usage;
use crate::drive::{answers_where, drive, Plan, Request, Tally};
use crate::invariants::{check, Check};
use crate::scrape;
use crate::service::Target;

/// One row: the honest crowd beside one attacker.
pub(super) struct Row {
    pub attack: Attack,
    /// The honest crowd alone, run again after the attacks.
    pub again: bool,
    pub honest: Tally,
    /// The honest buyers' purchases (200) per second.
    pub rate: f64,
    /// The floods' answers.
    pub attacker: Option<Tally>,
    pub slow: Option<Slow>,
    pub check: Check,
    /// Answers other than 429 that the attacker's limit lets it have in
    /// the attack's time, over every instance; `None` with no limit.
    pub allowance: Option<f64>,
    /// Percent of one core each part used during the row: on one machine
    /// the attacker's driver competes with the service for the same cores,
    /// and this tells how much of an honest slowdown that explains.
    pub cpu: BTreeMap<&'static str, f64>,
    /// The queueing delay the first instance's shedder saw during the row
    /// (`seckill_shed_delay_seconds`, read every 250 ms), in ms: mean and
    /// highest.
    pub delay_ms: (f64, f64),
    /// The honest crowd's rate and p99 (ms) this row is judged against,
    /// when not the crowd alone's straight at the instance (a row through
    /// the front is judged against the crowd alone through it).
    pub baseline: Option<(f64, f64)>,
    /// Through the front: `GET /vouchers/{id}` requests that reached the
    /// instances, per voucher read and second.
    pub origin_reads: Option<f64>,
}

impl Row {
    pub(super) fn honest_5xx(&self) -> u64 {
        answers_where(&self.honest.statuses, |k| k.starts_with('5'))
    }

    pub(super) fn name(&self) -> &'static str {
        if self.again {
            "nobody (alone), again"
        } else {
            self.attack.name()
        }
    }
}

/// The honest crowd alone: the mean of its run before the attacks and the
/// one after them, so that the machine's drift during the run (or a cold
/// start) is not billed to the attackers.
pub(super) struct Alone {
    pub rate: f64,
    pub p99_ms: f64,
}

impl Alone {
    /// The rate `row` is judged against.
    pub(super) fn rate_for(&self, row: &Row) -> f64 {
        row.baseline.map_or(self.rate, |(rate, _)| rate)
    }

    /// The p99 (ms) `row` is judged against.
    pub(super) fn p99_for(&self, row: &Row) -> f64 {
        row.baseline.map_or(self.p99_ms, |(_, p99)| p99)
    }

    pub(super) fn of(rows: &[Row]) -> Self {
        let alone: Vec<&Row> = rows.iter().filter(|r| r.attack == Attack::Nobody).collect();
        let n = alone.len().max(1) as f64;
        Self {
            rate: alone.iter().map(|r| r.rate).sum::<f64>() / n,
            p99_ms: alone.iter().map(|r| r.honest.ms(0.99)).sum::<f64>() / n,
        }
    }
}

/// A row through the front: the front, and where its processes run.
#[derive(Clone, Copy)]
pub(super) struct Through<'a> {
    pub front: &'a testkit::Front,
    pub placement: Option<&'a Placement>,
}

/// One row: a voucher of its own, the honest crowd for `--seconds` with
/// `attack` beside it, then the voucher's invariants.
pub(super) async fn run_row(
    service: &Target,
    admin: &Admin,
    args: &AbuseArgs,
    people: &People<'_>,
    attack: Attack,
    again: bool,
    through: Option<Through<'_>>,
) -> anyhow::Result<Row> {
    let front = through.map(|t| t.front);
    let pinned = through.and_then(|t| t.placement);
    let voucher = admin.endless_voucher(SaleMode::Sync).await?;
    let via = front.map(testkit::Front::base);
    let base = via.clone().unwrap_or_else(|| service.base.clone());
    let origin_before = origin_reads(service).await;
    let honest_plan: Vec<Request> = service
        .purchases(voucher, people.honest, 1)
        .into_iter()
        .zip(people.addresses)
        .map(|(request, address)| {
            let mut request = request.with_address(address.clone());
            // Through the front, every purchase goes to it, not to the
            // instance the plan would pick.
            if via.is_some() {
                request.base = None;
            }
            request
        })
        .collect();
    let other = match attack {
        Attack::BotnetAccounts => Some(admin.endless_voucher(SaleMode::Sync).await?),
        _ => None,
    };
    let mut flood = flood_plan(attack, voucher, other.unwrap_or(voucher), people);
    // Through the front, the botnet floods from a process of its own (on
    // the front's cores when placed), its connections open before the
    // crowd's clock starts.
    let flood_process = match (front, flood.take_if(|_| front.is_some())) {
        (Some(front), Some(_)) => Some(
            FloodProcess::start(
                &front.base(),
                &format!("/vouchers/{voucher}"),
                args.botnet_addresses,
                args.attack_connections,
                pinned.map(|p| p.front.as_str()),
            )
            .await?,
        ),
        _ => None,
    };
    let flood_pid = flood_process.as_ref().and_then(FloodProcess::pid);
    let reading = || async move {
        let mut usage = Usage::now(service).await;
        if let Some(front) = front {
            usage = usage.with_process("front", front.pid());
        }
        if let Some(pid) = flood_pid {
            usage = usage.with_process("flood", pid);
        }
        usage
    };
    let started = chrono::Utc::now().timestamp();
    let cpu_before = reading().await;
    let wall = Instant::now();
    let limit = Duration::from_secs(args.seconds);
    let watching = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch_delay(service.base.clone(), watching.clone()));
    let crowd = drive(
        &base,
        Plan::Once(limit, honest_plan),
        args.connections,
        attack.label(),
    );
    let mut cpu_after = None;
    let (honest_tally, attacker, slow) = match (flood_process, flood, attack) {
        (Some(process), _, _) => {
            let honest = crowd.await;
            cpu_after = Some(reading().await);
            let flood = process.stop().await?;
            (honest, Some(flood), None)
        }
        (None, Some(requests), _) => {
            let stop = Arc::new(AtomicBool::new(false));
            let (ready, opened) = tokio::sync::oneshot::channel();
            let flooding = tokio::spawn(flood_until(
                via.as_ref()
                    .map_or_else(|| service.bases.clone(), |front| vec![front.clone()]),
                requests,
                args.attack_connections,
                stop.clone(),
                ready,
            ));
            // The attacker's connections are open before the crowd's
            // clock starts, as the crowd's own are.
            let _ = opened.await;
            let honest = crowd.await;
            stop.store(true, Ordering::Relaxed);
            let attacker = flooding.await?;
            (honest, Some(attacker), None)
        }
        (None, None, Attack::SlowBodies) => {
            eprintln!(
                "slow bodies: {} connections, {} bytes declared, one a second; watched up to {:.1} s",
                args.slow_connections,
                args.slow_length,
                slow_watch(args).as_secs_f64()
            );
            let (honest, slow) = tokio::join!(crowd, slow_bodies(&service.bases, args));
            (honest, None, Some(slow))
        }
        (None, None, _) => (crowd.await, None, None),
    };
    let cpu_after = match cpu_after {
        Some(after) => after,
        None => reading().await,
    };
    let cpu = busy(&cpu_before, &cpu_after, wall.elapsed());
    watching.store(true, Ordering::Relaxed);
    let delays = watcher.await.unwrap_or_default();
    let delay_ms = (
        delays.iter().sum::<f64>() / delays.len().max(1) as f64,
        delays.iter().copied().fold(0.0, f64::max),
    );
    let check = match (other, &attacker) {
        // The accounts bought another voucher: each voucher is judged on
        // the answers of those who bought it.
        (Some(other), Some(accounts)) => {
            let honest = judged(service, voucher, &honest_tally, None, started).await?;
            let theirs = judged(service, other, accounts, None, started).await?;
            if honest.ok() {
                theirs
            } else {
                honest
            }
        }
        _ => judged(service, voucher, &honest_tally, attacker.as_ref(), started).await?,
    };
    let rate = honest_tally.count("200") as f64 / honest_tally.elapsed.as_secs_f64().max(1e-9);
    let allowance = attacker
        .as_ref()
        .and_then(|t| allowance(attack, args, t.elapsed));
    let origin_reads = match (&via, &attacker) {
        (Some(_), Some(flood)) => Some(
            (origin_reads(service).await - origin_before) / flood.elapsed.as_secs_f64().max(1e-9),
        ),
        _ => None,
    };
    Ok(Row {
        attack,
        again,
        honest: honest_tally,
        rate,
        attacker,
        slow,
        check,
        allowance,
        cpu,
        delay_ms,
        baseline: None,
        origin_reads,
    })
}

/// `GET /vouchers/{id}` requests the instances answered themselves, by
/// their request counters.
async fn origin_reads(service: &Target) -> f64 {
    let mut total = 0.0;
    for base in &service.bases {
        let page = scrape::metrics_text(base).await.unwrap_or_default();
        total += scrape::series(&page, "http_requests_total")
            .filter(|(labels, _)| labels.contains("route=\"/vouchers/{id}\""))
            .map(|(_, value)| value)
            .sum::<f64>();
    }
    total
}

/// Reads the instance's `seckill_shed_delay_seconds` every 250 ms until
/// `stop`; the readings in ms.
async fn watch_delay(base: String, stop: Arc<AtomicBool>) -> Vec<f64> {
    let mut readings = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Ok(page) = scrape::metrics_text(&base).await else {
            continue;
        };
        let delay = scrape::series(&page, "seckill_shed_delay_seconds")
            .find(|(labels, _)| labels.is_empty());
        if let Some((_, seconds)) = delay {
            readings.push(seconds * 1e3);
        }
    }
    readings
}

/// The attacker's requests in a row of `attack`, each claiming the
/// attacker's one address, or a botnet's requests, each from an address of
/// its own (the accounts buy `other`); `None` when the attack is no flood.
fn flood_plan(
    attack: Attack,
    voucher: i64,
    other: i64,
    people: &People<'_>,
) -> Option<Vec<Request>> {
    match attack {
        Attack::BotnetReads | Attack::FrontBotnetReads => {
            let read = Request::get(&format!("/vouchers/{voucher}"));
            return Some(
                people
                    .botnet
                    .iter()
                    .map(|address| read.clone().with_address(address.clone()))
                    .collect(),
            );
        }
        Attack::BotnetAccounts => {
            return Some(
                people
                    .accounts
                    .iter()
                    .zip(&people.botnet)
                    .map(|(token, address)| {
                        Request::purchase(other, token.clone()).with_address(address.clone())
                    })
                    .collect(),
            )
        }
        _ => {}
    }
    let attacker_address: Arc<str> = ATTACKER.into();
    match attack {
        Attack::Nobody
        | Attack::FrontAlone
        | Attack::SlowBodies
        | Attack::BotnetReads
        | Attack::BotnetAccounts
        | Attack::FrontBotnetReads => None,
        Attack::VoucherFlood => Some(vec![Request::get(&format!("/vouchers/{voucher}"))]),
        Attack::ReadyzFlood => Some(vec![Request::get("/readyz")]),
        Attack::OneToken => Some(vec![Request::purchase(voucher, people.attacker.clone())]),
        Attack::BotFarm => Some(
            people
                .bots
                .iter()
                .map(|token| Request::purchase(voucher, token.clone()))
                .collect(),
        ),
    }
    .map(|requests| {
        requests
            .into_iter()
            .map(|r| r.with_address(attacker_address.clone()))
            .collect::<Vec<_>>()
    })
}

/// The invariants of the row's voucher, over every purchase answered in
/// the row: the honest crowd's and the attacker's. An attacker's 5xx is
/// reported, not judged (the run fails on an honest buyer's); it still
/// excuses an order without a 200, as a lost answer does.
async fn judged(
    service: &Target,
    voucher: i64,
    honest: &Tally,
    attacker: Option<&Tally>,
    started: i64,
) -> anyhow::Result<Check> {
    let Some(attacker) = attacker else {
        return check(service, voucher, honest, started, None, 0).await;
    };
    let mut all = Tally::new();
    all.order_ids = honest
        .order_ids
        .iter()
        .chain(&attacker.order_ids)
        .cloned()
        .collect();
    all.statuses = honest.statuses.clone();
    for (key, n) in &attacker.statuses {
        let key = if key.starts_with('5') {
            format!("error: the attacker's {key}")
        } else {
            key.clone()
        };
        *all.statuses.entry(key).or_default() += n;
    }
    check(service, voucher, &all, started, None, 0).await
}

/// Answers other than 429 that the attack's limit allows in `elapsed`:
/// a full burst, then the rate, on each instance (each limits on its own
/// when its limiter is in-process; a shared one allows less).
pub(super) fn allowance(attack: Attack, args: &AbuseArgs, elapsed: Duration) -> Option<f64> {
    let limits = [args.limit_per_address, args.limit_per_user];
    let limit = match attack {
        // Every request from another address: no one limit to compare.
        Attack::BotnetReads | Attack::BotnetAccounts | Attack::FrontBotnetReads => return None,
        Attack::OneToken => limits.into_iter().filter(|l| *l > 0).min()?,
        _ => Some(args.limit_per_address).filter(|l| *l > 0)?,
    };
    Some(f64::from(limit) * (elapsed.as_secs_f64() + 1.0) * args.instances.max(1) as f64)
}

/// Percent of one core each part used between two readings `wall` apart.
fn busy(before: &Usage, after: &Usage, wall: Duration) -> BTreeMap<&'static str, f64> {
    let wall_us = wall.as_secs_f64() * 1e6;
    after
        .micros_per(before, 1)
        .into_iter()
        .map(|(part, us)| (part, (us / wall_us * 1000.0).round() / 10.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_counts_a_burst_and_the_rate_on_each_instance() {
        let mut args = AbuseArgs {
            seconds: 2,
            connections: 1,
            users: 1,
            attack_connections: 1,
            bots: 1,
            slow_connections: 1,
            slow_length: 1,
            body_timeout_ms: 1,
            limit_delay_ms: 500,
            limit_per_address: 50,
            limit_per_user: 5,
            instances: 2,
            attacks: Attack::ALL.to_vec(),
            botnet_addresses: 1,
            shed_delay_ms: 2,
            cpu_requests: 0,
            front_cpus: "none".into(),
            front_rounds: 1,
        };
        let two = Duration::from_secs(2);
        assert_eq!(allowance(Attack::BotFarm, &args, two), Some(300.0));
        assert_eq!(allowance(Attack::OneToken, &args, two), Some(30.0));
        args.limit_per_address = 0;
        assert_eq!(allowance(Attack::VoucherFlood, &args, two), None);
        assert_eq!(allowance(Attack::OneToken, &args, two), Some(30.0));
    }
}
