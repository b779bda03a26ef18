//! `loadtest lifecycle`: what happens to orders after the grab, on two
//! instances: payments racing the deadline (every notification delivered
//! twice, once to each instance), cancels racing the expiry, returned units
//! sold again, a whole sale expiring at once; conservation sampled all along.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use clap::Args;
use hdrhistogram::Histogram;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Map, Value};
use sqlx::{Connection, PgConnection};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::{Admin, NewSale, SaleMode, Stats};
use crate::drive::{self, drive, Plan, Tally};
use crate::service::Target;
use crate::table::Table;

/// What every lifecycle voucher costs, in cents.
const PRICE_CENTS: i64 = 1999;
/// Payments aimed this far (or further) before their deadline, and this
/// far after it, are counted apart: how many paid, how many were refunded
/// (the clocks, not the aim, judge each one; see `judge_race`).
const DECISIVE_MS: i64 = 100;
/// Payments and cancels land within this much of the deadline.
const RACE_SPREAD_MS: i64 = 150;
/// How far the service's sale clock may be from this driver's (the same
/// host's) when judging which side of a deadline a payment fell on.
const CLOCK_SLACK_MS: i64 = 25;
/// Each part's users start at a multiple of this, so no two parts share one.
const USERS_PER_PART: i64 = 10_000_000;

#[derive(Args, Clone)]
pub struct LifecycleArgs {
    /// Orders per sale mode whose payment or cancel races its deadline.
    #[arg(long, default_value_t = 10_000)]
    pub races: i64,
    /// Purchases per second of the race parts: their deadlines spread as
    /// the purchases did, so the payments racing them come at a rate the
    /// two instances take without queueing.
    #[arg(long, default_value_t = 500)]
    pub race_rate: u32,
    /// The race vouchers' payment window, in seconds (longer than the
    /// purchase wave: every deadline is read before the first one comes).
    #[arg(long, default_value_t = 30)]
    pub pay_within: i64,
    /// Unpaid orders of the sale that expires all at once.
    #[arg(long, default_value_t = 100_000)]
    pub expiring: i64,
    /// Seconds of each load on the concurrent voucher (before and during the
    /// mass expiry), and of selling with a one-second payment window.
    #[arg(long, default_value_t = 8)]
    pub seconds: u64,
    /// Units returned after sold-out and bought again through the other
    /// instance, per sale mode.
    #[arg(long, default_value_t = 20)]
    pub rebuys: usize,
    /// Purchases per second of the voucher selling beside the mass expiry
    /// (and alone, before it, for comparison).
    #[arg(long, default_value_t = 1_000)]
    pub beside_rate: u32,
    /// Only these parts (repeatable; all when not given).
    #[arg(long, value_parser = ["races", "rebuy", "lateness", "mass-expiry"])]
    pub part: Vec<String>,
    /// Connections of each crowd.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

/// One part of the run: its figures and every broken promise.
pub struct Part {
    pub name: String,
    pub facts: Map<String, Value>,
    pub problems: Vec<String>,
}

impl Part {
    fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            facts: Map::new(),
            problems: Vec::new(),
        }
    }

    fn fact(&mut self, key: &str, value: impl Into<Value>) {
        self.facts.insert(key.to_owned(), value.into());
    }

    pub fn json(&self) -> Value {
        json!({ "part": self.name, "ok": self.problems.is_empty(), "facts": self.facts, "problems": self.problems })
    }
}

/// Runs every part on a two-instance service started with a payment
/// secret; prints each part and one JSON line. `Ok(false)`: a promise broke.
pub async fn run(target: &Target, secret: &str, args: &LifecycleArgs) -> Result<bool, String> {
    let mut parts = Vec::new();
    let mut part_no = 0;
    let mut users = || {
        part_no += 1;
        part_no * USERS_PER_PART + 1
    };
    let wanted = |part: &str| args.part.is_empty() || args.part.iter().any(|p| p == part);
    for mode in [SaleMode::Sync, SaleMode::Async] {
        if wanted("races") {
            parts.push(races(target, secret, mode, args, users()).await?);
            print_part(parts.last().expect("just pushed"));
        }
        if wanted("rebuy") {
            parts.push(rebuys(target, mode, args, users()).await?);
            print_part(parts.last().expect("just pushed"));
        }
    }
    if wanted("lateness") {
        parts.push(lateness(target, args, users()).await?);
        print_part(parts.last().expect("just pushed"));
    }
    if wanted("mass-expiry") {
        parts.push(mass_expiry(target, args, users()).await?);
        print_part(parts.last().expect("just pushed"));
    }
    let ok = parts.iter().all(|p| p.problems.is_empty());
    println!(
        "{}",
        json!({
            "scenario": "lifecycle",
            "races": args.races,
            "pay_within_seconds": args.pay_within,
            "expiring": args.expiring,
            "ok": ok,
            "parts": parts.iter().map(Part::json).collect::<Vec<_>>(),
        })
    );
    Ok(ok)
}

