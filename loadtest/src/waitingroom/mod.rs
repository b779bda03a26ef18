//! `loadtest waitingroom`: a sale behind a waiting room, on instances of its
//! own: a crowd that joins before the start, a second one that joins after
//! it in a known order, bots that join again and again, everyone polling as
//! told and buying once admitted. Judges the room's fairness (join time
//! against place), its pace (admissions per second against
//! `admit_per_second`), that nobody buys without an admission, what a poll
//! costs the service beside `/healthz`, and what proof of work costs a
//! client.

mod client;
mod cost;
mod figures;
mod lines;
mod proof;
mod report;
mod room;
mod stats;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::{json, Value};

use crate::api::Admin;
use crate::drive::Tally;
use crate::invariants::{check, Check};
use crate::service::Target;
use crate::TargetArgs;
use client::live;
use cost::poll_cost;
use figures::Figures;
use lines::thousands;
use proof::{proof_check, proof_table};
use report::Outcome;
use room::{Client, Kind, Room, Seen};

#[derive(Args, Clone)]
pub struct WaitingRoomArgs {
    /// Users who join before the start (the room places them at random
    /// at the start), spread over the seconds before it.
    #[arg(long, default_value_t = 20_000)]
    pub prequeue: i64,
    /// Users who join after the start, one after another in a known order
    /// (the room places them in order of arrival).
    #[arg(long, default_value_t = 2_000)]
    pub later: i64,
    /// Seconds after the start over which the later users join.
    #[arg(long, default_value_t = 3.0)]
    pub later_over: f64,
    /// Bots: users who join first, then join again `--bot-repeats` times
    /// each, ten at once, until two seconds past the start.
    #[arg(long, default_value_t = 50)]
    pub bots: i64,
    /// Joins each bot sends after its first.
    #[arg(long, default_value_t = 100)]
    pub bot_repeats: usize,
    /// The room's `admit_per_second`.
    #[arg(long, default_value_t = 200)]
    pub admit_per_second: i64,
    /// Units on sale.
    #[arg(long, default_value_t = 1_000)]
    pub stock: i64,
    /// Seconds from the voucher's creation to its start: the pre-queue
    /// joins over all of them but the first half second and the last two.
    #[arg(long, default_value_t = 10)]
    pub lead: u64,
    /// Longest the room runs after the start: clients still waiting then
    /// stop, and are counted.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Instances of the service (sharing the database, Redis and the token
    /// key); each client's requests take turns over them.
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Requests in flight at once over every client, and so at most as
    /// many connections to each instance.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    /// Users (evenly spread over both crowds) who also try to buy without
    /// an admission: with no ticket and with their waiting ticket, before
    /// and after the start, and with another user's admitted ticket.
    #[arg(long, default_value_t = 200)]
    pub probes: i64,
    /// Polls of a room of its own, and as many `/healthz` before and after,
    /// whose service CPU is weighed (0: no such phase).
    #[arg(long, default_value_t = 20_000)]
    pub cpu_polls: usize,
    /// Difficulties (zero bits) of the proof-of-work cost table.
    #[arg(long, value_delimiter = ',', default_values_t = [0_u32, 8, 12, 16, 20])]
    pub pow_bits: Vec<u32>,
    /// Seconds each difficulty of the table is solved for (at least once).
    #[arg(long, default_value_t = 2.0)]
    pub pow_seconds: f64,
    /// `proof_of_work_bits` of the room whose join with proof is checked.
    #[arg(long, default_value_t = 12)]
    pub proof_bits: u32,
}

/// Starts the instances, runs the room, weighs a poll and proof of work;
/// `Ok(false)` when an invariant broke, a purchase without an admission
/// succeeded (or was answered other than `403 not_admitted`), a user held
/// two places, two users one, or a join with proof was refused.
pub async fn run(target: &TargetArgs, args: &WaitingRoomArgs) -> anyhow::Result<bool> {
    target.starts_its_own("waitingroom starts its own instances")?;
    if args.prequeue < 3 || args.later < 3 || args.lead < 3 || args.admit_per_second < 1 {
        anyhow::bail!("waitingroom needs --prequeue and --later of 3 or more, --lead of 3 s or more and --admit-per-second of 1 or more");
    }
    // One address sends the whole crowd, and a bot joins a hundred times:
    // the limits would judge the driver, not the room (a started service
    // has them off).
    target
        .launch(args.instances.max(1), Vec::new())
        .run(async |service| scenario(service, args).await)
        .await
}

