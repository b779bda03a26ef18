//! `loadtest waitingroom`: a sale behind a waiting room, on instances of its
//! own: a crowd that joins before the start, a second one that joins after
//! it in a known order, bots that join again and again, everyone polling as
//! told and buying once admitted. Judges the room's fairness (join time
//! against place), its pace (admissions per second against
//! `admit_per_second`), that nobody buys without an admission, what a poll
//! costs the service beside `/healthz`, and what proof of work costs a
//! client.

use seckill::domain::{UserId, VoucherId};
use seckill::seckill::proof_holds;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Args;
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::api::Admin;
use crate::cpu::Usage;
use crate::drive::Tally;
use crate::invariants::{check, Check};
use crate::service::Target;
use crate::table::Table;
use crate::TargetArgs;

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

/// Which crowd a client belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Early,
    Bot,
    Later,
}

/// One client's part in the run.
struct Client {
    user: i64,
    token: Arc<str>,
    kind: Kind,
    join_at: Instant,
    /// Also tries to buy without an admission.
    probe: bool,
}

/// How a client's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Bought,
    /// Admitted, but the units were gone.
    SoldOutAdmitted,
    /// Told `sold_out` by the room while waiting.
    SoldOut,
    /// Still waiting at `--seconds` after the start.
    Capped,
    /// A purchase with an admitted ticket answered otherwise.
    Refused(String),
    /// The room kept failing to answer.
    Failed(String),
}

/// What one client saw.
struct Seen {
    user: i64,
    kind: Kind,
    /// Seconds from the start to its first join's sending (negative before).
    joined: Option<f64>,
    /// Its first join already had a place: it reached the room after the
    /// start.
    placed_at_join: bool,
    /// Its first place.
    place: Option<i64>,
    /// Every place any answer gave it.
    places: BTreeSet<i64>,
    /// Joins it sent (a bot's repeats included).
    joins: u64,
    polls: u64,
    admitted: bool,
    end: End,
}

/// An answer, as one client needs it.
struct Reply {
    status: u16,
    body: Value,
    retry_after: Option<u64>,
    /// Seconds from the start when it was sent, and when its answer came.
    sent: f64,
    got: f64,
    micros: u64,
    error: Option<&'static str>,
}

impl Reply {
    fn ok(&self) -> bool {
        self.error.is_none() && (200..300).contains(&self.status)
    }

    /// `"200"`, `"403 not_admitted"`, `"error: timeout"`, as the load
    /// engine counts answers.
    fn key(&self) -> String {
        match self.error {
            Some(error) => format!("error: {error}"),
            None if self.ok() => self.status.to_string(),
            None => format!(
                "{} {}",
                self.status,
                self.body["error"].as_str().unwrap_or("?")
            ),
        }
    }

    /// When to ask again: as told, else after a second.
    fn wait(&self) -> Duration {
        Duration::from_secs(self.retry_after.unwrap_or(1))
    }
}

/// The queue body's fields this run reads.
struct Queue {
    ticket: String,
    status: String,
    place: Option<i64>,
    serving: i64,
}

impl Queue {
    fn read(body: &Value) -> Option<Self> {
        Some(Self {
            ticket: body["ticket"].as_str()?.to_owned(),
            status: body["status"].as_str()?.to_owned(),
            place: body["place"].as_i64(),
            serving: body["serving"].as_i64()?,
        })
    }
}

/// What every client shares: the connections, the clock and the tallies.
struct Room {
    http: reqwest::Client,
    /// Requests in flight at once.
    gate: Semaphore,
    bases: Vec<String>,
    voucher: i64,
    start: Instant,
    deadline: Instant,
    bot_repeats: usize,
    /// (seconds from the start, halfway between sending and answer;
    /// `serving`) of every answer that had a place.
    readings: Mutex<Vec<(f64, i64)>>,
    /// Polls answered, by the second after the start they were sent in.
    polls_by_second: Mutex<Vec<u64>>,
    /// Queue answers by route and status.
    answers: Mutex<BTreeMap<String, u64>>,
    /// Purchases, the probes' included.
    buys: Mutex<Tally>,
    /// The probes' purchases by answer.
    probes: Mutex<BTreeMap<String, u64>>,
    /// Seconds from the start when an answer first said sold out.
    sold_out_at: Mutex<Option<f64>>,
    /// The last admitted ticket seen, and its user: what a probe tries
    /// as someone else's.
    admitted_ticket: Mutex<Option<(i64, String)>>,
    joined: AtomicU64,
    polled: AtomicU64,
    bought: AtomicU64,
    serving: AtomicI64,
    progress: ProgressBar,
}

impl Room {
    /// Seconds from the start to `at` (negative before it).
    fn secs(&self, at: Instant) -> f64 {
        if at >= self.start {
            at.duration_since(self.start).as_secs_f64()
        } else {
            -self.start.duration_since(at).as_secs_f64()
        }
    }