fn print_part(part: &Part) {
    let verdict = if part.problems.is_empty() {
        "ok"
    } else {
        "FAILED"
    };
    println!("{}: {verdict}", part.name);
    let mut table = Table::new(["measure", "value"]);
    for (k, v) in &part.facts {
        println!("    {k}: {v}");
        let value = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        table.row([k.replace('_', " "), value]);
    }
    for p in &part.problems {
        println!("    BROKEN: {p}");
        table.row(["BROKEN", p.as_str()]);
    }
    crate::table::record("lifecycle", &format!("{} ({verdict})", part.name), &table);
}

/// A notification's answer, and when it was sent and answered (the
/// driver's clock, the same machine's as the service's).
struct Delivery {
    answer: Answer,
    sent: DateTime<Utc>,
    answered: DateTime<Utc>,
}

/// One answer of the service to a notification or a cancel.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    code: u16,
    /// The order's status in the body (`status`).
    status: Option<String>,
    refund: Option<bool>,
    /// The error code of a 4xx/5xx, or the transport failure.
    error: Option<String>,
}

impl Answer {
    fn describe(&self) -> String {
        match (&self.status, self.refund, &self.error) {
            (_, _, Some(e)) => format!("{} {e}", self.code),
            (Some(s), Some(r), None) => format!("{} {s} refund={r}", self.code),
            (Some(s), None, None) => format!("{} {s}", self.code),
            _ => self.code.to_string(),
        }
    }

    fn is(&self, code: u16, status: &str, refund: Option<bool>) -> bool {
        self.code == code && self.status.as_deref() == Some(status) && self.refund == refund
    }

    fn error_is(&self, code: u16, error: &str) -> bool {
        self.code == code && self.error.as_deref() == Some(error)
    }

    /// Worth delivering again, as a provider (or a client) would: the order
    /// is not stored yet, the service is unavailable, or nothing came back.
    fn retry(&self) -> bool {
        self.code == 503 || self.code == 0 || self.error_is(409, "order_pending")
    }
}

/// The HTTP side of a part: notifications signed with the service's
/// secret, cancels and reads as the admin, on either instance.
#[derive(Clone)]
struct Caller {
    client: reqwest::Client,
    bases: Arc<[String]>,
    admin_token: Arc<str>,
    secret: Arc<str>,
}

impl Caller {
    fn new(target: &Target, secret: &str, connections: usize) -> Self {
        Self {
            client: drive::client(connections),
            bases: target.bases.clone().into(),
            admin_token: target.admin_token.as_str().into(),
            secret: secret.into(),
        }
    }

    async fn answer(request: reqwest::RequestBuilder) -> Answer {
        match request.send().await {
            Ok(response) => {
                let code = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                Answer {
                    code,
                    status: body["status"].as_str().map(str::to_owned),
                    refund: body["refund"].as_bool(),
                    error: body["error"].as_str().map(str::to_owned),
                }
            }
            Err(e) => Answer {
                code: 0,
                status: None,
                refund: None,
                error: Some(format!("transport: {e}")),
            },
        }
    }

    /// One delivery of a signed notification to instance `i`, redelivered
    /// while the answer asks for it (at most 50 times, 100 ms apart), with
    /// when it was first sent and when its last answer came.
    async fn notify(&self, i: usize, payment_id: &str, order_id: &str) -> Delivery {
        let sent = Utc::now();
        let answer = self.notify_once(i, payment_id, order_id).await;
        Delivery {
            answer,
            sent,
            answered: Utc::now(),
        }
    }

    async fn notify_once(&self, i: usize, payment_id: &str, order_id: &str) -> Answer {
        let body =
            json!({ "payment_id": payment_id, "order_id": order_id, "amount_cents": PRICE_CENTS })
                .to_string();
        let signature = seckill::http::signature_header(self.secret.as_bytes(), body.as_bytes());
        let url = format!("{}/payments/notify", self.bases[i % self.bases.len()]);
        self.until_settled(|| {
            self.client
                .post(&url)
                .header("content-type", "application/json")
                .header("x-signature", &signature)
                .body(body.clone())
        })
        .await
    }

    /// The admin cancels an order on instance `i` (again while pending).
    async fn cancel(&self, i: usize, order_id: &str) -> Answer {
        let url = format!(
            "{}/orders/{order_id}/cancel",
            self.bases[i % self.bases.len()]
        );
        self.until_settled(|| self.client.post(&url).bearer_auth(&*self.admin_token))
            .await
    }

    async fn until_settled(&self, request: impl Fn() -> reqwest::RequestBuilder) -> Answer {
        let mut answer = Self::answer(request()).await;
        for _ in 0..50 {
            if !answer.retry() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            answer = Self::answer(request()).await;
        }
        answer
    }

