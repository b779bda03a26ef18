//! `loadtest abuse`: an honest crowd of buyers beside each attack the
//! service's limits are for (floods of cheap reads, one token on many
//! connections, a bot farm behind one address, bodies sent a byte a
//! second), on instances of its own with those limits on; what each attack
//! costs the honest buyers, what the attacker got, and what a refused
//! request costs the service beside `/healthz`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::{Admin, SaleMode};
use crate::cpu::Usage;
use crate::drive::{self, drive, Plan, Request, Tally};
use crate::invariants::{check, Check};
use crate::service::Target;
use crate::table::Table;
use crate::{report, round, save_report, TargetArgs};

#[derive(Args, Clone)]
pub struct AbuseArgs {
    /// Seconds of each row: the honest crowd's run, the attacker's beside it.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Connections of the honest crowd.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    /// Honest buyers with tokens, each from an address of its own; each
    /// buys once per row (every row sells a voucher of its own), and a row
    /// that uses them all up ends early and says so.
    #[arg(long, default_value_t = 100_000)]
    pub users: i64,
    /// Connections of each attacker of the floods (rows 2 to 5).
    #[arg(long, default_value_t = 200)]
    pub attack_connections: usize,
    /// Users of the bot farm behind one address (each with a valid token).
    #[arg(long, default_value_t = 10_000)]
    pub bots: i64,
    /// Connections that send a body one byte a second.
    #[arg(long, default_value_t = 300)]
    pub slow_connections: usize,
    /// The Content-Length those bodies declare (the service's limit is
    /// 2 MiB: at it, not over, so that the body is waited for).
    #[arg(long, default_value_t = 2_097_152)]
    pub slow_length: u64,
    /// SECKILL_BODY_TIMEOUT_MS of the instances: the longest a body may
    /// take to arrive, whole.
    #[arg(long, default_value_t = 3_000)]
    pub body_timeout_ms: u64,
    /// SECKILL_LIMIT_DELAY_MS of the instances: how long a refusal is held
    /// before it is sent (the service's default; 0 answers at once).
    #[arg(long, default_value_t = 500)]
    pub limit_delay_ms: u64,
    /// SECKILL_LIMIT_PER_ADDRESS of the instances (requests per second of
    /// one client address, burst of the same size; 0: no limit).
    #[arg(long, default_value_t = 50)]
    pub limit_per_address: u32,
    /// SECKILL_LIMIT_PER_USER of the instances (purchase, order and queue
    /// routes; 0: no limit).
    #[arg(long, default_value_t = 5)]
    pub limit_per_user: u32,
    /// Instances of the service, sharing the database and Redis.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// The attacks to run, beside the honest crowd alone (always run: the
    /// others are judged against it).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Attack::ALL)]
    pub attacks: Vec<Attack>,
    /// Requests of each kind in the phase that weighs a refused request
    /// against `/healthz` in the service's CPU (0: no such phase).
    #[arg(long, default_value_t = 20_000)]
    pub cpu_requests: usize,
}

/// One row's attacker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Attack {
    /// No attacker: the honest crowd alone, the baseline.
    Nobody,
    /// Anonymous `GET /vouchers/{id}` from one address.
    VoucherFlood,
    /// Anonymous `GET /readyz` from one address.
    ReadyzFlood,
    /// One user's token on every connection, `POST /seckill/{id}`.
    OneToken,
    /// Many valid users' purchases, all from one address.
    BotFarm,
    /// Bodies declared large and sent one byte a second.
    SlowBodies,
}

impl Attack {
    const ALL: [Attack; 6] = [
        Self::Nobody,
        Self::VoucherFlood,
        Self::ReadyzFlood,
        Self::OneToken,
        Self::BotFarm,
        Self::SlowBodies,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Nobody => "nobody (alone)",
            Self::VoucherFlood => "GET /vouchers/{id} flood",
            Self::ReadyzFlood => "GET /readyz flood",
            Self::OneToken => "one token, POST /seckill",
            Self::BotFarm => "bot farm, one address",
            Self::SlowBodies => "slow bodies",
        }
    }

    /// The prefix of the honest crowd's progress bar in this row.
    fn label(self) -> &'static str {
        match self {
            Self::Nobody => "alone",
            Self::VoucherFlood => "vs vouchers",
            Self::ReadyzFlood => "vs readyz",
            Self::OneToken => "vs one token",
            Self::BotFarm => "vs bot farm",
            Self::SlowBodies => "vs slow",
        }
    }
}