    /// The instance of a client's `k`th request: requests take turns, as
    /// a load balancer would send them, so a ticket from one instance is
    /// used on the other.
    fn base(&self, user: i64, k: u64) -> &str {
        let n = self.bases.len() as u64;
        &self.bases[((user as u64).wrapping_add(k) % n) as usize]
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        let sent = Instant::now();
        let (status, body, retry_after, error) = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok());
                match response.bytes().await {
                    Ok(bytes) => (
                        status,
                        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                        retry_after,
                        None,
                    ),
                    Err(_) => (status, Value::Null, None, Some("transport")),
                }
            }
            Err(e) if e.is_timeout() => (0, Value::Null, None, Some("timeout")),
            Err(e) if e.is_connect() => (0, Value::Null, None, Some("connect")),
            Err(_) => (0, Value::Null, None, Some("transport")),
        };
        let got = Instant::now();
        Reply {
            status,
            body,
            retry_after,
            sent: self.secs(sent),
            got: self.secs(got),
            micros: u64::try_from(got.duration_since(sent).as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
            error,
        }
    }

    async fn join(&self, base: &str, token: &str) -> Reply {
        let url = format!("{base}/vouchers/{}/queue", self.voucher);
        let reply = self.send(self.http.post(url).bearer_auth(token)).await;
        self.joined.fetch_add(1, Ordering::Relaxed);
        self.saw("join", &reply);
        reply
    }

    async fn poll(&self, base: &str, token: &str, ticket: &str) -> Reply {
        let url = format!("{base}/vouchers/{}/queue", self.voucher);
        let request = self
            .http
            .get(url)
            .bearer_auth(token)
            .header("x-queue-ticket", ticket);
        let reply = self.send(request).await;
        self.polled.fetch_add(1, Ordering::Relaxed);
        if reply.sent >= 0.0 {
            let second = reply.sent as usize;
            let mut polls = self.polls_by_second.lock().expect("no client panicked");
            if polls.len() <= second {
                polls.resize(second + 1, 0);
            }
            polls[second] += 1;
        }
        self.saw("poll", &reply);
        reply
    }

    /// A purchase, with `ticket` as `X-Queue-Ticket` if any.
    async fn buy(&self, base: &str, token: &str, ticket: Option<&str>) -> Reply {
        let mut request = self
            .http
            .post(format!("{base}/seckill/{}", self.voucher))
            .bearer_auth(token);
        if let Some(ticket) = ticket {
            request = request.header("x-queue-ticket", ticket);
        }
        let reply = self.send(request).await;
        let key = reply.key();
        if key == "409 sold_out" {
            self.sold_out(reply.sent);
        }
        if reply.ok() {
            self.bought.fetch_add(1, Ordering::Relaxed);
        }
        let mut buys = self.buys.lock().expect("no client panicked");
        buys.requests += 1;
        buys.latency.saturating_record(reply.micros);
        if let Some(order) = reply.body["order_id"].as_str().filter(|_| reply.ok()) {
            buys.order_ids.push(order.to_owned());
        }
        *buys.statuses.entry(key).or_default() += 1;
        drop(buys);
        reply
    }

    /// A purchase that must be refused: its answer counted apart.
    async fn probe(&self, base: &str, token: &str, ticket: Option<&str>) {
        let reply = self.buy(base, token, ticket).await;
        *self
            .probes
            .lock()
            .expect("no client panicked")
            .entry(reply.key())
            .or_default() += 1;
    }

    fn sold_out(&self, at: f64) {
        let mut first = self.sold_out_at.lock().expect("no client panicked");
        if first.is_none_or(|t| at < t) {
            *first = Some(at);
        }
    }

    /// Counts a queue answer, and keeps the serving counter it shows.
    fn saw(&self, route: &str, reply: &Reply) {
        let queue = reply.ok().then(|| Queue::read(&reply.body)).flatten();
        let key = match &queue {
            Some(q) => format!("{route} {} {}", reply.status, q.status),
            None => format!("{route} {}", reply.key()),
        };
        *self
            .answers
            .lock()
            .expect("no client panicked")
            .entry(key)
            .or_default() += 1;
        let Some(queue) = queue else { return };
        // Placed: the room's script ran after the start by Redis's clock.
        if queue.place.is_some() {
            let halfway = (reply.sent + reply.got) / 2.0;
            self.readings
                .lock()
                .expect("no client panicked")
                .push((halfway, queue.serving));
            self.serving.fetch_max(queue.serving, Ordering::Relaxed);
        }
        if queue.status == "sold_out" {
            self.sold_out(reply.sent);
        }
    }
}

impl Seen {
    fn new(client: &Client) -> Self {
        Self {
            user: client.user,
            kind: client.kind,
            joined: None,
            placed_at_join: false,
            place: None,
            places: BTreeSet::new(),
            joins: 0,
            polls: 0,
            admitted: false,
            end: End::Capped,
        }
    }

    fn placed(&mut self, place: Option<i64>) {
        if let Some(place) = place {
            self.place.get_or_insert(place);
            self.places.insert(place);
        }
    }
}

/// One client from its join to its purchase (or the sell-out, or the cap),
/// asking again when `Retry-After` says.
async fn live(room: Arc<Room>, client: Client) -> Seen {
    let mut seen = Seen::new(&client);
    let token = &*client.token;
    let mut sent: u64 = 0;
    let mut ticket: Option<String> = None;
    let mut failures = 0;
    let mut next = client.join_at;
    let mut hammer = None;
    let (mut probed_before, mut probed_after) = (!client.probe, !client.probe);
    loop {
        if next >= room.deadline {
            seen.end = End::Capped;
            break;
        }
        tokio::time::sleep_until(next.into()).await;
        let base = room.base(client.user, sent);
        sent += 1;
        let reply = match &ticket {
            None => {
                seen.joins += 1;
                let reply = room.join(base, token).await;
                if seen.joined.is_none() {
                    seen.joined = Some(reply.sent);
                }
                reply
            }
            Some(ticket) => {
                seen.polls += 1;
                room.poll(base, token, ticket).await
            }
        };
        let Some(queue) = reply.ok().then(|| Queue::read(&reply.body)).flatten() else {
            failures += 1;
            if failures >= 10 {
                seen.end = End::Failed(reply.key());
                break;
            }
            next = Instant::now() + reply.wait();
            continue;
        };
        if ticket.is_none() {
            seen.placed_at_join = queue.place.is_some();
            if client.kind == Kind::Bot {
                hammer = Some(tokio::spawn(hammer_joins(
                    room.clone(),
                    client.token.clone(),
                )));
            }
        }
        seen.placed(queue.place);
        ticket = Some(queue.ticket.clone());
        match queue.status.as_str() {
            "admitted" => {
                seen.admitted = true;
                *room.admitted_ticket.lock().expect("no client panicked") =
                    Some((client.user, queue.ticket.clone()));
                seen.end = buy(&room, client.user, token, &queue.ticket, &mut sent).await;
                break;
            }
            "sold_out" => {
                seen.end = End::SoldOut;
                break;
            }
            _ => {}
        }
        // Waiting: a purchase now must be refused, whatever it carries.
        let now_placed = queue.place.is_some();
        if (!probed_before && !now_placed) || (!probed_after && now_placed) {
            let base = room.base(client.user, sent);
            sent += 1;
            room.probe(base, token, None).await;
            room.probe(base, token, Some(&queue.ticket)).await;
            if now_placed {
                probed_after = true;
                let other = room
                    .admitted_ticket
                    .lock()
                    .expect("no client panicked")
                    .clone();
                if let Some((_, other)) = other.filter(|(user, _)| *user != client.user) {
                    room.probe(base, token, Some(&other)).await;
                }
            } else {
                probed_before = true;
            }
        }
        next = Instant::now() + reply.wait();
    }
    if let Some(hammer) = hammer {
        if let Ok((joins, places)) = hammer.await {
            seen.joins += joins;
            seen.places.extend(places);
        }
    }
    room.progress.inc(1);
    seen
}

