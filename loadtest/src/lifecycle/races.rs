//! Payments racing the deadline: orders bought at a steady rate, each paid,
//! paid and cancelled, cancelled early or left to expire, its calls landing
//! either side of `pay_by` and every notification delivered to both
//! instances; each order judged by the clocks, the books checked in SQL.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::{Admin, SaleMode, Stats};
use crate::drive::{self, Tally};
use crate::service::Target;

use super::{
    books, paced, priced_sale, sampled, wait_for, wait_stored, Answer, Caller, LifecycleArgs, Part,
    Stage,
};

/// Payments aimed this far (or further) before their deadline, and this
/// far after it, are counted apart: how many paid, how many were refunded
/// (the clocks, not the aim, judge each one; see `judge_race`).
const DECISIVE_MS: i64 = 100;

/// Payments and cancels land within this much of the deadline.
const RACE_SPREAD_MS: i64 = 150;

/// How far the service's sale clock may be from this driver's (the same
/// host's) when judging which side of a deadline a payment fell on.
const CLOCK_SLACK_MS: i64 = 25;

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
pub(super) async fn races(stage: &Stage<'_>, secret: &str, mode: SaleMode) -> anyhow::Result<Part> {
    let (target, admin, args) = (stage.target, &stage.admin, stage.args);
    let mut part = Part::new(format!("races-{}", mode.name()));
    let caller = Caller::new(target, secret, 1_000, args.quantity);
    let voucher = admin
        .create_sale(priced_sale(
            mode,
            args.races,
            args.quantity,
            args.pay_within,
        ))
        .await?;
    eprintln!("{}: minting {} tokens", part.name, args.races);
    let tokens = admin.shared_tokens(stage.first_user, args.races).await?;
    let work = race_all(&caller, admin, voucher, &tokens, args);
    let (tally, stored, outcomes, closed, took) =
        sampled(&mut part, target, &[voucher], work).await?;
    part.fact("orders", stored.orders);
    part.fact("purchase_statuses", json!(tally.statuses));
    part.fact(
        "deliveries_and_cancels_seconds",
        took.num_milliseconds() as f64 / 1000.0,
    );
    judge_races(&mut part, admin, voucher, &outcomes).await?;
    part.fact(
        "final",
        json!({ "paid": closed.paid, "cancelled": closed.cancelled, "expired": closed.expired, "stock": closed.stock }),
    );
    if closed.paid + closed.cancelled + closed.expired != args.races {
        part.problems.push(format!(
            "{} orders, but {} paid + {} cancelled + {} expired",
            args.races, closed.paid, closed.cancelled, closed.expired
        ));
    }
    if let Some(url) = &target.database_url {
        part.problems.extend(books(url, voucher).await?);
    }
    // Orders closed: each gave its units back, and is bought again whole.
    let returned = closed.cancelled + closed.expired;
    buy_again(
        &mut part,
        target,
        admin,
        voucher,
        returned,
        stage.first_user + args.races,
        args,
    )
    .await?;
    Ok(part)
}

/// The sale at `args.race_rate`, then every order played out around its
/// deadline; until every order is closed or paid.
async fn race_all(
    caller: &Caller,
    admin: &Admin,
    voucher: i64,
    tokens: &[Arc<str>],
    args: &LifecycleArgs,
) -> anyhow::Result<(Tally, Stats, Vec<RaceOutcome>, Stats, chrono::Duration)> {
    let tally = paced(caller, voucher, tokens, args.race_rate).await;
    let stored = wait_stored(admin, voucher, Duration::from_secs(120), "orders stored").await?;
    let orders = deadlines(caller, &tally.order_ids).await?;
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
        outcomes.push(done.context("a race task failed")?);
    }
    let closed = wait_for(
        admin,
        voucher,
        Duration::from_secs(30),
        "every order closed or paid",
        |s| s.unpaid == 0 && s.pending == 0,
    )
    .await?;
    Ok((tally, stored, outcomes, closed, Utc::now() - started))
}

/// Each race judged against its order's final status; the payments'
/// answer times and what came of the payments aimed well clear of the
/// deadline.
async fn judge_races(
    part: &mut Part,
    admin: &Admin,
    voucher: i64,
    outcomes: &[RaceOutcome],
) -> anyhow::Result<()> {
    let finals: HashMap<String, String> = admin
        .order_lines(voucher)
        .await?
        .into_iter()
        .map(|l| (l.order_id, l.status))
        .collect();
    let mut faults = Faults::default();
    let mut outcomes_by_role = BTreeMap::new();
    let (mut early, mut late) = ((0, 0), (0, 0));
    for o in outcomes {
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
    part.problems.extend(faults.into_problems());
    Ok(())
}

/// Every returned unit is for sale again, once: fresh buyers (from user
/// `first_user`) through the second instance get exactly that many.
async fn buy_again(
    part: &mut Part,
    target: &Target,
    admin: &Admin,
    voucher: i64,
    returned: i64,
    first_user: i64,
    args: &LifecycleArgs,
) -> anyhow::Result<()> {
    let extra = (returned / 10).max(10);
    let rebuyers = admin.shared_tokens(first_user, returned + extra).await?;
    let second: Arc<str> = target.bases[target.bases.len() - 1].as_str().into();
    let plan = rebuyers
        .iter()
        .map(|t| {
            let path = format!("/seckill/{voucher}");
            drive::Request::post_to(second.clone(), path, t.clone()).asking(args.quantity)
        })
        .collect();
    let again = target.send_each(plan, args.connections, "buy again").await;
    let sold_again = again.count("200") + again.count("202");
    part.fact("returned_units", returned * args.quantity);
    part.fact("bought_again", sold_again);
    part.fact("buy_again_statuses", json!(again.statuses));
    if sold_again != u64::try_from(returned).unwrap_or(0) {
        part.problems.push(format!(
            "{returned} orders' units came back but {sold_again} orders were sold again"
        ));
    }
    let end = wait_stored(
        admin,
        voucher,
        Duration::from_secs(60),
        "rebought orders stored",
    )
    .await?;
    if !end.conserved() || end.stock != 0 {
        part.problems.push(format!("after buying again: {end:?}"));
    }
    Ok(())
}

/// Each order's deadline, read as the admin (64 reads at a time).
async fn deadlines(
    caller: &Caller,
    ids: &[String],
) -> anyhow::Result<Vec<(String, DateTime<Utc>)>> {
    let permits = Arc::new(Semaphore::new(64));
    let mut set = JoinSet::new();
    for id in ids {
        let (caller, id, permits) = (caller.clone(), id.clone(), permits.clone());
        set.spawn(async move {
            let _permit = permits.acquire().await?;
            let url = format!("{}/orders/{id}", caller.bases[0]);
            let order: Value = caller
                .client
                .get(url)
                .bearer_auth(&*caller.admin_token)
                .send()
                .await?
                .json()
                .await?;
            let pay_by = order["pay_by"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .with_context(|| format!("order {id} has no pay_by: {order}"))?;
            Ok::<_, anyhow::Error>((id, pay_by.with_timezone(&Utc)))
        });
    }
    let mut out = Vec::with_capacity(ids.len());
    while let Some(done) = set.join_next().await {
        out.push(done??);
    }
    Ok(out)
}