/// The sale, the room and its crowd, then the phases that weigh a poll
/// and proof of work; the report printed last.
async fn scenario(target: &Target, args: &WaitingRoomArgs) -> anyhow::Result<bool> {
    let admin = target.admin();
    let users = args.prequeue + args.bots + args.later;
    eprintln!("waitingroom: minting {} tokens", thousands(users));
    let tokens = admin.shared_tokens(1, users).await?;

    let created = Utc::now();
    let (voucher, start) = open_sale(&admin, args, created).await?;
    let room = Arc::new(Room::new(target, args, voucher, start, users)?);
    let clients = plan(args, &tokens, start);
    let probes = clients.iter().filter(|c| c.probe).count();
    let seen = crowd(&room, clients).await?;
    let ran_for = room.secs(Instant::now());
    let (buys, sold_out_at, invariants) =
        settle(target, &admin, &room, &seen, args.stock.min(users), created).await?;

    let cost = if args.cpu_polls > 0 {
        eprintln!("waitingroom: weighing a poll's CPU beside /healthz");
        Some(poll_cost(target, &admin, &tokens, args).await?)
    } else {
        None
    };
    eprintln!("waitingroom: proof of work");
    let proof_check = proof_check(&admin, &target.base, &tokens, args).await?;
    let proofs = proof_table(voucher, &args.pow_bits, args.pow_seconds).await?;

    let figures = Figures::of(&room, &seen, &buys, sold_out_at, ran_for, probes);
    let outcome = Outcome {
        voucher,
        instances: target.bases.len(),
        lines: figures.lines(args, cost.as_ref(), &invariants),
        figures,
        buys,
        sold_out_at,
        invariants,
        cost,
        proof_check,
        proofs,
    };
    Ok(outcome.print(args))
}

/// A voucher behind a room that starts `--lead` seconds after `created`;
/// its id, and its start on this clock.
async fn open_sale(
    admin: &Admin,
    args: &WaitingRoomArgs,
    created: DateTime<Utc>,
) -> anyhow::Result<(i64, Instant)> {
    let begin = created + chrono::Duration::seconds(args.lead as i64);
    let voucher = admin
        .create_voucher_from(&json!({
            "title": "load test: waiting room",
            "stock": args.stock,
            "begin_time": begin,
            "end_time": begin + chrono::Duration::hours(1),
            "waiting_room": { "admit_per_second": args.admit_per_second },
        }))
        .await?;
    let start = Instant::now()
        + (begin - Utc::now())
            .to_std()
            .context("the voucher's start passed while it was created: raise --lead")?;
    Ok((voucher, start))
}

/// A one-unit voucher on sale since `since` ago, behind a room of its own
/// (`room`: the room's settings).
async fn side_room(
    admin: &Admin,
    title: &str,
    since: chrono::Duration,
    room: Value,
) -> anyhow::Result<i64> {
    let now = Utc::now();
    admin
        .create_voucher_from(&json!({
            "title": title,
            "stock": 1,
            "begin_time": now - since,
            "end_time": now + chrono::Duration::hours(1),
            "waiting_room": room,
        }))
        .await
}

/// Every client's run, with a progress line each second; what each saw.
async fn crowd(room: &Arc<Room>, clients: Vec<Client>) -> anyhow::Result<Vec<Seen>> {
    let handles: Vec<_> = clients
        .into_iter()
        .map(|client| tokio::spawn(live(room.clone(), client)))
        .collect();
    let ticker = {
        let room = room.clone();
        tokio::spawn(async move {
            let mut last_polls = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let polls = room.polled.load(Ordering::Relaxed);
                let now = room.secs(Instant::now());
                room.progress.set_message(format!(
                    "{} {:.0} s, joins {}, polls {} ({}/s), serving {}, bought {}",
                    if now < 0.0 { "start in" } else { "started" },
                    now.abs(),
                    room.joined.load(Ordering::Relaxed),
                    polls,
                    polls - last_polls,
                    room.serving.load(Ordering::Relaxed),
                    room.bought.load(Ordering::Relaxed),
                ));
                last_polls = polls;
            }
        })
    };
    let mut seen = Vec::with_capacity(handles.len());
    for handle in handles {
        seen.push(handle.await.context("a client panicked")?);
    }
    ticker.abort();
    room.progress.finish_and_clear();
    Ok(seen)
}