/// An admitted client buys, once; what the service could not answer is
/// asked again, as told.
async fn buy(room: &Room, user: i64, token: &str, ticket: &str, sent: &mut u64) -> End {
    for _ in 0..5 {
        let base = room.base(user, *sent);
        *sent += 1;
        let reply = room.buy(base, token, Some(ticket)).await;
        match reply.key().as_str() {
            "200" => return End::Bought,
            "409 sold_out" => return End::SoldOutAdmitted,
            key if key.starts_with("error") || key.starts_with("503") || key.starts_with("429") => {
                tokio::time::sleep(reply.wait()).await;
            }
            key => return End::Refused(key.to_owned()),
        }
    }
    End::Failed("purchase unanswered".into())
}

/// A bot's joins after its first: ten at once, in bursts spread until two
/// seconds past the start, so that some land before the room places
/// anyone and some after. Its joins and the places they gave.
async fn hammer_joins(room: Arc<Room>, token: Arc<str>) -> (u64, BTreeSet<i64>) {
    const AT_ONCE: usize = 10;
    let bursts = room.bot_repeats.div_ceil(AT_ONCE).max(1);
    let from = Instant::now();
    let until = (room.start + Duration::from_secs(2)).max(from);
    let step = until.duration_since(from) / bursts as u32;
    let mut places = BTreeSet::new();
    let mut joins = 0;
    let mut left = room.bot_repeats;
    for burst in 0..bursts {
        tokio::time::sleep_until((from + step * burst as u32).into()).await;
        let size = left.min(AT_ONCE);
        left -= size;
        let replies = futures_util::future::join_all((0..size).map(|j| {
            let base = room.base(j as i64, burst as u64);
            room.join(base, &token)
        }))
        .await;
        joins += size as u64;
        places.extend(
            replies
                .iter()
                .filter(|r| r.ok())
                .filter_map(|r| r.body["place"].as_i64()),
        );
    }
    (joins, places)
}

/// Spearman's rank correlation of the pairs (ties take their mean rank);
/// NaN with fewer than three.
fn spearman(pairs: &[(f64, f64)]) -> f64 {
    if pairs.len() < 3 {
        return f64::NAN;
    }
    let xs: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    pearson(&ranks(&xs), &ranks(&ys))
}

/// 1-based ranks, ties sharing their mean rank.
fn ranks(xs: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let mut ranks = vec![0.0; xs.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && xs[order[j + 1]] == xs[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = rank;
        }
        i = j + 1;
    }
    ranks
}

fn pearson(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// The least-squares slope of y over x; NaN without two distinct x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return f64::NAN;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if sxx == 0.0 {
        f64::NAN
    } else {
        sxy / sxx
    }
}

/// One line of the run's table: a figure, and its goal if it has one.
struct Line {
    measure: String,
    measured: String,
    goal: &'static str,
    /// `None`: no goal, or not measured in this run.
    met: Option<bool>,
}

impl Line {
    fn fact(measure: impl Into<String>, measured: impl Into<String>) -> Self {
        Self {
            measure: measure.into(),
            measured: measured.into(),
            goal: "",
            met: None,
        }
    }

    fn goal(
        measure: impl Into<String>,
        measured: impl Into<String>,
        goal: &'static str,
        met: Option<bool>,
    ) -> Self {
        Self {
            measure: measure.into(),
            measured: measured.into(),
            goal,
            met,
        }
    }

    fn json(&self) -> Value {
        json!({
            "measure": self.measure,
            "measured": self.measured,
            "goal": self.goal,
            "met": self.met,
        })
    }
}

/// `met` of a figure that may not have been measured (NaN).
fn judged(figure: f64, met: impl Fn(f64) -> bool) -> Option<bool> {
    (!figure.is_nan()).then(|| met(figure))
}