/// The address every flood claims (TEST-NET-3: a header value only, the
/// driver connects to the instances' loopback address and nowhere else).
const ATTACKER: &str = "203.0.113.7";
/// The address whose requests the CPU phase has refused.
const REFUSED: &str = "198.51.100.9";

/// Honest buyer `i`'s address: one of its own (10.0.0.0/8), derived from
/// its user id.
fn honest_address(i: i64) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

/// Slow connection `i`'s address: one each, so that the limit per address
/// does not end them before the body deadline can.
fn slow_address(i: usize) -> String {
    format!(
        "172.{}.{}.{}",
        16 + ((i >> 16) & 15),
        (i >> 8) & 255,
        i & 255
    )
}

/// One of the addresses the CPU phase's `/healthz` requests take turns on.
fn healthz_address(i: usize) -> String {
    format!(
        "100.{}.{}.{}",
        64 + ((i >> 16) & 63),
        (i >> 8) & 255,
        i & 255
    )
}

/// What happened to one slow connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlowEnd {
    /// The server closed it (or reset it) without an answer.
    Closed,
    /// The server answered with this status.
    Answered(u16),
    /// Still open when the driver stopped watching.
    Open,
    /// It could not be opened.
    Failed,
}

struct SlowConn {
    end: SlowEnd,
    /// From the request's head sent to the end.
    after: Duration,
}

/// The slow bodies of a row.
struct Slow {
    conns: Vec<SlowConn>,
    deadline: Duration,
}

impl Slow {
    /// Ended by the server within the deadline and one second.
    fn in_time(&self) -> usize {
        let limit = self.deadline + Duration::from_secs(1);
        self.conns
            .iter()
            .filter(|c| matches!(c.end, SlowEnd::Closed | SlowEnd::Answered(_)) && c.after <= limit)
            .count()
    }

    /// Connections by how they ended.
    fn ends(&self) -> BTreeMap<String, u64> {
        let mut ends = BTreeMap::new();
        for c in &self.conns {
            let key = match c.end {
                SlowEnd::Closed => "closed, no answer".to_owned(),
                SlowEnd::Answered(status) => format!("answered {status}"),
                SlowEnd::Open => "still open".to_owned(),
                SlowEnd::Failed => "not opened".to_owned(),
            };
            *ends.entry(key).or_default() += 1;
        }
        ends
    }

    /// Seconds from the head sent to the server's end of the connection:
    /// first, median, last (of those the server ended).
    fn after(&self) -> Option<(f64, f64, f64)> {
        let mut ended: Vec<f64> = self
            .conns
            .iter()
            .filter(|c| matches!(c.end, SlowEnd::Closed | SlowEnd::Answered(_)))
            .map(|c| c.after.as_secs_f64())
            .collect();
        ended.sort_by(f64::total_cmp);
        Some((*ended.first()?, ended[ended.len() / 2], *ended.last()?))
    }

    fn json(&self) -> Value {
        json!({
            "connections": self.conns.len(),
            "deadline_ms": self.deadline.as_millis(),
            "ended_in_time": self.in_time(),
            "ends": self.ends(),
            "ended_after_s": self.after().map(|(first, median, last)| json!({
                "first": round(first), "median": round(median), "last": round(last),
            })),
        })
    }
}

/// One row: the honest crowd beside one attacker.
struct Row {
    attack: Attack,
    /// The honest crowd alone, run again after the attacks.
    again: bool,
    honest: Tally,
    /// The honest buyers' purchases (200) per second.
    rate: f64,
    /// The floods' answers.
    attacker: Option<Tally>,
    slow: Option<Slow>,
    check: Check,
    /// Answers other than 429 that the attacker's limit lets it have in
    /// the attack's time, over every instance; `None` with no limit.
    allowance: Option<f64>,
    /// Percent of one core each part used during the row: on one machine
    /// the attacker's driver competes with the service for the same cores,
    /// and this tells how much of an honest slowdown that explains.
    cpu: BTreeMap<&'static str, f64>,
}

impl Row {
    fn honest_5xx(&self) -> u64 {
        fives(&self.honest.statuses)
    }

