//! The room's shared state and what one client sees: its requests,
//! their answers and the tallies every client adds to.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::WaitingRoomArgs;
use crate::drive::Tally;
use crate::service::Target;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Early,
    Bot,
    Later,
}

/// One client's part in the run.
pub(super) struct Client {
    pub user: i64,
    pub token: Arc<str>,
    pub kind: Kind,
    pub join_at: Instant,
    /// Also tries to buy without an admission.
    pub probe: bool,
}

/// How a client's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum End {
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
pub(super) struct Seen {
    pub user: i64,
    pub kind: Kind,
    /// Seconds from the start to its first join's sending (negative before).
    pub joined: Option<f64>,
    /// Its first join already had a place: it reached the room after the
    /// start.
    pub placed_at_join: bool,
    /// Its first place.
    pub place: Option<i64>,
    /// Every place any answer gave it.
    pub places: BTreeSet<i64>,
    /// Joins it sent (a bot's repeats included).
    pub joins: u64,
    pub polls: u64,
    pub admitted: bool,
    pub end: End,
}

/// An answer, as one client needs it.
pub(super) struct Reply {
    pub status: u16,
    pub body: Value,
    retry_after: Option<u64>,
    /// Seconds from the start when it was sent, and when its answer came.
    pub sent: f64,
    got: f64,
    micros: u64,
    pub error: Option<&'static str>,
}

impl Reply {
    pub(super) fn ok(&self) -> bool {
        self.error.is_none() && (200..300).contains(&self.status)
    }

    /// `"200"`, `"403 not_admitted"`, `"error: timeout"`, as the load
    /// engine counts answers.
    pub(super) fn key(&self) -> String {
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
    pub(super) fn wait(&self) -> Duration {
        Duration::from_secs(self.retry_after.unwrap_or(1))
    }
}

/// The queue body's fields this run reads.
pub(super) struct Queue {
    pub ticket: String,
    pub status: String,
    pub place: Option<i64>,
    pub serving: i64,
}

impl Queue {
    pub(super) fn read(body: &Value) -> Option<Self> {
        Some(Self {
            ticket: body["ticket"].as_str()?.to_owned(),
            status: body["status"].as_str()?.to_owned(),
            place: body["place"].as_i64(),
            serving: body["serving"].as_i64()?,
        })
    }
}

/// What every client shares: the connections, the clock and the tallies.
pub(super) struct Room {
    pub http: reqwest::Client,
    /// Requests in flight at once.
    gate: Semaphore,
    pub bases: Vec<String>,
    pub voucher: i64,
    pub start: Instant,
    pub deadline: Instant,
    pub bot_repeats: usize,
    /// (seconds from the start, halfway between sending and answer;
    /// `serving`) of every answer that had a place.
    pub readings: Mutex<Vec<(f64, i64)>>,
    /// Polls answered, by the second after the start they were sent in.
    pub polls_by_second: Mutex<Vec<u64>>,
    /// Queue answers by route and status.
    pub answers: Mutex<BTreeMap<String, u64>>,
    /// Purchases, the probes' included.
    pub buys: Mutex<Tally>,
    /// The probes' purchases by answer.
    pub probes: Mutex<BTreeMap<String, u64>>,
    /// Seconds from the start when an answer first said sold out.
    pub sold_out_at: Mutex<Option<f64>>,
    /// The last admitted ticket seen, and its user: what a probe tries
    /// as someone else's.
    pub admitted_ticket: Mutex<Option<(i64, String)>>,
    pub joined: AtomicU64,
    pub polled: AtomicU64,
    pub bought: AtomicU64,
    pub serving: AtomicI64,
    pub progress: ProgressBar,
}

impl Room {
    /// The room of a sale of `users` clients, its clock set to `start`.
    pub fn new(
        target: &Target,
        args: &WaitingRoomArgs,
        voucher: i64,
        start: Instant,
        users: i64,
    ) -> anyhow::Result<Self> {
        let room = Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(args.connections)
                .tcp_nodelay(true)
                .timeout(Duration::from_secs(30))
                .build()?,
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
        };
        room.progress.set_style(
            ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} done  {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        Ok(room)
    }

    /// Seconds from the start to `at` (negative before it).
    pub(super) fn secs(&self, at: Instant) -> f64 {
        if at >= self.start {
            at.duration_since(self.start).as_secs_f64()
        } else {
            -self.start.duration_since(at).as_secs_f64()
        }
    }

    /// The instance of a client's `k`th request: requests take turns, as
    /// a load balancer would send them, so a ticket from one instance is
    /// used on the other.
    pub(super) fn base(&self, user: i64, k: u64) -> &str {
        let n = self.bases.len() as u64;
        &self.bases[((user as u64).wrapping_add(k) % n) as usize]
    }

    pub(super) async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
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

    pub(super) async fn join(&self, base: &str, token: &str) -> Reply {
        let url = format!("{base}/vouchers/{}/queue", self.voucher);
        let reply = self.send(self.http.post(url).bearer_auth(token)).await;
        self.joined.fetch_add(1, Ordering::Relaxed);
        self.saw("join", &reply);
        reply
    }

    pub(super) async fn poll(&self, base: &str, token: &str, ticket: &str) -> Reply {
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
    pub(super) async fn buy(&self, base: &str, token: &str, ticket: Option<&str>) -> Reply {
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
    pub(super) async fn probe(&self, base: &str, token: &str, ticket: Option<&str>) {
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
    pub(super) fn new(client: &Client) -> Self {
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

    pub(super) fn placed(&mut self, place: Option<i64>) {
        if let Some(place) = place {
            self.place.get_or_insert(place);
            self.places.insert(place);
        }
    }
}