/// Thousands separated by commas.
fn thousands(n: impl Into<i128>) -> String {
    let n: i128 = n.into();
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// The service's CPU per poll and per `/healthz`.
struct PollCost {
    polls: usize,
    poll_us: f64,
    /// The mean of a run before the polls and one after: the machine's
    /// drift during the phase is not billed to the polls.
    healthz_us: f64,
    healthz_runs_us: [f64; 2],
    polls_per_second: f64,
    healthz_per_second: f64,
    /// Answers of the polls other than 200, by answer.
    refused: BTreeMap<String, u64>,
}

impl PollCost {
    fn ratio(&self) -> f64 {
        self.poll_us / self.healthz_us
    }
}

/// One difficulty of the proof-of-work table.
struct Proof {
    bits: u32,
    solved: u64,
    mean_hashes: f64,
    mean_ms: f64,
    max_ms: f64,
    /// What 2^bits hashes take at the rate this difficulty hashed: the
    /// mean a client can expect, steadier than a few solves' mean (the
    /// hashes a solve takes are geometric: their spread is their mean).
    expected_ms: f64,
}

/// What a client's join with proof was answered, in the room that asks
/// for it.
struct ProofCheck {
    bits: u32,
    without: String,
    others: Option<String>,
    with: String,
}

impl ProofCheck {
    fn ok(&self) -> bool {
        self.without == "400 bad_request"
            && self
                .others
                .as_deref()
                .is_none_or(|k| k == "400 bad_request")
            && self.with == "202"
    }
}

/// Starts the instances, runs the room, weighs a poll and proof of work;
/// `Ok(false)` when an invariant broke, a purchase without an admission
/// succeeded (or was answered other than `403 not_admitted`), a user held
/// two places, two users one, or a join with proof was refused.
pub async fn run(target: &TargetArgs, args: &WaitingRoomArgs) -> Result<bool, String> {
    if target.url.is_some() {
        return Err("waitingroom starts its own instances; drop --url".into());
    }
    if args.prequeue < 3 || args.later < 3 || args.lead < 3 || args.admit_per_second < 1 {
        return Err(
            "waitingroom needs --prequeue and --later of 3 or more, --lead of 3 s or more and --admit-per-second of 1 or more"
                .into(),
        );
    }
    // One address sends the whole crowd, and a bot joins a hundred times:
    // the limits would judge the driver, not the room.
    let env = vec![
        ("SECKILL_LIMIT_PER_ADDRESS".into(), "0".into()),
        ("SECKILL_LIMIT_PER_USER".into(), "0".into()),
    ];
    let service = Target::start(target.launch(args.instances.max(1), env)).await?;
    let result = scenario(&service, args).await;
    service.stop().await;
    result
}

async fn scenario(target: &Target, args: &WaitingRoomArgs) -> Result<bool, String> {
    let admin = Admin::new(target);
    let users = args.prequeue + args.bots + args.later;
    eprintln!("waitingroom: minting {} tokens", thousands(users));
    let tokens = admin.shared_tokens(1, users).await?;

    let created = Utc::now();
    let begin = created + chrono::Duration::seconds(args.lead as i64);
    let voucher = admin
        .create_voucher_from(json!({
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
            .map_err(|_| "the voucher's start passed while it was created: raise --lead")?;
    let room = Arc::new(Room {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(args.connections)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?,
        gate: Semaphore::new(args.connections.max(1)),
        bases: target.bases.clone(),
        voucher,
        start,
        deadline: start + Duration::from_secs(args.seconds),
        bot_repeats: args.bot_repeats,
        readings: Mutex::new(Vec::new()),
        polls_by_second: Mutex::new(Vec::new()),
        answers: Mutex::new(BTreeMap::new()),
        buys: Mutex::new(Tally::new()),
        probes: Mutex::new(BTreeMap::new()),
        sold_out_at: Mutex::new(None),
        admitted_ticket: Mutex::new(None),
        joined: AtomicU64::new(0),
        polled: AtomicU64::new(0),
        bought: AtomicU64::new(0),
        serving: AtomicI64::new(0),
        progress: ProgressBar::new(users as u64).with_prefix("waitingroom"),
    });
    room.progress.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} done  {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );

    let clients = plan(args, &tokens, start);
    let probes = clients.iter().filter(|c| c.probe).count();
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
        seen.push(
            handle
                .await
                .map_err(|e| format!("a client panicked: {e}"))?,
        );
    }
    ticker.abort();
    room.progress.finish_and_clear();
    let ran_for = room.secs(Instant::now());

    let buys = std::mem::replace(
        &mut *room.buys.lock().expect("no client panicked"),
        Tally::new(),
    );
    let sold_out_at = *room.sold_out_at.lock().expect("no client panicked");
    let expected = sold_out_at.map(|_| args.stock.min(users));
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
    let lines = figures.lines(args, cost.as_ref(), &invariants);
    let mut problems = invariants.problems.clone();
    problems.extend(figures.problems());
    if !proof_check.ok() {
        problems.push(format!(
            "a join with proof of work ({} bits) was answered {} (without proof: {}, another user's: {})",
            proof_check.bits,
            proof_check.with,
            proof_check.without,
            proof_check.others.as_deref().unwrap_or("-")
        ));
    }
    print_lines(&lines);
    print_proofs(&proofs, &proof_check);
    println!("  queue answers: {:?}", figures.answers);
    println!("  purchases: {:?}", buys.statuses);
    println!("  probes: {:?}", figures.probes);
    println!("  clients' ends: {:?}", figures.ends);
    if let Some(cost) = &cost {
        if !cost.refused.is_empty() {
            println!("  CPU phase polls not answered 200: {:?}", cost.refused);
        }
    }
    for problem in &problems {
        println!("  FAILED: {problem}");
    }
    let ok = problems.is_empty();
    println!(
        "{}",
        json!({
            "scenario": "waitingroom",
            "voucher": voucher,
            "prequeue": args.prequeue,
            "later": args.later,
            "bots": args.bots,
            "admit_per_second": args.admit_per_second,
            "stock": args.stock,
            "instances": target.bases.len(),
            "orders": invariants.orders,
            "invariants_ok": invariants.ok(),
            "problems": problems,
            "rho_prequeue": finite(figures.rho_early),
            "rho_later": finite(figures.rho_later),
            "bot_places": figures.bot_places,
            "admitted_per_second": finite(figures.rate),
            "sold_out_after_s": sold_out_at.map(round3),
            "bought_without_admission": figures.bought_without,
            "probes": figures.probes,
            "polls": figures.polls,
            "polls_per_second_mean": round3(figures.polls_mean),
            "polls_per_second_peak": figures.polls_peak,
            "poll_cpu_us": cost.as_ref().map(|c| round3(c.poll_us)),
            "healthz_cpu_us": cost.as_ref().map(|c| round3(c.healthz_us)),
            "healthz_cpu_us_runs": cost.as_ref().map(|c| c.healthz_runs_us.map(round3)),
            "poll_cpu_ratio": cost.as_ref().map(|c| finite(c.ratio())),
            "proof_of_work": proofs.iter().map(|p| json!({
                "bits": p.bits, "solved": p.solved,
                "mean_hashes": round3(p.mean_hashes), "mean_ms": round3(p.mean_ms),
                "max_ms": round3(p.max_ms), "expected_ms": round3(p.expected_ms),
            })).collect::<Vec<_>>(),
            "proof_join_ok": proof_check.ok(),
            "queue_answers": figures.answers,
            "purchases": buys.statuses,
            "ends": figures.ends,
            "lines": lines.iter().map(Line::json).collect::<Vec<_>>(),
            "ok": ok,
        })
    );
    Ok(ok)
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

/// What the run's answers add up to.
struct Figures {
    rho_early: f64,
    early_ranked: usize,
    /// Pre-queue joins that reached the room after the start.
    early_late: usize,
    rho_later: f64,
    later_ranked: usize,
    /// Distinct places each bot held, lowest and highest.
    bot_places: Option<(usize, usize)>,
    bots_with_one: usize,
    bots: usize,
    bot_joins: u64,
    /// Users who held more than one place; places held by more than one user.
    users_with_two: usize,
    shared_places: usize,
    placed: usize,
    rate: f64,
    /// Seconds of readings the rate was fitted over, and their count.
    rate_over: (f64, f64),
    rate_readings: usize,
    admitted: usize,
    bought: u64,
    probes: BTreeMap<String, u64>,
    probe_count: u64,
    probe_users: usize,
    bought_without: u64,
    probes_not_refused: u64,
    polls: u64,
    polls_mean: f64,
    polls_peak: u64,
    polls_per_client: f64,
    answers: BTreeMap<String, u64>,
    ends: BTreeMap<String, u64>,
    sold_out_at: Option<f64>,
    ran_for: f64,
    queue_5xx: u64,
}

impl Figures {
    fn of(
        room: &Room,
        seen: &[Seen],
        buys: &Tally,
        sold_out_at: Option<f64>,
        ran_for: f64,
        probe_users: usize,
    ) -> Self {
        let ranked = |kind: Kind| -> (Vec<(f64, f64)>, usize) {
            let crowd: Vec<&Seen> = seen.iter().filter(|s| s.kind == kind).collect();
            let late = crowd.iter().filter(|s| s.placed_at_join).count();
            let pairs = crowd
                .iter()
                .filter(|s| kind == Kind::Later || !s.placed_at_join)
                .filter_map(|s| Some((s.joined?, s.place? as f64)))
                .collect();
            (pairs, late)
        };
        let (early, early_late) = ranked(Kind::Early);
        let (later, _) = ranked(Kind::Later);
        let bots: Vec<&Seen> = seen.iter().filter(|s| s.kind == Kind::Bot).collect();
        let bot_counts: Vec<usize> = bots.iter().map(|s| s.places.len()).collect();
        let mut holders: HashMap<i64, usize> = HashMap::new();
        for s in seen {
            for place in &s.places {
                *holders.entry(*place).or_default() += 1;
            }
        }
        // The pace while units remained: readings up to the first answer
        // that said sold out, and before the room ran out of people.
        let readings = room.readings.lock().expect("no client panicked").clone();
        let placed = holders.len() as i64;
        let until = sold_out_at.unwrap_or(f64::INFINITY);
        let pace: Vec<(f64, f64)> = readings
            .iter()
            .filter(|(t, serving)| *t < until && *serving < placed)
            .map(|(t, serving)| (*t, *serving as f64))
            .collect();
        let rate_over = pace
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (t, _)| {
                (lo.min(*t), hi.max(*t))
            });
        let polls_by_second = room
            .polls_by_second
            .lock()
            .expect("no client panicked")
            .clone();
        let polls: u64 = seen.iter().map(|s| s.polls).sum();
        let probes = room.probes.lock().expect("no client panicked").clone();
        let mut ends = BTreeMap::new();
        for s in seen {
            let key = match &s.end {
                End::Bought => "bought".to_owned(),
                End::SoldOutAdmitted => "admitted, sold out".to_owned(),
                End::SoldOut => "sold out while waiting".to_owned(),
                End::Capped => "still waiting at the cap".to_owned(),
                End::Refused(key) => format!("purchase refused: {key}"),
                End::Failed(key) => format!("room failed: {key}"),
            };
            *ends.entry(key).or_default() += 1;
        }
        let answers = room.answers.lock().expect("no client panicked").clone();
        Self {
            rho_early: spearman(&early),
            early_ranked: early.len(),
            early_late,
            rho_later: spearman(&later),
            later_ranked: later.len(),
            bot_places: bot_counts
                .iter()
                .min()
                .zip(bot_counts.iter().max())
                .map(|(lo, hi)| (*lo, *hi)),
            bots_with_one: bot_counts.iter().filter(|n| **n == 1).count(),
            bots: bots.len(),
            bot_joins: bots.iter().map(|s| s.joins).sum(),
            users_with_two: seen.iter().filter(|s| s.places.len() > 1).count(),
            shared_places: holders.values().filter(|n| **n > 1).count(),
            placed: holders.len(),
            rate: slope(&pace),
            rate_over,
            rate_readings: pace.len(),
            admitted: seen.iter().filter(|s| s.admitted).count(),
            bought: buys.count("200"),
            probe_count: probes.values().sum(),
            bought_without: probes
                .iter()
                .filter(|(k, _)| k.starts_with('2'))
                .map(|(_, n)| n)
                .sum(),
            probes_not_refused: probes
                .iter()
                .filter(|(k, _)| *k != "403 not_admitted")
                .map(|(_, n)| n)
                .sum(),
            probes,
            probe_users,
            polls,
            polls_mean: polls_by_second.iter().sum::<u64>() as f64
                / polls_by_second.len().max(1) as f64,
            polls_peak: polls_by_second.iter().copied().max().unwrap_or(0),
            polls_per_client: polls as f64 / seen.len().max(1) as f64,
            queue_5xx: answers
                .iter()
                .filter(|(k, _)| k.split(' ').nth(1).is_some_and(|s| s.starts_with('5')))
                .map(|(_, n)| n)
                .sum(),
            answers,
            ends,
            sold_out_at,
            ran_for,
        }
    }

    /// What breaks the run, as opposed to a goal missed.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.bought_without > 0 {
            problems.push(format!(
                "{} purchases without an admission succeeded",
                self.bought_without
            ));
        }
        if self.probes_not_refused > 0 {
            problems.push(format!(
                "{} purchases without an admission were not answered 403 not_admitted: {:?}",
                self.probes_not_refused, self.probes
            ));
        }
        if self.users_with_two > 0 {
            problems.push(format!(
                "{} users held more than one place",
                self.users_with_two
            ));
        }
        if self.shared_places > 0 {
            problems.push(format!(
                "{} places were given to two users",
                self.shared_places
            ));
        }
        if self.queue_5xx > 0 {
            problems.push(format!("{} queue answers were 5xx", self.queue_5xx));
        }
        problems
    }

    fn lines(&self, args: &WaitingRoomArgs, cost: Option<&PollCost>, check: &Check) -> Vec<Line> {
        let a = args.admit_per_second as f64;
        let rate_ratio = self.rate / a;
        let mut lines = vec![
            Line::fact(
                "clients: pre-queue, later, bots",
                format!(
                    "{}, {}, {}",
                    thousands(args.prequeue),
                    thousands(args.later),
                    thousands(args.bots)
                ),
            ),
            Line::goal(
                format!(
                    "ρ(join time, place), pre-queue joiners ({})",
                    thousands(self.early_ranked as i64)
                ),
                format!("{:.4}", self.rho_early),
                "|ρ| <= 0.05",
                judged(self.rho_early, |r| r.abs() <= 0.05),
            ),
            Line::goal(
                format!(
                    "ρ(join time, place), later joiners ({})",
                    thousands(self.later_ranked as i64)
                ),
                format!("{:.4}", self.rho_later),
                ">= 0.99",
                judged(self.rho_later, |r| r >= 0.99),
            ),
            Line::goal(
                format!(
                    "places held per bot ({} bots, {} joins)",
                    self.bots,
                    thousands(self.bot_joins as i64)
                ),
                match self.bot_places {
                    Some((lo, hi)) if lo == hi => format!("{lo} (every bot)"),
                    Some((lo, hi)) => format!("{lo} to {hi} ({} bots with 1)", self.bots_with_one),
                    None => "-".to_owned(),
                },
                "1",
                self.bot_places.map(|(lo, hi)| lo == 1 && hi == 1),
            ),
            Line::goal(
                if self.rate_readings == 0 {
                    "admitted/s while units remained (no readings of serving)".to_owned()
                } else {
                    format!(
                        "admitted/s while units remained ({} readings of serving, {:.1} to {:.1} s after the start)",
                        thousands(self.rate_readings as i64),
                        self.rate_over.0,
                        self.rate_over.1
                    )
                },
                format!(
                    "{:.1} ({:.3} of {})",
                    self.rate, rate_ratio, args.admit_per_second
                ),
                "within 5 %",
                judged(rate_ratio, |r| (r - 1.0).abs() <= 0.05),
            ),
            Line::goal(
                format!(
                    "purchases without an admission that succeeded ({} tries by {} users)",
                    thousands(self.probe_count as i64),
                    self.probe_users
                ),
                format!(
                    "{} ({} answered 403 not_admitted)",
                    self.bought_without,
                    thousands(self.probes.get("403 not_admitted").copied().unwrap_or(0) as i64)
                ),
                "0",
                Some(self.bought_without == 0 && self.probes_not_refused == 0),
            ),
            Line::fact(
                "polls/s the service received: mean, peak second",
                format!(
                    "{}, {} ({} polls, {:.1} per client)",
                    thousands(self.polls_mean.round() as i64),
                    thousands(self.polls_peak as i64),
                    thousands(self.polls as i64),
                    self.polls_per_client
                ),
            ),
        ];
        if let Some(cost) = cost {
            lines.push(Line::goal(
                format!(
                    "service CPU per poll / per /healthz ({} each, {} connections)",
                    thousands(cost.polls as i64),
                    args.connections
                ),
                format!(
                    "{:.2}x ({:.1} / {:.1} µs; {} polls/s, {} /healthz/s)",
                    cost.ratio(),
                    cost.poll_us,
                    cost.healthz_us,
                    thousands(cost.polls_per_second.round() as i64),
                    thousands(cost.healthz_per_second.round() as i64)
                ),
                "<= 2x",
                judged(cost.ratio(), |r| r <= 2.0),
            ));
        }
        lines.push(Line::fact(
            "admitted, bought, units",
            format!(
                "{}, {}, {}",
                thousands(self.admitted as i64),
                thousands(self.bought as i64),
                thousands(args.stock)
            ),
        ));
        lines.push(Line::fact(
            "sold out, room done (s after the start)",
            format!(
                "{}, {:.1}",
                self.sold_out_at
                    .map_or("never".to_owned(), |t| format!("{t:.1}")),
                self.ran_for
            ),
        ));
        if self.early_late > 0 {
            lines.push(Line::fact(
                "pre-queue joins that reached the room after the start (not ranked)",
                thousands(self.early_late as i64),
            ));
        }
        lines.push(Line::goal(
            format!(
                "invariants ({} orders, {} places handed out)",
                thousands(check.orders),
                thousands(self.placed as i64)
            ),
            if check.ok() { "ok" } else { "BROKEN" }.to_owned(),
            "ok",
            Some(check.ok()),
        ));
        lines
    }
}