    /// A purchase by `token`'s user on instance `i`: its status code.
    async fn buy(&self, i: usize, voucher: i64, token: &str) -> (u16, Value) {
        let url = format!("{}/seckill/{voucher}", self.bases[i % self.bases.len()]);
        match self.client.post(url).bearer_auth(token).send().await {
            Ok(r) => {
                let code = r.status().as_u16();
                (code, r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }
}

/// Conservation sampled until `stop`: `stock + pending + unpaid + paid =
/// initial_stock` in every snapshot, taken from both instances in turn.
async fn sample_conservation(
    target: &Target,
    vouchers: &[i64],
    stop: &AtomicBool,
) -> (u64, Vec<String>) {
    let admins: Vec<Admin<'_>> = (0..target.bases.len().max(1))
        .map(|i| Admin::on(target, i))
        .collect();
    let (mut samples, mut broken) = (0_u64, Vec::new());
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        for &voucher in vouchers {
            i += 1;
            let Ok(s) = admins[i % admins.len()].stats(voucher).await else {
                continue;
            };
            samples += 1;
            if !s.conserved() {
                broken.push(format!("voucher {voucher}: {s:?}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (samples, broken)
}

/// Runs `work` while conservation is sampled on `vouchers`, and adds the
/// sampling's figures to the part.
async fn sampled<T>(
    part: &mut Part,
    target: &Target,
    vouchers: &[i64],
    work: impl std::future::Future<Output = T>,
) -> T {
    let stop = AtomicBool::new(false);
    let (out, (samples, broken)) = tokio::join!(
        async {
            let out = work.await;
            stop.store(true, Ordering::Relaxed);
            out
        },
        sample_conservation(target, vouchers, &stop)
    );
    part.fact("conservation_samples", samples);
    if !broken.is_empty() {
        part.problems.push(format!(
            "conservation broken in {} of {samples} samples, first: {}",
            broken.len(),
            broken[0]
        ));
    }
    out
}

/// Polls the voucher's stats until `done` says so, for at most `limit`.
async fn wait_for(
    admin: &Admin<'_>,
    voucher: i64,
    limit: Duration,
    what: &str,
    done: impl Fn(&Stats) -> bool,
) -> Result<Stats, String> {
    let started = Instant::now();
    loop {
        let stats = admin.stats(voucher).await?;
        if done(&stats) {
            return Ok(stats);
        }
        if started.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}: {stats:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every accepted order of the voucher is stored (nothing
/// `pending`; at once for a sync sale).
async fn wait_stored(
    admin: &Admin<'_>,
    voucher: i64,
    limit: Duration,
    what: &str,
) -> Result<Stats, String> {
    wait_for(admin, voucher, limit, what, |s| s.pending == 0).await
}

/// How each race order is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    /// Paid near the deadline, the notification delivered to both instances.
    Pay,
    /// Paid and cancelled (twice) near the deadline: three ways to close it.
    PayAndCancel,
    /// Cancelled twice well before the deadline, then paid (a refund).
    EarlyCancel,
    /// Left to expire.
    NoShow,
}

impl Role {
    /// 50% pay, 15% pay and cancel, 15% cancel early, 20% never pay.
    fn of(i: usize) -> Self {
        match i % 20 {
            0..10 => Self::Pay,
            10..13 => Self::PayAndCancel,
            13..16 => Self::EarlyCancel,
            _ => Self::NoShow,
        }
    }
}

struct RaceOrder {
    order_id: String,
    pay_by: DateTime<Utc>,
    role: Role,
    /// When the payment (or cancel) lands, from `pay_by`.
    offset_ms: i64,
}

struct RaceOutcome {
    order: RaceOrder,
    pays: Vec<Answer>,
    cancels: Vec<Answer>,
    /// The first payment delivery's send time, and the earliest answer.
    paid_sent: Option<DateTime<Utc>>,
    first_answer: Option<DateTime<Utc>>,
}

/// Sleeps until `pay_by + offset` (now, if that has passed).
async fn until(pay_by: DateTime<Utc>, offset_ms: i64) {
    let at = pay_by + chrono::Duration::milliseconds(offset_ms);
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

async fn play(caller: Caller, order: RaceOrder, pay_within_ms: i64) -> RaceOutcome {
    let id = order.order_id.as_str();
    let payment = format!("race-{id}");
    let (mut deliveries, mut cancels) = (Vec::new(), Vec::new());
    match order.role {
        Role::Pay => {
            until(order.pay_by, order.offset_ms).await;
            let (a, b) = tokio::join!(
                caller.notify(0, &payment, id),
                caller.notify(1, &payment, id)
            );
            deliveries = vec![a, b];
        }
        Role::PayAndCancel => {
            until(order.pay_by, order.offset_ms).await;
            let (a, b, c, d) = tokio::join!(
                caller.notify(0, &payment, id),
                caller.notify(1, &payment, id),
                caller.cancel(1, id),
                caller.cancel(0, id),
            );
            deliveries = vec![a, b];
            cancels = vec![c, d];
        }
        Role::EarlyCancel => {
            until(order.pay_by, -pay_within_ms / 2).await;
            let (c, d) = tokio::join!(caller.cancel(0, id), caller.cancel(1, id));
            cancels = vec![c, d];
            deliveries = vec![caller.notify(1, &payment, id).await];
        }
        Role::NoShow => {}
    }
    RaceOutcome {
        order,
        paid_sent: deliveries.iter().map(|d| d.sent).min(),
        first_answer: deliveries.iter().map(|d| d.answered).min(),
        pays: deliveries.into_iter().map(|d| d.answer).collect(),
        cancels,
    }
}

/// Counts broken promises by kind, with the first example of each.
#[derive(Default)]
struct Faults(BTreeMap<&'static str, (u64, String)>);

impl Faults {
    fn add(&mut self, kind: &'static str, example: impl FnOnce() -> String) {
        let entry = self.0.entry(kind).or_insert_with(|| (0, example()));
        entry.0 += 1;
    }

    fn into_problems(self) -> Vec<String> {
        self.0
            .into_iter()
            .map(|(kind, (n, example))| format!("{kind}: {n} orders, e.g. {example}"))
            .collect()
    }
}

/// Judges one order's answers against its final status.
fn judge_race(o: &RaceOutcome, last: &str, faults: &mut Faults, tally: &mut BTreeMap<String, u64>) {
    let show = || {
        format!(
            "order {} {:?} at {:+} ms: pays [{}] cancels [{}], final {last}",
            o.order.order_id,
            o.order.role,
            o.order.offset_ms,
            o.pays
                .iter()
                .map(Answer::describe)
                .collect::<Vec<_>>()
                .join(", "),
            o.cancels
                .iter()
                .map(Answer::describe)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    *tally
        .entry(format!("{:?} -> {last}", o.order.role))
        .or_default() += 1;
    if o.pays.windows(2).any(|w| w[0] != w[1]) {
        faults.add(
            "one notification delivered twice, answered differently",
            show,
        );
    }
    if o.cancels.windows(2).any(|w| w[0] != w[1]) {
        faults.add("one cancel sent twice, answered differently", show);
    }
    let pays_say =
        |status: &str, refund: bool| o.pays.iter().all(|a| a.is(200, status, Some(refund)));
    let consistent = match (o.order.role, last) {
        (Role::NoShow, "expired") => true,
        (Role::Pay, "paid") => pays_say("paid", false),
        (Role::Pay, "expired") => pays_say("expired", true),
        (Role::PayAndCancel, "paid") => {
            pays_say("paid", false) && o.cancels.iter().all(|a| a.error_is(409, "already_paid"))
        }
        (Role::PayAndCancel, "cancelled") => {
            pays_say("cancelled", true) && o.cancels.iter().all(|a| a.is(200, "cancelled", None))
        }
        (Role::PayAndCancel, "expired") => {
            pays_say("expired", true) && o.cancels.iter().all(|a| a.error_is(409, "order_expired"))
        }
        (Role::EarlyCancel, "cancelled") => {
            pays_say("cancelled", true) && o.cancels.iter().all(|a| a.is(200, "cancelled", None))
        }
        _ => false,
    };
    if !consistent {
        faults.add("answers disagree with the order's final status", show);
    }
    // What the clocks prove, whatever the load: a payment answered before
    // the deadline was processed in time, one sent after it was not (give
    // or take the sale clock's error: it follows Redis's clock to within
    // half a round trip, measured every second).
    let slack = chrono::Duration::milliseconds(CLOCK_SLACK_MS);
    if o.order.role == Role::Pay
        && o.first_answer.is_some_and(|t| t + slack < o.order.pay_by)
        && last != "paid"
    {
        faults.add("answered before the deadline, yet not paid", show);
    }
    if o.paid_sent.is_some_and(|t| t > o.order.pay_by + slack) && last == "paid" {
        faults.add("sent after the deadline, yet paid", show);
    }
    // Payments aimed DECISIVE_MS or more either side of the deadline are
    // counted (`paid_100ms_early_paid`, `paid_100ms_late_refunded`), not
    // judged: whether one aimed 100 ms early is processed in time depends
    // on the machine's load (a busy two-core machine has answered them
    // in 200 ms), and one aimed 100 ms late is sent no earlier than aimed,
    // so the clocks' rule above judges it.
}

/// 'races-{mode}': `args.races` orders, each paid, cancelled or left to
/// expire, payments and cancels landing within +-150 ms of the deadline and
/// delivered to both instances; then the returned units are bought again.
async fn races(
    target: &Target,
    secret: &str,
    mode: SaleMode,
    args: &LifecycleArgs,
    first_user: i64,
) -> Result<Part, String> {
    let mut part = Part::new(format!("races-{}", mode.name()));
    let admin = Admin::new(target);
    let caller = Caller::new(target, secret, 1_000);
    let voucher = admin
        .create_sale(NewSale {
            mode,
            stock: args.races,
            hours: 2,
            price_cents: PRICE_CENTS,
            pay_within_seconds: args.pay_within,
        })
        .await?;
    eprintln!("{}: minting {} tokens", part.name, args.races);
    let tokens = admin.shared_tokens(first_user, args.races).await?;
    let work = async {
        let tally = paced(&caller, voucher, &tokens, args.race_rate).await;
        let stored =
            wait_stored(&admin, voucher, Duration::from_secs(120), "orders stored").await?;
        let orders = deadlines(&caller, &tally.order_ids).await?;
        let started = Utc::now();
        let mut set = JoinSet::new();
        let mut rng = rand::rng();
        let mut shuffled = orders;
        shuffled.shuffle(&mut rng);
        for (i, (order_id, pay_by)) in shuffled.into_iter().enumerate() {
            let order = RaceOrder {
                order_id,
                pay_by,
                role: Role::of(i),
                offset_ms: rng.random_range(-RACE_SPREAD_MS..=RACE_SPREAD_MS),
            };
            set.spawn(play(caller.clone(), order, args.pay_within * 1000));
        }
        let mut outcomes = Vec::new();
        while let Some(done) = set.join_next().await {
            outcomes.push(done.map_err(|e| format!("a race task failed: {e}"))?);
        }
        let closed = wait_for(
            &admin,
            voucher,
            Duration::from_secs(30),
            "every order closed or paid",
            |s| s.unpaid == 0 && s.pending == 0,
        )
        .await?;
        Ok::<_, String>((tally, stored, outcomes, closed, Utc::now() - started))
    };
    let (tally, stored, outcomes, closed, took) =
        sampled(&mut part, target, &[voucher], work).await?;
    part.fact("orders", stored.orders);
    part.fact("purchase_statuses", json!(tally.statuses));
    part.fact(
        "deliveries_and_cancels_seconds",
        took.num_milliseconds() as f64 / 1000.0,
    );

    let finals: HashMap<String, String> = admin
        .order_lines(voucher)
        .await?
        .into_iter()
        .map(|l| (l.order_id, l.status))
        .collect();
    let mut faults = Faults::default();
    let mut outcomes_by_role = BTreeMap::new();
    let (mut early, mut late) = ((0, 0), (0, 0));
    for o in &outcomes {
        let last = finals
            .get(&o.order.order_id)
            .map_or("missing", String::as_str);
        judge_race(o, last, &mut faults, &mut outcomes_by_role);
        if o.order.role == Role::Pay {
            if o.order.offset_ms <= -DECISIVE_MS {
                early.0 += 1;
                early.1 += u64::from(last == "paid");
            } else if o.order.offset_ms >= DECISIVE_MS {
                late.0 += 1;
                late.1 += u64::from(last == "expired");
            }
        }
    }
    let mut answer_ms: Vec<i64> = outcomes
        .iter()
        .filter_map(|o| Some((o.first_answer? - o.paid_sent?).num_milliseconds()))
        .collect();
    answer_ms.sort_unstable();
    let quantile = |q: f64| {
        let last = answer_ms.len().saturating_sub(1) as f64;
        answer_ms.get((last * q) as usize).copied().unwrap_or(0)
    };
    part.fact("payment_answer_ms_p50", quantile(0.5));
    part.fact("payment_answer_ms_p99", quantile(0.99));
    let deliveries: usize = outcomes
        .iter()
        .map(|o| o.pays.len() + o.cancels.len())
        .sum();
    part.fact("notifications_and_cancels", deliveries);
    part.fact("outcomes", json!(outcomes_by_role));
    part.fact(
        "paid_100ms_early_paid",
        format!("{} of {}", early.1, early.0),
    );
    part.fact(
        "paid_100ms_late_refunded",
        format!("{} of {}", late.1, late.0),
    );
    part.fact(
        "final",
        json!({ "paid": closed.paid, "cancelled": closed.cancelled, "expired": closed.expired, "stock": closed.stock }),
    );
    part.problems.extend(faults.into_problems());
    if closed.paid + closed.cancelled + closed.expired != args.races {
        part.problems.push(format!(
            "{} orders, but {} paid + {} cancelled + {} expired",
            args.races, closed.paid, closed.cancelled, closed.expired
        ));
    }
    if let Some(url) = &target.database_url {
        part.problems.extend(books(url, voucher).await?);
    }

    // Every returned unit is for sale again, once: fresh buyers through
    // the second instance get exactly that many.
    let returned = closed.cancelled + closed.expired;
    let extra = (returned / 10).max(10);
    let rebuyers = admin
        .shared_tokens(first_user + args.races, returned + extra)
        .await?;
    let second: Arc<str> = target.bases[target.bases.len() - 1].as_str().into();
    let plan = rebuyers
        .iter()
        .map(|t| drive::Request::post_to(second.clone(), format!("/seckill/{voucher}"), t.clone()))
        .collect();
    let again = target.send_each(plan, args.connections, "buy again").await;
    let sold_again = again.count("200") + again.count("202");
    part.fact("returned_units", returned);
    part.fact("bought_again", sold_again);
    part.fact("buy_again_statuses", json!(again.statuses));
    if sold_again != u64::try_from(returned).unwrap_or(0) {
        part.problems.push(format!(
            "{returned} units came back but {sold_again} were sold again"
        ));
    }
    let end = wait_stored(
        &admin,
        voucher,
        Duration::from_secs(60),
        "rebought orders stored",
    )
    .await?;
    if !end.conserved() || end.stock != 0 {
        part.problems.push(format!("after buying again: {end:?}"));
    }
    Ok(part)
}

/// One purchase per token at `rate` a second, the instances in turn: the
/// answers counted and the order ids kept, as `drive` does.
async fn paced(caller: &Caller, voucher: i64, tokens: &[Arc<str>], rate: u32) -> Tally {
    let started = Instant::now();
    let every = Duration::from_secs(1) / rate.max(1);
    let progress = indicatif::ProgressBar::new(tokens.len() as u64).with_prefix("buy (paced)");
    let path = format!("/seckill/{voucher}");
    let mut set = JoinSet::new();
    for (i, token) in tokens.iter().enumerate() {
        let client = caller.client.clone();
        let base: Arc<str> = caller.bases[i % caller.bases.len()].as_str().into();
        let request = drive::Request::post_to(base.clone(), path.clone(), token.clone());
        let at =
            tokio::time::Instant::from_std(started) + every * u32::try_from(i).unwrap_or(u32::MAX);
        set.spawn(async move {
            tokio::time::sleep_until(at).await;
            drive::exchange(&client, &base, &request).await
        });
    }
    let mut tally = Tally::starting_at(started);
    while let Some(done) = set.join_next().await {
        match done {
            Ok(answered) => tally.record(answered),
            Err(_) => *tally.statuses.entry("error: task".into()).or_default() += 1,
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    tally.elapsed = started.elapsed();
    tally
}

/// Each order's deadline, read as the admin (64 reads at a time).
async fn deadlines(
    caller: &Caller,
    ids: &[String],
) -> Result<Vec<(String, DateTime<Utc>)>, String> {
    let permits = Arc::new(Semaphore::new(64));
    let mut set = JoinSet::new();
    for id in ids {
        let (caller, id, permits) = (caller.clone(), id.clone(), permits.clone());
        set.spawn(async move {
            let _permit = permits.acquire().await.map_err(|e| e.to_string())?;
            let url = format!("{}/orders/{id}", caller.bases[0]);
            let order: Value = caller
                .client
                .get(url)
                .bearer_auth(&*caller.admin_token)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            let pay_by = order["pay_by"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .ok_or_else(|| format!("order {id} has no pay_by: {order}"))?;
            Ok::<_, String>((id, pay_by.with_timezone(&Utc)))
        });
    }
    let mut out = Vec::with_capacity(ids.len());
    while let Some(done) = set.join_next().await {
        out.push(done.map_err(|e| e.to_string())??);
    }
    Ok(out)
}

/// The books in SQL: every closed order gave exactly one unit back, every
/// paid order has exactly one accepted payment and no other order has one,
/// no return is left in the outbox.
async fn books(url: &str, voucher: i64) -> Result<Vec<String>, String> {
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let (initial, stock, returned, live, closed, paid_mismatch, double_paid, outbox): (
        i32,
        i32,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT s.initial_stock, s.stock, s.returned,
            (SELECT count(*) FROM voucher_orders WHERE voucher_id = $1 AND status IN ('unpaid', 'paid')),
            (SELECT count(*) FROM voucher_orders WHERE voucher_id = $1 AND status IN ('cancelled', 'expired')),
            (SELECT count(*) FROM voucher_orders o WHERE o.voucher_id = $1
               AND (o.status = 'paid') <> EXISTS (SELECT 1 FROM payments p WHERE p.order_id = o.id AND NOT p.refund)),
            (SELECT count(*) FROM (SELECT p.order_id FROM payments p JOIN voucher_orders o ON o.id = p.order_id
               WHERE o.voucher_id = $1 AND NOT p.refund GROUP BY p.order_id HAVING count(*) > 1) twice),
            (SELECT count(*) FROM stock_returns WHERE voucher_id = $1)
         FROM seckill_vouchers s WHERE s.voucher_id = $1",
    )
    .bind(voucher)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    let mut problems = Vec::new();
    if returned != closed {
        problems.push(format!(
            "SQL: {closed} orders closed, {returned} units returned"
        ));
    }
    if i64::from(stock) + live != i64::from(initial) {
        problems.push(format!(
            "SQL: stock {stock} + live {live} != initial {initial}"
        ));
    }
    if paid_mismatch != 0 || double_paid != 0 {
        problems.push(format!(
            "SQL: {paid_mismatch} orders whose status disagrees with their payments, {double_paid} paid twice"
        ));
    }
    if outbox != 0 {
        problems.push(format!("SQL: {outbox} returns still in the outbox"));
    }
    Ok(problems)
}

/// 'rebuy-{mode}': a one-unit sale, sold out; its buyer cancels through one
/// instance while another user keeps trying through the other: how long
/// until the returned unit is bought again there.
async fn rebuys(
    target: &Target,
    mode: SaleMode,
    args: &LifecycleArgs,
    first_user: i64,
) -> Result<Part, String> {
    let mut part = Part::new(format!("rebuy-{}", mode.name()));
    let admin = Admin::new(target);
    let caller = Caller::new(target, "", 16);
    let voucher = admin
        .create_sale(NewSale {
            mode,
            stock: 1,
            hours: 2,
            price_cents: PRICE_CENTS,
            pay_within_seconds: 900,
        })
        .await?;
    let count = i64::try_from(args.rebuys).unwrap_or(0) + 1;
    let tokens = admin.tokens(first_user, count).await?;
    let (code, body) = caller.buy(0, voucher, &tokens[0]).await;
    let mut holder = body["order_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or(format!("first purchase: {code} {body}"))?;
    let mut latency: Vec<Duration> = Vec::with_capacity(args.rebuys);
    let work = async {
        for round in 0..args.rebuys {
            let (from, to) = (round % 2, (round + 1) % 2);
            let token = &tokens[round + 1];
            // The waiter sees it sold out first (the other instance's flag).
            let (code, body) = caller.buy(to, voucher, token).await;
            if code != 409 || body["error"] != "sold_out" {
                return Err(format!("round {round}: before the cancel: {code} {body}"));
            }
            let cancelled = caller.cancel(from, &holder).await;
            let back = Instant::now();
            if !cancelled.is(200, "cancelled", None) {
                return Err(format!("round {round}: cancel: {}", cancelled.describe()));
            }
            loop {
                let (code, body) = caller.buy(to, voucher, token).await;
                if code == 200 || code == 202 {
                    holder = body["order_id"].as_str().unwrap_or_default().to_owned();
                    break;
                }
                if back.elapsed() > Duration::from_secs(5) {
                    return Err(format!(
                        "round {round}: not bought again within 5 s: {code} {body}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            latency.push(back.elapsed());
        }
        Ok(())
    };
    sampled(&mut part, target, &[voucher], work).await?;
    latency.sort();
    let ms = |d: Option<&Duration>| d.map_or(0.0, |d| (d.as_secs_f64() * 10_000.0).round() / 10.0);
    part.fact("rounds", args.rebuys);
    part.fact("bought_again_ms_p50", ms(latency.get(latency.len() / 2)));
    part.fact("bought_again_ms_max", ms(latency.last()));
    part.fact(
        "bought_again_ms_each",
        latency.iter().map(|d| ms(Some(d))).collect::<Vec<_>>(),
    );
    if latency.last().is_some_and(|d| *d > Duration::from_secs(1)) {
        part.problems.push(format!(
            "a returned unit took {} ms to sell again",
            ms(latency.last())
        ));
    }
    let end = wait_stored(&admin, voucher, Duration::from_secs(30), "stored").await?;
    if !end.conserved()
        || end.orders != 1
        || end.cancelled != i64::try_from(args.rebuys).unwrap_or(0)
    {
        part.problems.push(format!("at the end: {end:?}"));
    }
    Ok(part)
}

/// 'lateness': selling at full speed on both instances with a one-second
/// payment window, so orders expire all through the sale (their users buy
/// again): how late after `pay_by` each expiry was, from the rows.
async fn lateness(target: &Target, args: &LifecycleArgs, first_user: i64) -> Result<Part, String> {
    let mut part = Part::new("lateness");
    let admin = Admin::new(target);
    let voucher = admin
        .create_sale(NewSale {
            mode: SaleMode::Sync,
            stock: i64::from(i32::MAX),
            hours: 2,
            price_cents: PRICE_CENTS,
            pay_within_seconds: 1,
        })
        .await?;
    let users = i64::try_from(args.seconds).unwrap_or(1) * 2_000;
    let tokens = admin.shared_tokens(first_user, users).await?;
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
        &admin,
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
        .ok_or("lateness needs the service's database")?;
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
    let errors: u64 = tally
        .statuses
        .iter()
        .filter(|(k, _)| k.starts_with('5') || k.starts_with("error"))
        .map(|(_, n)| n)
        .sum();
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
async fn lateness_ms(url: &str, voucher: i64, due_by: DateTime<Utc>) -> Result<Lateness, String> {
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let (count, p50, p99, max): (i64, Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        "WITH l AS (SELECT extract(epoch FROM closed_at - pay_by)::float8 * 1000 AS ms
                    FROM voucher_orders WHERE voucher_id = $1 AND status = 'expired' AND pay_by <= $2)
         SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms) FROM l",
    )
    .bind(voucher)
    .bind(due_by)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
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
async fn mass_expiry(
    target: &Target,
    args: &LifecycleArgs,
    first_user: i64,
) -> Result<Part, String> {
    let mut part = Part::new("mass-expiry");
    let admin = Admin::new(target);
    let caller = Caller::new(target, "", 16);
    let url = target
        .database_url
        .as_deref()
        .ok_or("mass-expiry needs the service's database")?;
    let new_sale = |stock| NewSale {
        mode: SaleMode::Sync,
        stock,
        hours: 2,
        price_cents: PRICE_CENTS,
        pay_within_seconds: 86_400,
    };
    let expiring = admin.create_sale(new_sale(args.expiring)).await?;
    let other = admin.create_sale(new_sale(i64::from(i32::MAX))).await?;
    eprintln!("mass-expiry: minting {} tokens", args.expiring);
    let buyers = admin.shared_tokens(first_user, args.expiring).await?;
    let plan = target.purchases(expiring, &buyers, 1);
    let bought = target.send_each(plan, args.connections, "buy").await;
    if bought.count("200") != u64::try_from(args.expiring).unwrap_or(0) {
        return Err(format!("buying the expiring sale: {:?}", bought.statuses));
    }
    // The other voucher sells at a steady rate (an open load: latency is
    // not hidden by fewer requests sent), alone and then beside the expiry.
    let crowd = i64::try_from(args.seconds).unwrap_or(1) * i64::from(args.beside_rate);
    let before = admin
        .shared_tokens(first_user + args.expiring, crowd)
        .await?;
    let during = admin
        .shared_tokens(first_user + args.expiring + crowd, crowd)
        .await?;
    let baseline = paced(&caller, other, &before, args.beside_rate).await;
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let (due, moved): (DateTime<Utc>, i64) = sqlx::query_as(
        "WITH due AS (SELECT now() + interval '1 second' AS at),
              moved AS (UPDATE voucher_orders SET pay_by = (SELECT at FROM due)
                        WHERE voucher_id = $1 AND status = 'unpaid' RETURNING 1)
         SELECT (SELECT at FROM due), (SELECT count(*) FROM moved)",
    )
    .bind(expiring)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| format!("moving the deadlines: {e}"))?;
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
    let (first, last): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT min(closed_at), max(closed_at) FROM voucher_orders WHERE voucher_id = $1 AND status = 'expired'",
    )
    .bind(expiring)
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    let rows_seconds = match (first, last) {
        (Some(_), Some(last)) => (last - due).num_milliseconds() as f64 / 1000.0,
        _ => f64::NAN,
    };
    let rate = args.expiring as f64 / rows_seconds.max(0.001);
    part.fact("expiring", args.expiring);
    part.fact("expired", end.expired);
    part.fact(
        "all_expired_after_deadline_s",
        (rows_seconds * 1000.0).round() / 1000.0,
    );
    part.fact(
        "seen_all_back_after_deadline_s",
        (seconds * 1000.0).round() / 1000.0,
    );
    part.fact("expirations_per_sec", rate.round());
    let late = lateness_ms(url, expiring, Utc::now()).await?;
    part.fact("late_ms_p99", late.p99);
    // The concurrent voucher's p99 while the expiry ran, against the same
    // load alone.
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
    let during_expiry = window(&beside);
    let p99_alone = baseline.ms(0.99);
    let p99_beside = during_expiry.value_at_quantile(0.99) as f64 / 1000.0;
    part.fact(
        "other_voucher_p99_ms_alone",
        (p99_alone * 100.0).round() / 100.0,
    );
    part.fact(
        "other_voucher_p99_ms_during_expiry",
        (p99_beside * 100.0).round() / 100.0,
    );
    part.fact(
        "other_voucher_p99_ratio",
        ((p99_beside / p99_alone) * 100.0).round() / 100.0,
    );
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
