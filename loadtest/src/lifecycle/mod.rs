//! `loadtest lifecycle`: what happens to orders after the grab, on two
//! instances: payments racing the deadline (every notification delivered
//! twice, once to each instance), cancels racing the expiry, returned units
//! sold again, a whole sale expiring at once; conservation sampled all along.
//!
//! The parts in their own files: [`races`](mod@races) (payments and
//! cancels racing the deadline), [`rebuys`](mod@rebuys) (a returned unit
//! bought again), [`expiry`] (lateness under load, a whole sale at once).
//! This file holds what they share: the two-instance caller, conservation
//! sampling, the waits, the paced buyers and the books' check in SQL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::{json, Map, Value};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinSet;

use crate::api::{Admin, NewSale, SaleMode, Stats};
use crate::drive::{self, Tally};
use crate::service::Target;
use crate::table::Table;

mod expiry;
mod races;
mod rebuys;

use expiry::{lateness, mass_expiry};
use races::races;
use rebuys::rebuys;

/// What every lifecycle voucher costs, in cents.
const PRICE_CENTS: i64 = 1999;

/// A two-hour sale for `orders` orders of `units` units each at the
/// lifecycle's price a unit, each order paid within `pay_within_seconds`.
fn priced_sale(mode: SaleMode, orders: i64, units: i64, pay_within_seconds: i64) -> NewSale {
    let stock = orders.saturating_mul(units).min(i64::from(i32::MAX));
    NewSale {
        price_cents: PRICE_CENTS,
        pay_within_seconds,
        ..NewSale::free(mode, stock, 2).allowing(units)
    }
}

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
    /// Units every order of the races and rebuys asks for (and pays, and
    /// gives back when it closes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=100))]
    pub quantity: i64,
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

/// What every part starts from: the service and its admin, the run's
/// options, and the first of the part's own users.
struct Stage<'a> {
    target: &'a Target,
    admin: Admin,
    args: &'a LifecycleArgs,
    first_user: i64,
}

/// Runs every part on a two-instance service started with a payment
/// secret; prints each part and one JSON line. `Ok(false)`: a promise broke.
pub async fn run(target: &Target, secret: &str, args: &LifecycleArgs) -> anyhow::Result<bool> {
    let mut parts = Vec::new();
    let mut part_no = 0;
    let mut stage = || {
        part_no += 1;
        Stage {
            target,
            admin: target.admin(),
            args,
            first_user: part_no * USERS_PER_PART + 1,
        }
    };
    let wanted = |part: &str| args.part.is_empty() || args.part.iter().any(|p| p == part);
    for mode in [SaleMode::Sync, SaleMode::Async] {
        if wanted("races") {
            parts.push(races(&stage(), secret, mode).await?);
            print_part(parts.last().expect("just pushed"));
        }
        if wanted("rebuy") {
            parts.push(rebuys(&stage(), mode).await?);
            print_part(parts.last().expect("just pushed"));
        }
    }
    if wanted("lateness") {
        parts.push(lateness(&stage()).await?);
        print_part(parts.last().expect("just pushed"));
    }
    if wanted("mass-expiry") {
        parts.push(mass_expiry(&stage()).await?);
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
    /// Units each purchase asks for (and each payment pays for).
    units: i64,
}

impl Caller {
    fn new(target: &Target, secret: &str, connections: usize, units: i64) -> Self {
        Self {
            client: drive::client(connections),
            bases: target.bases.clone().into(),
            admin_token: target.admin_token.as_str().into(),
            secret: secret.into(),
            units,
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
        let amount = PRICE_CENTS * self.units;
        let body =
            json!({ "payment_id": payment_id, "order_id": order_id, "amount_cents": amount })
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

    /// A purchase of [`Caller::units`] by `token`'s user on instance `i`:
    /// its status code.
    async fn buy(&self, i: usize, voucher: i64, token: &str) -> (u16, Value) {
        let url = format!("{}/seckill/{voucher}", self.bases[i % self.bases.len()]);
        let mut request = self.client.post(url).bearer_auth(token);
        if self.units != 1 {
            request = request.json(&json!({ "quantity": self.units }));
        }
        match request.send().await {
            Ok(r) => {
                let code = r.status().as_u16();
                (code, r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }
}

/// Conservation sampled until `stop`: `stock + units = initial_stock`
/// (units of the pending, unpaid and paid orders) in every snapshot, taken from both instances in turn.
async fn sample_conservation(
    target: &Target,
    vouchers: &[i64],
    stop: &AtomicBool,
) -> (u64, Vec<String>) {
    let admins: Vec<Admin> = (0..target.bases.len().max(1))
        .map(|i| target.admin_on(i))
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
    admin: &Admin,
    voucher: i64,
    limit: Duration,
    what: &str,
    done: impl Fn(&Stats) -> bool,
) -> anyhow::Result<Stats> {
    let (stats, done) = admin.stats_until(voucher, limit, done).await?;
    anyhow::ensure!(done, "{what}: not within {limit:?}: {stats:?}");
    Ok(stats)
}

/// Waits until every accepted order of the voucher is stored (nothing
/// `pending`; at once for a sync sale).
async fn wait_stored(
    admin: &Admin,
    voucher: i64,
    limit: Duration,
    what: &str,
) -> anyhow::Result<Stats> {
    wait_for(admin, voucher, limit, what, |s| s.pending == 0).await
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
        let request =
            drive::Request::post_to(base.clone(), path.clone(), token.clone()).asking(caller.units);
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

/// The books in SQL: every closed order gave its units back once, every
/// paid order has exactly one accepted payment and no other order has one,
/// no return is left in the outbox.
async fn books(url: &str, voucher: i64) -> anyhow::Result<Vec<String>> {
    let mut conn = PgConnection::connect(url).await?;
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
            (SELECT coalesce(sum(quantity), 0)::bigint FROM voucher_orders
               WHERE voucher_id = $1 AND status IN ('unpaid', 'paid')),
            (SELECT coalesce(sum(quantity), 0)::bigint FROM voucher_orders
               WHERE voucher_id = $1 AND status IN ('cancelled', 'expired')),
            (SELECT count(*) FROM voucher_orders o WHERE o.voucher_id = $1
               AND (o.status = 'paid') <> EXISTS (SELECT 1 FROM payments p WHERE p.order_id = o.id AND NOT p.refund)),
            (SELECT count(*) FROM (SELECT p.order_id FROM payments p JOIN voucher_orders o ON o.id = p.order_id
               WHERE o.voucher_id = $1 AND NOT p.refund GROUP BY p.order_id HAVING count(*) > 1) twice),
            (SELECT count(*) FROM stock_returns WHERE voucher_id = $1)
         FROM seckill_vouchers s WHERE s.voucher_id = $1",
    )
    .bind(voucher)
    .fetch_one(&mut conn)
    .await?;
    let mut problems = Vec::new();
    if returned != closed {
        problems.push(format!(
            "SQL: closed orders held {closed} units, {returned} units returned"
        ));
    }
    if i64::from(stock) + live != i64::from(initial) {
        problems.push(format!(
            "SQL: stock {stock} + live units {live} != initial {initial}"
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