    fn name(&self) -> &'static str {
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
struct Alone {
    rate: f64,
    p99_ms: f64,
}

impl Alone {
    fn of(rows: &[Row]) -> Self {
        let alone: Vec<&Row> = rows.iter().filter(|r| r.attack == Attack::Nobody).collect();
        let n = alone.len().max(1) as f64;
        Self {
            rate: alone.iter().map(|r| r.rate).sum::<f64>() / n,
            p99_ms: alone.iter().map(|r| r.honest.ms(0.99)).sum::<f64>() / n,
        }
    }
}

/// Answers with a 5xx status among `statuses`.
fn fives(statuses: &BTreeMap<String, u64>) -> u64 {
    statuses
        .iter()
        .filter(|(k, _)| k.starts_with('5'))
        .map(|(_, v)| v)
        .sum()
}

/// One of the goals for one row.
struct Verdict {
    /// The row it judges.
    row: &'static str,
    goal: &'static str,
    measured: f64,
    target: &'static str,
    /// `None`: not measured in this run (no limit set, say).
    met: Option<bool>,
}

impl Verdict {
    fn new(
        row: &'static str,
        goal: &'static str,
        measured: f64,
        target: &'static str,
        met: impl Fn(f64) -> bool,
    ) -> Self {
        Self {
            row,
            goal,
            measured,
            target,
            met: (!measured.is_nan()).then(|| met(measured)),
        }
    }

    fn json(&self) -> Value {
        json!({
            "goal": self.goal,
            "measured": if self.measured.is_nan() { Value::Null } else { json!(round(self.measured)) },
            "target": self.target,
            "met": self.met,
        })
    }
}

/// The service's CPU per request: refused by the limit, and `/healthz`.
struct RefusalCost {
    requests: usize,
    /// Requests of the refused run (fewer while refusals are held).
    refused_requests: usize,
    /// Answered 429 of the refused run.
    refused: u64,
    /// Service µs per refused request.
    refused_us: f64,
    /// Service µs per `/healthz`: the mean of a run before and one after.
    healthz_us: f64,
    healthz_runs_us: [f64; 2],
}

impl RefusalCost {
    fn ratio(&self) -> f64 {
        self.refused_us / self.healthz_us
    }