fn print_lines(lines: &[Line]) {
    let mut table = Table::new(["measure", "measured", "goal", "met"]);
    for line in lines {
        table.row([
            line.measure.clone(),
            line.measured.clone(),
            if line.goal.is_empty() { "-" } else { line.goal }.to_owned(),
            match (line.goal.is_empty(), line.met) {
                (true, _) => "-",
                (false, None) => "not measured",
                (false, Some(true)) => "yes",
                (false, Some(false)) => "NO",
            }
            .to_owned(),
        ]);
    }
    print!("{}", table.text());
    crate::table::record("waitingroom", "The room under its crowd", &table);
}

fn print_proofs(proofs: &[Proof], check: &ProofCheck) {
    let mut table = Table::new([
        "zero bits",
        "joins solved",
        "mean hashes",
        "2^bits",
        "mean ms",
        "max ms",
        "ms for 2^bits hashes",
    ]);
    let ms = |ms: f64| {
        if ms < 0.1 {
            format!("{ms:.4}")
        } else {
            format!("{ms:.1}")
        }
    };
    for p in proofs {
        table.row([
            p.bits.to_string(),
            thousands(p.solved as i64),
            thousands(p.mean_hashes.round() as i64),
            thousands(1_i64 << p.bits),
            ms(p.mean_ms),
            ms(p.max_ms),
            ms(p.expected_ms),
        ]);
    }
    println!("\nproof of work, one client's join (this machine, one core):");
    print!("{}", table.text());
    crate::table::record("waitingroom", "Proof of work: one join's cost", &table);
    println!(
        "a room asking {} bits: a join without proof {}, with another user's nonce {}, with its own {} ({})",
        check.bits,
        check.without,
        check.others.as_deref().unwrap_or("-"),
        check.with,
        if check.ok() { "ok" } else { "FAILED" }
    );
}