/// The purchases, when an answer first said sold out, and the sale's
/// invariants (`expected` orders once sold out), which count an order of
/// a user the room never admitted as broken.
async fn settle(
    target: &Target,
    admin: &Admin,
    room: &Room,
    seen: &[Seen],
    expected: i64,
    created: DateTime<Utc>,
) -> anyhow::Result<(Tally, Option<f64>, Check)> {
    let buys = std::mem::replace(
        &mut *room.buys.lock().expect("no client panicked"),
        Tally::new(),
    );
    let sold_out_at = *room.sold_out_at.lock().expect("no client panicked");
    let expected = sold_out_at.map(|_| expected);
    let voucher = room.voucher;
    let mut invariants = check(target, voucher, &buys, created.timestamp(), expected, 0).await?;
    let admitted: BTreeSet<i64> = seen.iter().filter(|s| s.admitted).map(|s| s.user).collect();
    let unadmitted_orders = admin
        .orders(voucher)
        .await?
        .iter()
        .filter(|(_, user)| !admitted.contains(user))
        .count();
    if unadmitted_orders > 0 {
        invariants.problems.push(format!(
            "{unadmitted_orders} orders of users the room never admitted"
        ));
    }
    Ok((buys, sold_out_at, invariants))
}

/// Every client, when it joins: the bots first, then the pre-queue evenly
/// over the seconds before the start (in order of user id), then the later
/// crowd evenly over `--later-over` seconds from half a second past it.
fn plan(args: &WaitingRoomArgs, tokens: &[Arc<str>], start: Instant) -> Vec<Client> {
    let lead = Duration::from_secs(args.lead);
    let opens = start - lead + Duration::from_millis(500);
    let window = lead.saturating_sub(Duration::from_millis(2_500));
    let every = |n: i64, over: Duration| over / u32::try_from(n.max(1)).unwrap_or(u32::MAX);
    let probe_every = if args.probes > 0 {
        ((args.prequeue + args.later) / args.probes).max(1)
    } else {
        i64::MAX
    };
    let mut clients = Vec::with_capacity(tokens.len());
    let mut crowd_index = 0;
    for (i, token) in tokens.iter().enumerate() {
        let user = i as i64 + 1;
        let (kind, join_at) = if user <= args.bots {
            // Early: they have the most time to repeat their joins.
            let at = opens - Duration::from_millis(300)
                + every(args.bots, Duration::from_millis(200)) * (user - 1) as u32;
            (Kind::Bot, at)
        } else if user <= args.bots + args.prequeue {
            let n = user - args.bots - 1;
            (Kind::Early, opens + every(args.prequeue, window) * n as u32)
        } else {
            let n = user - args.bots - args.prequeue - 1;
            let over = Duration::from_secs_f64(args.later_over.max(0.0));
            (
                Kind::Later,
                start + Duration::from_millis(500) + every(args.later, over) * n as u32,
            )
        };
        let probe = kind != Kind::Bot && {
            crowd_index += 1;
            crowd_index % probe_every == 0
        };
        clients.push(Client {
            user,
            token: token.clone(),
            kind,
            join_at,
            probe,
        });
    }
    clients
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_puts_bots_first_the_prequeue_before_the_start_and_the_later_crowd_after() {
        let args = WaitingRoomArgs {
            prequeue: 100,
            later: 20,
            later_over: 2.0,
            bots: 5,
            bot_repeats: 100,
            admit_per_second: 200,
            stock: 10,
            lead: 6,
            seconds: 30,
            instances: 2,
            connections: 10,
            probes: 12,
            cpu_polls: 0,
            pow_bits: vec![],
            pow_seconds: 0.0,
            proof_bits: 4,
        };
        let tokens: Vec<Arc<str>> = (0..125).map(|i| Arc::from(format!("t{i}"))).collect();
        let start = Instant::now() + Duration::from_secs(6);
        let clients = plan(&args, &tokens, start);
        let of = |kind| clients.iter().filter(move |c| c.kind == kind);
        assert_eq!(of(Kind::Bot).count(), 5);
        assert_eq!(of(Kind::Early).count(), 100);
        assert_eq!(of(Kind::Later).count(), 20);
        let first_early = of(Kind::Early).map(|c| c.join_at).min().unwrap();
        assert!(of(Kind::Bot).all(|c| c.join_at < first_early));
        assert!(of(Kind::Early).all(|c| c.join_at + Duration::from_secs(2) <= start));
        assert!(of(Kind::Later).all(|c| c.join_at > start));
        let later: Vec<Instant> = of(Kind::Later).map(|c| c.join_at).collect();
        assert!(later.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(clients.iter().filter(|c| c.probe).count(), 12);
        assert!(clients.iter().all(|c| !(c.probe && c.kind == Kind::Bot)));
    }
}