    fn verdict(&self) -> Verdict {
        Verdict::new(
            "-",
            "service CPU per refused request / per /healthz",
            self.ratio(),
            "<= 1.5",
            |m| m <= 1.5,
        )
    }
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

/// Runs every row, then the CPU phase; `Ok(false)` when an invariant
/// broke or an honest buyer was answered 5xx (503 above all).
pub async fn run(target: &TargetArgs, args: &AbuseArgs) -> Result<bool, String> {
    if target.url.is_some() {
        return Err(
            "abuse starts its own instances (it sets their limits, trusted proxy and body deadline); drop --url"
                .into(),
        );
    }
    let payment_secret = format!("load-payment-secret-{}", uuid::Uuid::new_v4().simple());
    let env = vec![
        ("SECKILL_TRUSTED_PROXIES".into(), "127.0.0.1".into()),
        (
            "SECKILL_LIMIT_PER_ADDRESS".into(),
            args.limit_per_address.to_string(),
        ),
        (
            "SECKILL_LIMIT_PER_USER".into(),
            args.limit_per_user.to_string(),
        ),
        (
            "SECKILL_BODY_TIMEOUT_MS".into(),
            args.body_timeout_ms.to_string(),
        ),
        (
            "SECKILL_LIMIT_DELAY_MS".into(),
            args.limit_delay_ms.to_string(),
        ),
        // A notification is read whole before its signature is checked:
        // without a secret the route would refuse it before any body.
        ("SECKILL_PAYMENT_SECRET".into(), payment_secret),
    ];
    let service = Target::start(target.launch(args.instances.max(1), env.clone())).await?;
    let result = rows_of(&service, args).await;
    service.stop().await;
    let rows = result?;
    let cost = if args.cpu_requests > 0 {
        // The refusal's own work, on an instance that sends it at once: a
        // held refusal costs a timer more, and a phase of held refusals
        // would measure mostly the waiting and the connections it takes.
        let mut env = env;
        env.retain(|(name, _)| name != "SECKILL_LIMIT_DELAY_MS");
        env.push(("SECKILL_LIMIT_DELAY_MS".into(), "0".into()));
        let service = Target::start(target.launch(1, env)).await?;
        let result = async {
            let voucher = Admin::new(&service).endless_voucher(SaleMode::Sync).await?;
            refusal_cost(&service, args, voucher).await
        }
        .await;
        service.stop().await;
        Some(result?)
    } else {
        None
    };

    let alone = &Alone::of(&rows);
    let goals: Vec<Verdict> = rows
        .iter()
        .flat_map(|row| goals(row, alone))
        .chain(cost.as_ref().map(RefusalCost::verdict))
        .collect();
    print_rows(&rows, alone);
    print_goals(&goals);
    if let Some(cost) = &cost {
        print_cost(cost);
    }
    for row in &rows {
        for problem in &row.check.problems {
            println!("  {}: INVARIANT BROKEN: {problem}", row.name());
        }
        if row.honest_5xx() > 0 {
            println!(
                "  {}: FAILED: {} honest purchases answered 5xx",
                row.name(),
                row.honest_5xx()
            );
        }
    }
    let sections: Vec<report::Section> = rows
        .iter()
        .map(|row| report::Section {
            title: format!("honest buyers beside: {}", row.name()),
            tally: &row.honest,
            facts: vec![
                ("purchases/s".into(), format!("{:.0}", row.rate)),
                ("p99 ms".into(), format!("{:.2}", row.honest.ms(0.99))),
                ("answers".into(), statuses(&row.honest.statuses)),
                (
                    "attacker".into(),
                    row.attacker
                        .as_ref()
                        .map_or("-".into(), |t| statuses(&t.statuses)),
                ),
            ],
            ceilings: None,
        })
        .collect();
    save_report(
        "abuse",
        &report::html(
            "seckill load test: abuse",
            &sections,
            &[("Rows", rows_table(&rows, alone).html())],
            &[],
        ),
    );
    let ok = rows.iter().all(|r| r.check.ok() && r.honest_5xx() == 0);
    println!(
        "{}",
        json!({
            "scenario": "abuse",
            "ok": ok,
            "seconds": args.seconds,
            "instances": args.instances.max(1),
            "connections": args.connections,
            "attack_connections": args.attack_connections,
            "limit_per_address": args.limit_per_address,
            "limit_per_user": args.limit_per_user,
            "body_timeout_ms": args.body_timeout_ms,
            "limit_delay_ms": args.limit_delay_ms,
            "rows": rows.iter().map(|r| row_json(r, alone)).collect::<Vec<_>>(),
            "refusal_cost": cost.as_ref().map(|c| json!({
                "requests": c.requests,
                "refused_requests": c.refused_requests,
                "refused": c.refused,
                "refused_service_us": round(c.refused_us),
                "healthz_service_us": round(c.healthz_us),
                "healthz_runs_service_us": c.healthz_runs_us.map(round),
                "ratio": round(c.ratio()),
                "goal": c.verdict().json(),
            })),
        })
    );
    Ok(ok)
}

async fn rows_of(service: &Target, args: &AbuseArgs) -> Result<Vec<Row>, String> {
    let admin = Admin::new(service);
    let users = args.users.max(1);
    let bots = args.bots.max(1);
    eprintln!(
        "abuse: minting {} tokens (honest buyers, the attacker, its bots)",
        users + 1 + bots
    );
    let tokens = admin.shared_tokens(1, users + 1 + bots).await?;
    let (honest, rest) = tokens.split_at(usize::try_from(users).unwrap_or(0));
    let (attacker, bots) = rest.split_at(1);
    let addresses: Vec<Arc<str>> = (1..=users).map(|i| honest_address(i).into()).collect();
    let mut attacks = vec![(Attack::Nobody, false)];
    attacks.extend(
        Attack::ALL
            .into_iter()
            .filter(|a| *a != Attack::Nobody && args.attacks.contains(a))
            .map(|a| (a, false)),
    );
    if attacks.len() > 1 {
        attacks.push((Attack::Nobody, true));
    }
    let people = People {
        honest,
        addresses: &addresses,
        attacker: &attacker[0],
        bots,
    };
    let mut rows = Vec::with_capacity(attacks.len());
    for (attack, again) in attacks {
        let row = run_row(service, &admin, args, &people, attack, again).await?;
        eprintln!(
            "{}: honest {:.0} purchases/s, p99 {:.2} ms; {}",
            row.name(),
            row.rate,
            row.honest.ms(0.99),
            if row.check.ok() {
                "invariants ok"
            } else {
                "INVARIANT BROKEN"
            }
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Who takes part in the rows: the honest buyers' tokens and addresses,
/// the attacker's one token and its bots' tokens.
struct People<'a> {
    honest: &'a [Arc<str>],
    addresses: &'a [Arc<str>],
    attacker: &'a Arc<str>,
    bots: &'a [Arc<str>],
}

/// One row: a voucher of its own, the honest crowd for `--seconds` with
/// `attack` beside it, then the voucher's invariants.
async fn run_row(
    service: &Target,
    admin: &Admin<'_>,
    args: &AbuseArgs,
    people: &People<'_>,
    attack: Attack,
    again: bool,
) -> Result<Row, String> {
    let voucher = admin.endless_voucher(SaleMode::Sync).await?;
    let honest_plan: Vec<Request> = service
        .purchases(voucher, people.honest, 1)
        .into_iter()
        .zip(people.addresses)
        .map(|(request, address)| request.with_address(address.clone()))
        .collect();
    let attacker_address: Arc<str> = ATTACKER.into();
    let flood = match attack {
        Attack::Nobody | Attack::SlowBodies => None,
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
    });
    let started = chrono::Utc::now().timestamp();
    let cpu_before = Usage::now(service).await;
    let wall = Instant::now();
    let limit = Duration::from_secs(args.seconds);
    let crowd = drive(
        &service.base,
        Plan::Once(limit, honest_plan),
        args.connections,
        attack.label(),
    );
    let (honest_tally, attacker, slow) = match (flood, attack) {
        (Some(requests), _) => {
            let stop = Arc::new(AtomicBool::new(false));
            let (ready, opened) = tokio::sync::oneshot::channel();
            let flooding = tokio::spawn(flood_until(
                service.bases.clone(),
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
            let attacker = flooding.await.map_err(|e| e.to_string())?;
            (honest, Some(attacker), None)
        }
        (None, Attack::SlowBodies) => {
            eprintln!(
                "slow bodies: {} connections, {} bytes declared, one a second; watched up to {:.1} s",
                args.slow_connections,
                args.slow_length,
                slow_watch(args).as_secs_f64()
            );
            let (honest, slow) = tokio::join!(crowd, slow_bodies(&service.bases, args));
            (honest, None, Some(slow))
        }
        (None, _) => (crowd.await, None, None),
    };
    let cpu = busy(&cpu_before, &Usage::now(service).await, wall.elapsed());
    let check = judged(service, voucher, &honest_tally, attacker.as_ref(), started).await?;
    let rate = honest_tally.count("200") as f64 / honest_tally.elapsed.as_secs_f64().max(1e-9);
    let allowance = attacker
        .as_ref()
        .and_then(|t| allowance(attack, args, t.elapsed));
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
) -> Result<Check, String> {
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
fn allowance(attack: Attack, args: &AbuseArgs, elapsed: Duration) -> Option<f64> {
    let limits = [args.limit_per_address, args.limit_per_user];
    let limit = match attack {
        Attack::OneToken => limits.into_iter().filter(|l| *l > 0).min()?,
        _ => Some(args.limit_per_address).filter(|l| *l > 0)?,
    };
    Some(f64::from(limit) * (elapsed.as_secs_f64() + 1.0) * args.instances.max(1) as f64)
}

/// `requests` over and over, in turn, over `connections` connections of
/// its own (spread over the instances) until `stop`; `ready` is sent once
/// they are open. No progress bar: the honest crowd's runs beside it.
async fn flood_until(
    bases: Vec<String>,
    requests: Vec<Request>,
    connections: usize,
    stop: Arc<AtomicBool>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Tally {
    let connections = connections.max(1);
    let client = drive::client(connections);
    let address = requests
        .first()
        .and_then(|r| r.from.clone())
        .unwrap_or_else(|| ATTACKER.into());
    let opening: Vec<_> = (0..connections)
        .map(|c| {
            let request = client
                .get(format!("{}/healthz", bases[c % bases.len()]))
                .header("x-forwarded-for", &*address)
                .timeout(Duration::from_secs(5));
            tokio::spawn(async move {
                if let Ok(response) = request.send().await {
                    let _ = response.bytes().await;
                }
            })
        })
        .collect();
    for opened in opening {
        let _ = opened.await;
    }
    let _ = ready.send(());
    let started = Instant::now();
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            let (client, requests, next, stop) =
                (client.clone(), requests.clone(), next.clone(), stop.clone());
            let base = bases[c % bases.len()].clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let request = &requests[i % requests.len()];
                    answers.push(drive::exchange(&client, &base, request).await);
                }
                answers
            })
        })
        .collect();
    let mut tally = Tally::starting_at(started);
    for worker in workers {
        for answered in worker.await.unwrap_or_default() {
            tally.record(answered);
        }
    }
    tally.elapsed = started.elapsed();
    tally
}

/// How long the slow connections are watched: past the deadline and the
/// second it is allowed, long enough to see a late close.
fn slow_watch(args: &AbuseArgs) -> Duration {
    Duration::from_millis(args.body_timeout_ms) + Duration::from_secs(3)
}

/// Opens the slow connections, each from an address of its own, spread
/// over the instances; how each one ended.
async fn slow_bodies(bases: &[String], args: &AbuseArgs) -> Slow {
    let watch = slow_watch(args);
    let tasks: Vec<_> = (0..args.slow_connections)
        .map(|i| {
            let base = bases[i % bases.len()].clone();
            let length = args.slow_length;
            tokio::spawn(async move { slow_body(&base, &slow_address(i), length, watch).await })
        })
        .collect();
    let mut conns = Vec::with_capacity(tasks.len());
    for task in tasks {
        conns.push(task.await.unwrap_or(SlowConn {
            end: SlowEnd::Failed,
            after: Duration::ZERO,
        }));
    }
    Slow {
        conns,
        deadline: Duration::from_millis(args.body_timeout_ms),
    }
}

/// One payment notification declaring `length` bytes, sent one byte a
/// second over a raw connection: how (and when after its head) the server
/// ended it, or that it was still open after `watch`.
async fn slow_body(base: &str, from: &str, length: u64, watch: Duration) -> SlowConn {
    let failed = SlowConn {
        end: SlowEnd::Failed,
        after: Duration::ZERO,
    };
    let Some(authority) = base.strip_prefix("http://") else {
        return failed;
    };
    let Ok(mut stream) = tokio::net::TcpStream::connect(authority).await else {
        return failed;
    };
    // A signature of the right shape: only the whole body can tell it is
    // wrong, so the service must wait for it.
    let head = format!(
        "POST /payments/notify HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\nX-Signature: sha256={}\r\nX-Forwarded-For: {from}\r\n\r\n",
        "0".repeat(64)
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return failed;
    }
    let started = Instant::now();
    let ended = |end| SlowConn {
        end,
        after: started.elapsed(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let give_up = tokio::time::sleep(watch);
    tokio::pin!(give_up);
    let mut sent = 0;
    let mut buffer = [0_u8; 1024];
    loop {
        tokio::select! {
            read = stream.read(&mut buffer) => {
                return match read {
                    Ok(n) if n > 0 => ended(status_of(&buffer[..n]).map_or(SlowEnd::Closed, SlowEnd::Answered)),
                    _ => ended(SlowEnd::Closed),
                };
            }
            _ = tick.tick(), if sent < length => {
                if stream.write_all(b" ").await.is_err() {
                    return ended(SlowEnd::Closed);
                }
                sent += 1;
            }
            () = &mut give_up => return ended(SlowEnd::Open),
        }
    }
}

/// The status of an HTTP/1.1 answer's first bytes (`HTTP/1.1 408 ...`).
fn status_of(bytes: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(bytes).ok()?.lines().next()?;
    let mut words = line.split(' ');
    words.next()?.starts_with("HTTP/").then_some(())?;
    words.next()?.parse().ok()
}

/// The service's CPU per request refused by the limit per address (one
/// address far over it, `GET /vouchers/{id}`) beside `/healthz` (from
/// addresses that take turns, none over its limit), measured around a
/// `/healthz` run before and one after, whose mean it is weighed against.
async fn refusal_cost(
    service: &Target,
    args: &AbuseArgs,
    voucher: i64,
) -> Result<RefusalCost, String> {
    let n = args.cpu_requests;
    // Enough addresses that none goes over its limit below 100,000
    // requests a second; a new address for every request would bill the
    // limiter's new entries to /healthz.
    let turns = match args.limit_per_address {
        0 => 1,
        limit => (100_000 / limit as usize + 1).max(256),
    }
    .min(n.max(1));
    let addresses: Vec<Arc<str>> = (0..turns).map(|i| healthz_address(i).into()).collect();
    let healthz_plan = || {
        (0..n)
            .map(|i| Request::get("/healthz").with_address(addresses[i % turns].clone()))
            .collect::<Vec<_>>()
    };
    let (refused_n, refused_connections) = (n, args.connections);
    let refused_plan =
        vec![Request::get(&format!("/vouchers/{voucher}")).with_address(REFUSED.into()); refused_n];
    let connections = args.connections;
    let service_us = |before: &Usage, after: &Usage, requests: usize| {
        after
            .micros_per(before, requests as u64)
            .get("service")
            .copied()
            .unwrap_or(f64::NAN)
    };
    let measure = |plan: Vec<Request>, connections: usize, label: &'static str| async move {
        let requests = plan.len();
        let before = Usage::now(service).await;
        let tally = service.send_each(plan, connections, label).await;
        let after = Usage::now(service).await;
        (tally, service_us(&before, &after, requests))
    };
    let (first, first_us) = measure(healthz_plan(), connections, "cpu healthz").await;
    let (refused, refused_us) = measure(refused_plan, refused_connections, "cpu refused").await;
    let (last, last_us) = measure(healthz_plan(), connections, "cpu healthz").await;
    for (what, tally) in [
        ("healthz", &first),
        ("healthz", &last),
        ("refused", &refused),
    ] {
        eprintln!("cpu phase, {what}: {}", statuses(&tally.statuses));
    }
    Ok(RefusalCost {
        requests: n,
        refused_requests: refused_n,
        refused: refused.count("429 rate_limited"),
        refused_us,
        healthz_us: (first_us + last_us) / 2.0,
        healthz_runs_us: [first_us, last_us],
    })
}

/// The goals for one row.
fn goals(row: &Row, alone: &Alone) -> Vec<Verdict> {
    let attack = row.name();
    let mut goals = Vec::new();
    if row.attack != Attack::Nobody {
        goals.push(Verdict::new(
            attack,
            "honest purchases/s, of alone",
            row.rate / alone.rate,
            ">= 0.6",
            |m| m >= 0.6,
        ));
        goals.push(Verdict::new(
            attack,
            "honest p99, of alone",
            row.honest.ms(0.99) / alone.p99_ms,
            "< 2",
            |m| m < 2.0,
        ));
    }
    goals.push(Verdict::new(
        attack,
        "honest answers 5xx (503 included)",
        row.honest_5xx() as f64,
        "0",
        |m| m == 0.0,
    ));
    if let Some(attacker) = &row.attacker {
        let refused: u64 = attacker
            .statuses
            .iter()
            .filter(|(k, _)| k.starts_with("429"))
            .map(|(_, v)| v)
            .sum();
        let other = attacker.requests - refused;
        goals.push(Verdict::new(
            attack,
            "attacker's answers other than 429, of its limit's allowance",
            row.allowance.map_or(f64::NAN, |a| other as f64 / a),
            "<= 1",
            |m| m <= 1.0,
        ));
    }
    if let Some(slow) = &row.slow {
        goals.push(Verdict::new(
            attack,
            "slow connections not ended within deadline + 1 s",
            (slow.conns.len() - slow.in_time()) as f64,
            "0",
            |m| m == 0.0,
        ));
    }
    goals
}

/// `200 5123, 429 rate_limited 12`: a tally's answers, compactly.
fn statuses(statuses: &BTreeMap<String, u64>) -> String {
    if statuses.is_empty() {
        return "-".into();
    }
    statuses
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn rows_table(rows: &[Row], alone: &Alone) -> Table {
    let mut table = Table::new([
        "attacker",
        "honest buys/s",
        "of alone",
        "honest p99 ms",
        "p99 of alone",
        "honest answers",
        "attacker answers/s",
        "attacker answers",
        "service CPU %",
        "driver CPU %",
        "all CPU %",
        "invariants",
    ]);
    for row in rows {
        let (attacker_rate, attacker_answers) = match (&row.attacker, &row.slow) {
            (Some(t), _) => (format!("{:.0}", t.rps()), statuses(&t.statuses)),
            (None, Some(slow)) => ("-".into(), statuses(&slow.ends())),
            (None, None) => ("-".into(), "-".into()),
        };
        let percent = |part| {
            row.cpu
                .get(part)
                .map_or("-".to_owned(), |p| format!("{p:.0}"))
        };
        table.row([
            row.name().to_owned(),
            format!("{:.0}", row.rate),
            format!("{:.2}", row.rate / alone.rate),
            format!("{:.2}", row.honest.ms(0.99)),
            format!("{:.2}", row.honest.ms(0.99) / alone.p99_ms),
            statuses(&row.honest.statuses),
            attacker_rate,
            attacker_answers,
            percent("service"),
            percent("driver"),
            format!("{:.0}", row.cpu.values().sum::<f64>()),
            if row.check.ok() && row.honest_5xx() == 0 {
                "ok"
            } else {
                "FAILED"
            }
            .to_owned(),
        ]);
    }
    table
}

fn print_rows(rows: &[Row], alone: &Alone) {
    let table = rows_table(rows, alone);
    print!("{}", table.text());
    crate::table::record("abuse", "Honest buyers beside each attacker", &table);
    for row in rows {
        if row.honest.exhausted {
            println!(
                "  {}: every honest buyer bought before the row's time was up (more --users would have kept them buying)",
                row.name()
            );
        }
        let Some(slow) = &row.slow else { continue };
        let mut table = Table::new([
            "slow connections",
            "deadline s",
            "ended in time",
            "first s",
            "median s",
            "last s",
            "how they ended",
        ]);
        let after = slow.after();
        let at = |pick: fn((f64, f64, f64)) -> f64| {
            after.map_or("-".into(), |a| format!("{:.2}", pick(a)))
        };
        table.row([
            slow.conns.len().to_string(),
            format!("{:.1}", slow.deadline.as_secs_f64()),
            slow.in_time().to_string(),
            at(|a| a.0),
            at(|a| a.1),
            at(|a| a.2),
            statuses(&slow.ends()),
        ]);
        print!("\n{}", table.text());
        crate::table::record("abuse", "Slow bodies: when the server ended them", &table);
    }
}

fn print_goals(goals: &[Verdict]) {
    let mut table = Table::new(["attacker", "goal", "measured", "target", "met"]);
    for g in goals {
        table.row([
            g.row.to_owned(),
            g.goal.to_owned(),
            if g.measured.is_nan() {
                "not measured".to_owned()
            } else {
                format!("{}", round(g.measured))
            },
            g.target.to_owned(),
            match g.met {
                None => "-",
                Some(true) => "yes",
                Some(false) => "NO",
            }
            .to_owned(),
        ]);
    }
    print!("\n{}", table.text());
    crate::table::record("abuse", "Goals", &table);
}

fn print_cost(cost: &RefusalCost) {
    let mut table = Table::new(["request", "requests", "answered 429", "service µs/request"]);
    table.row([
        "GET /healthz (mean of before and after)".to_owned(),
        cost.requests.to_string(),
        "-".to_owned(),
        format!("{:.1}", cost.healthz_us),
    ]);
    table.row([
        "GET /vouchers/{id}, one address over its limit".to_owned(),
        cost.refused_requests.to_string(),
        cost.refused.to_string(),
        format!("{:.1}", cost.refused_us),
    ]);
    print!("\n{}", table.text());
    println!(
        "  refused / /healthz: {:.2}x (goal <= 1.5x; /healthz runs {:.1} and {:.1} µs; on an instance that sends refusals at once)",
        cost.ratio(),
        cost.healthz_runs_us[0],
        cost.healthz_runs_us[1]
    );
    crate::table::record("abuse", "What a refused request costs the service", &table);
}

fn row_json(row: &Row, alone: &Alone) -> Value {
    json!({
        "attacker": row.name(),
        "honest": {
            "requests": row.honest.requests,
            "purchases_per_sec": round(row.rate),
            "of_alone": round(row.rate / alone.rate),
            "p50_ms": round(row.honest.ms(0.5)),
            "p99_ms": round(row.honest.ms(0.99)),
            "p99_of_alone": round(row.honest.ms(0.99) / alone.p99_ms),
            "status": row.honest.statuses,
            "users_ran_out": row.honest.exhausted,
            "seconds": round(row.honest.elapsed.as_secs_f64()),
        },
        "attack": row.attacker.as_ref().map(|t| json!({
            "requests": t.requests,
            "answers_per_sec": round(t.rps()),
            "status": t.statuses,
            "allowance": row.allowance.map(round),
            "seconds": round(t.elapsed.as_secs_f64()),
        })),
        "slow": row.slow.as_ref().map(Slow::json),
        "cpu_percent_of_a_core": row.cpu,
        "orders": row.check.orders,
        "invariants_ok": row.check.ok(),
        "problems": row.check.problems,
        "goals": goals(row, alone).iter().map(Verdict::json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_per_buyer_and_slow_connection() {
        let honest: std::collections::HashSet<String> = (1..=70_000).map(honest_address).collect();
        assert_eq!(honest.len(), 70_000);
        assert_eq!(honest_address(1), "10.0.0.1");
        assert_eq!(honest_address(65_537), "10.1.0.1");
        let slow: std::collections::HashSet<String> = (0..1_000).map(slow_address).collect();
        assert_eq!(slow.len(), 1_000);
        assert!(slow.iter().all(|a| a.parse::<std::net::Ipv4Addr>().is_ok()));
    }

    #[test]
    fn an_answer_status_is_read_from_its_first_line() {
        assert_eq!(
            status_of(b"HTTP/1.1 408 Request Timeout\r\n\r\n"),
            Some(408)
        );
        assert_eq!(status_of(b"HTTP/1.1 413 Payload Too Large\r\n"), Some(413));
        assert_eq!(status_of(b"garbage"), None);
    }

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
            cpu_requests: 0,
        };
        let two = Duration::from_secs(2);
        assert_eq!(allowance(Attack::BotFarm, &args, two), Some(300.0));
        assert_eq!(allowance(Attack::OneToken, &args, two), Some(30.0));
        args.limit_per_address = 0;
        assert_eq!(allowance(Attack::VoucherFlood, &args, two), None);
        assert_eq!(allowance(Attack::OneToken, &args, two), Some(30.0));
    }
}