/// The service's CPU per poll of a room of its own (users placed, most
/// waiting), beside `/healthz` before and after, at the same concurrency,
/// each over every instance in turn.
async fn poll_cost(
    target: &Target,
    admin: &Admin<'_>,
    tokens: &[Arc<str>],
    args: &WaitingRoomArgs,
) -> Result<PollCost, String> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    // Admitting one a second from a second ago: the polls find their
    // users placed and waiting, as most of a crowd is.
    let now = Utc::now();
    let voucher = admin
        .create_voucher_from(json!({
            "title": "load test: a poll's cost",
            "stock": 1,
            "begin_time": now - chrono::Duration::seconds(1),
            "end_time": now + chrono::Duration::hours(1),
            "waiting_room": { "admit_per_second": 1 },
        }))
        .await?;
    let placed = tokens.len().min(2_000);
    let bases = &target.bases;
    let url = |i: usize| format!("{}/vouchers/{voucher}/queue", bases[i % bases.len()]);
    let tickets: Vec<Option<String>> = futures_util::stream::iter(0..placed)
        .map(|i| {
            let request = http.post(url(i)).bearer_auth(&*tokens[i]);
            async move {
                let body: Value = request.send().await.ok()?.json().await.ok()?;
                Some(body["ticket"].as_str()?.to_owned())
            }
        })
        .buffered(args.connections.max(1))
        .collect()
        .await;
    let tickets: Vec<(usize, String)> = tickets
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i, t?)))
        .collect();
    if tickets.is_empty() {
        return Err("no user of the poll-cost room could join it".into());
    }
    let n = args.cpu_polls;
    let healthz = |label: &'static str| {
        let http = http.clone();
        async move {
            let requests = (0..n).map(|i| http.get(format!("{}/healthz", bases[i % bases.len()])));
            weighed(target, requests, n, args.connections, label).await
        }
    };
    let (first, _, healthz_first_rate) = healthz("healthz").await;
    let polls = (0..n).map(|i| {
        let (user, ticket) = &tickets[i % tickets.len()];
        http.get(url(i + 1))
            .bearer_auth(&*tokens[*user])
            .header("x-queue-ticket", ticket)
    });
    let (poll_us, refused, polls_per_second) =
        weighed(target, polls, n, args.connections, "polls").await;
    let (last, _, healthz_last_rate) = healthz("healthz").await;
    Ok(PollCost {
        polls: n,
        poll_us,
        healthz_us: (first + last) / 2.0,
        healthz_runs_us: [first, last],
        polls_per_second,
        healthz_per_second: (healthz_first_rate + healthz_last_rate) / 2.0,
        refused,
    })
}

/// Sends `requests` with `connections` in flight; the service's CPU µs per
/// request, the answers other than 2xx, and requests per second.
async fn weighed(
    target: &Target,
    requests: impl Iterator<Item = reqwest::RequestBuilder>,
    n: usize,
    connections: usize,
    label: &str,
) -> (f64, BTreeMap<String, u64>, f64) {
    let progress = ProgressBar::new(n as u64).with_prefix(label.to_owned());
    progress.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len}  {per_sec}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let before = Usage::now(target).await;
    let clock = Instant::now();
    let answers: Vec<String> = futures_util::stream::iter(requests)
        .map(|request| {
            let progress = progress.clone();
            async move {
                let key = match request.send().await {
                    Ok(response) if response.status().is_success() => {
                        let _ = response.bytes().await;
                        None
                    }
                    Ok(response) => Some(response.status().as_u16().to_string()),
                    Err(_) => Some("error".to_owned()),
                };
                progress.inc(1);
                key.unwrap_or_default()
            }
        })
        .buffer_unordered(connections.max(1))
        .collect()
        .await;
    let elapsed = clock.elapsed();
    let us = Usage::now(target)
        .await
        .micros_per(&before, n as u64)
        .get("service")
        .copied()
        .unwrap_or(f64::NAN);
    progress.finish_and_clear();
    let mut refused = BTreeMap::new();
    for key in answers.into_iter().filter(|k| !k.is_empty()) {
        *refused.entry(key).or_default() += 1;
    }
    (us, refused, n as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// A room that asks for proof of work: a join without one, with another
/// user's nonce and with the user's own.
async fn proof_check(
    admin: &Admin<'_>,
    base: &str,
    tokens: &[Arc<str>],
    args: &WaitingRoomArgs,
) -> Result<ProofCheck, String> {
    let bits = args.proof_bits;
    let now = Utc::now();
    let voucher = admin
        .create_voucher_from(json!({
            "title": "load test: proof of work",
            "stock": 1,
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(1),
            "waiting_room": {
                "admit_per_second": args.admit_per_second,
                "proof_of_work_bits": bits,
            },
        }))
        .await?;
    let (own, other) =
        tokio::task::spawn_blocking(move || (solve(voucher, 1, bits).0, solve(voucher, 2, bits).0))
            .await
            .map_err(|e| e.to_string())?;
    let http = reqwest::Client::new();
    let join = |nonce: Option<String>| {
        let mut request = http
            .post(format!("{base}/vouchers/{voucher}/queue"))
            .bearer_auth(&*tokens[0]);
        if let Some(nonce) = nonce {
            request = request.header("x-queue-proof", nonce);
        }
        async move {
            match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    if status.is_success() {
                        status.as_u16().to_string()
                    } else {
                        format!(
                            "{} {}",
                            status.as_u16(),
                            body["error"].as_str().unwrap_or("?")
                        )
                    }
                }
                Err(e) => format!("error: {e}"),
            }
        }
    };
    let without = join(None).await;
    // Another user's solution solves this user's challenge once in 2^bits:
    // only one that does not is expected to be refused.
    let others = if proof_holds(VoucherId::new(voucher), UserId::new(1), &other, bits) {
        None
    } else {
        Some(join(Some(other)).await)
    };
    let with = join(Some(own)).await;
    Ok(ProofCheck {
        bits,
        without,
        others,
        with,
    })
}

/// The first nonce (counting up from 0) that solves `user`'s challenge,
/// and how many were hashed.
fn solve(voucher: i64, user: i64, bits: u32) -> (String, u64) {
    let mut nonce = String::new();
    for n in 0_u64.. {
        nonce.clear();
        nonce.push_str(&n.to_string());
        if proof_holds(VoucherId::new(voucher), UserId::new(user), &nonce, bits) {
            return (nonce, n + 1);
        }
    }
    unreachable!("a u64 nonce is found long before the counter wraps")
}

/// Solves per difficulty at most: enough for a mean, where one is cheap.
const MAX_SOLVES: u64 = 10_000;

/// For each difficulty, users' challenges solved one after another for
/// `seconds` (at least one): mean hashes and milliseconds per join.
async fn proof_table(voucher: i64, bits: &[u32], seconds: f64) -> Result<Vec<Proof>, String> {
    let bits = bits.to_vec();
    tokio::task::spawn_blocking(move || {
        bits.iter()
            .map(|&bits| {
                let budget = Duration::from_secs_f64(seconds.max(0.0));
                let clock = Instant::now();
                let (mut solved, mut hashes, mut max_ms) = (0_u64, 0_u64, 0.0_f64);
                while solved == 0 || (clock.elapsed() < budget && solved < MAX_SOLVES) {
                    let one = Instant::now();
                    hashes += solve(voucher, solved as i64 + 1, bits).1;
                    max_ms = max_ms.max(one.elapsed().as_secs_f64() * 1e3);
                    solved += 1;
                }
                let ms = clock.elapsed().as_secs_f64() * 1e3;
                Proof {
                    bits,
                    solved,
                    mean_hashes: hashes as f64 / solved as f64,
                    mean_ms: ms / solved as f64,
                    max_ms,
                    expected_ms: ms / hashes as f64 * (1_u64 << bits) as f64,
                }
            })
            .collect()
    })
    .await
    .map_err(|e| e.to_string())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A figure for the JSON line: null when it was not measured.
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then(|| round3(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_is_one_for_any_increasing_pairs_and_minus_one_reversed() {
        let up: Vec<(f64, f64)> = (0..50).map(|i| (f64::from(i), f64::from(i * i))).collect();
        assert!((spearman(&up) - 1.0).abs() < 1e-12);
        let down: Vec<(f64, f64)> = (0..50)
            .map(|i| (f64::from(i), -f64::from(i).exp()))
            .collect();
        assert!((spearman(&down) + 1.0).abs() < 1e-12);
        assert!(spearman(&up[..2]).is_nan());
    }

    #[test]
    fn ties_share_their_mean_rank() {
        assert_eq!(ranks(&[10.0, 20.0, 20.0, 5.0]), vec![2.0, 3.5, 3.5, 1.0]);
        // A textbook example: ρ = 1 - 6 Σd² / (n (n² - 1)) without ties.
        let pairs = [(1.0, 2.0), (2.0, 1.0), (3.0, 4.0), (4.0, 3.0), (5.0, 5.0)];
        let expected = 1.0 - 6.0 * 4.0 / (5.0 * 24.0);
        assert!((spearman(&pairs) - expected).abs() < 1e-12);
    }

    #[test]
    fn the_slope_of_a_counter_at_a_steady_pace_is_its_pace() {
        let points: Vec<(f64, f64)> = (0..100)
            .map(|i| {
                let t = f64::from(i) * 0.05;
                (t, (t * 200.0).floor())
            })
            .collect();
        assert!((slope(&points) - 200.0).abs() < 2.0);
        assert!(slope(&[(1.0, 1.0), (1.0, 2.0)]).is_nan());
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(20_000), "20,000");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
    }

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
