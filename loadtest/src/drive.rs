//! The load engine: a fixed number of connections, opened before the clock
//! starts, each sending one request at a time from a shared plan, with
//! latencies in an HDR histogram and a progress bar on the terminal.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use tokio::task::JoinHandle;

#[derive(Clone)]
pub struct Request {
    pub method: reqwest::Method,
    pub path: Arc<str>,
    pub token: Option<Arc<str>>,
    /// The instance to send it to, when not the run's own base URL.
    pub base: Option<Arc<str>>,
    /// The client address it claims in `X-Forwarded-For`: the service
    /// trusts that header from the driver's loopback address when told
    /// to, and tells clients apart by it (its limits per address).
    pub from: Option<Arc<str>>,
    /// A JSON body (a purchase's `{"quantity": k}`); none is sent without.
    pub body: Option<Arc<str>>,
    /// A waiting room's ticket, sent as `X-Queue-Ticket`.
    pub ticket: Option<Arc<str>>,
}

impl Request {
    pub fn purchase(voucher: i64, token: Arc<str>) -> Self {
        Self {
            method: reqwest::Method::POST,
            path: format!("/seckill/{voucher}").into(),
            token: Some(token),
            base: None,
            from: None,
            body: None,
            ticket: None,
        }
    }

    pub fn get(path: &str) -> Self {
        Self {
            method: reqwest::Method::GET,
            path: path.into(),
            token: None,
            base: None,
            from: None,
            body: None,
            ticket: None,
        }
    }

    /// A POST to `path` on the instance at `base`, as the token's user.
    pub fn post_to(base: Arc<str>, path: String, token: Arc<str>) -> Self {
        Self {
            method: reqwest::Method::POST,
            path: path.into(),
            token: Some(token),
            base: Some(base),
            from: None,
            body: None,
            ticket: None,
        }
    }

    /// The same purchase, asking for `units` units (one: no body, as a
    /// buyer of one unit sends it).
    pub fn asking(self, units: i64) -> Self {
        let body = (units != 1).then(|| format!("{{\"quantity\":{units}}}").into());
        Self { body, ..self }
    }

    /// The same request, to the instance at `base`.
    pub fn on(self, base: Arc<str>) -> Self {
        Self {
            base: Some(base),
            ..self
        }
    }

    /// The same request, as `token`'s user.
    pub fn by(self, token: Arc<str>) -> Self {
        Self {
            token: Some(token),
            ..self
        }
    }

    /// The same request, showing a waiting room's `ticket`.
    pub fn with_ticket(self, ticket: Arc<str>) -> Self {
        Self {
            ticket: Some(ticket),
            ..self
        }
    }

    /// The same request, claiming to come from `address`.
    pub fn with_address(self, address: Arc<str>) -> Self {
        Self {
            from: Some(address),
            ..self
        }
    }
}

pub enum Plan {
    /// Each request once, in this order.
    Fixed(Vec<Request>),
    /// The requests over and over (each connection starting elsewhere) for
    /// this long.
    Timed(Duration, Vec<Request>),
    /// Each request at most once, for at most this long: distinct users
    /// that must not come back as repeat buyers. A run that sends them all
    /// before the time is up ends then, and its tally says so.
    Once(Duration, Vec<Request>),
}

/// What a run saw.
pub struct Tally {
    pub requests: u64,
    /// Count per answer: `"200"`, `"409 sold_out"`, `"error: ..."`.
    pub statuses: BTreeMap<String, u64>,
    /// Latency in microseconds.
    pub latency: Histogram<u64>,
    pub elapsed: Duration,
    /// A `Plan::Once` sent every request before its time was up: rates
    /// count the shorter run, and more users would have gone faster.
    pub exhausted: bool,
    /// Order ids of the successful purchases.
    pub order_ids: Vec<String>,
    /// Every answer: when it was sent, how long it took, whether it was a
    /// 200. For the report's charts over time.
    pub samples: Vec<Sample>,
    /// What `Sample::at_ms` counts from: the start of the run.
    pub origin: Instant,
}

/// One answer, for charts over time.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Milliseconds from the start of the run to the request.
    pub at_ms: u32,
    pub micros: u32,
    pub ok: bool,
}

/// The answers among `statuses` whose key `pick` keeps, added up.
pub fn answers_where(statuses: &BTreeMap<String, u64>, pick: impl Fn(&str) -> bool) -> u64 {
    statuses
        .iter()
        .filter(|(k, _)| pick(k))
        .map(|(_, n)| n)
        .sum()
}

impl Tally {
    pub fn new() -> Self {
        Self {
            requests: 0,
            statuses: BTreeMap::new(),
            latency: Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds"),
            elapsed: Duration::ZERO,
            exhausted: false,
            order_ids: Vec::new(),
            samples: Vec::new(),
            origin: Instant::now(),
        }
    }

    /// An empty tally whose samples count from `origin`.
    pub fn starting_at(origin: Instant) -> Self {
        Self {
            origin,
            ..Self::new()
        }
    }

    pub fn count(&self, key: &str) -> u64 {
        self.statuses.get(key).copied().unwrap_or(0)
    }

    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }
}

pub fn client(connections: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()
        .expect("an HTTP client")
}

/// Runs `plan` against `base` over `connections` connections.
pub async fn drive(base: &str, plan: Plan, connections: usize, label: &str) -> Tally {
    let (requests, deadline, total, once) = match plan {
        Plan::Fixed(requests) => {
            let n = requests.len();
            (requests, None, n as u64, false)
        }
        Plan::Timed(duration, requests) => (requests, Some(duration), duration.as_secs(), false),
        Plan::Once(duration, requests) => (requests, Some(duration), duration.as_secs(), true),
    };
    let exhausted = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(requests);
    let progress = progress_bar(label, total, deadline.is_some());

    let next = Arc::new(AtomicUsize::new(0));
    let client = client(connections);
    open_connections(&client, base, &requests, connections).await;
    let started = Instant::now();
    let tally = Arc::new(Mutex::new(Tally::starting_at(started)));
    let mut workers = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (client, requests, next, tally, progress, exhausted) = (
            client.clone(),
            requests.clone(),
            next.clone(),
            tally.clone(),
            progress.clone(),
            exhausted.clone(),
        );
        let base = base.to_owned();
        workers.push(tokio::spawn(async move {
            // Answers, counted in the run's tally now and then: a tally of
            // its own per connection would zero a histogram each (150 KB;
            // 150 MB for a crowd of 1,000 connections), and the page faults
            // slowed a crowd's first moments on the driver's side.
            let mut mine = Vec::with_capacity(COUNTED_AT_ONCE);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let request = match deadline {
                    None if i >= requests.len() => break,
                    None => &requests[i],
                    Some(d) if started.elapsed() >= d => break,
                    Some(_) if once && i >= requests.len() => {
                        exhausted.store(true, Ordering::Relaxed);
                        break;
                    }
                    Some(_) => &requests[i % requests.len()],
                };
                mine.push(exchange(&client, &base, request).await);
                if deadline.is_none() {
                    progress.inc(1);
                }
                if mine.len() == COUNTED_AT_ONCE {
                    count(&tally, &mut mine);
                }
            }
            count(&tally, &mut mine);
        }));
    }
    let ticker = deadline.map(|_| tick(progress.clone(), next.clone(), started));
    for worker in workers {
        worker.await.expect("a load worker panicked");
    }
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    progress.finish_and_clear();
    finished(tally, started, &exhausted, requests.len(), label)
}

/// The run's tally, its workers done: its time, and whether its plan ran out first.
fn finished(
    tally: Arc<Mutex<Tally>>,
    started: Instant,
    exhausted: &AtomicBool,
    planned: usize,
    label: &str,
) -> Tally {
    let mut tally = Arc::try_unwrap(tally)
        .ok()
        .expect("all workers are done")
        .into_inner()
        .expect("no worker panicked");
    tally.elapsed = started.elapsed();
    tally.exhausted = exhausted.load(Ordering::Relaxed);
    if tally.exhausted {
        eprintln!(
            "{label}: every one of the {planned} requests was sent after {:.1} s, before the run's time was up: more users would have gone faster",
            tally.elapsed.as_secs_f64()
        );
    }
    tally
}

/// The run's progress bar: seconds of a timed run, or requests sent.
fn progress_bar(label: &str, total: u64, timed: bool) -> ProgressBar {
    let progress = ProgressBar::new(total).with_prefix(label.to_owned());
    let template = if timed {
        "{prefix:>12} [{bar:40}] {pos}/{len} s  {msg}"
    } else {
        "{prefix:>12} [{bar:40}] {pos}/{len}  {per_sec}  eta {eta}"
    };
    progress.set_style(
        ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    progress
}

/// A timed run's bar, moved on every quarter second: the seconds gone and
/// the requests sent.
fn tick(progress: ProgressBar, next: Arc<AtomicUsize>, started: Instant) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            progress.set_position(started.elapsed().as_secs());
            progress.set_message(format!("{} requests", next.load(Ordering::Relaxed)));
        }
    })
}

/// One request's answer, as a tally counts it.
pub struct Answered {
    /// `"200"`, `"409 sold_out"`, `"error: timeout"`, ...
    pub key: String,
    /// The order id of a successful purchase.
    pub order_id: Option<String>,
    ok: bool,
    sent: Instant,
    micros: u64,
}

/// Answers a connection keeps before it counts them in the run's tally.
const COUNTED_AT_ONCE: usize = 256;

/// Counts `answers` in `tally`, leaving `answers` empty.
fn count(tally: &Mutex<Tally>, answers: &mut Vec<Answered>) {
    let mut tally = tally.lock().expect("no worker panicked");
    for answered in answers.drain(..) {
        tally.record(answered);
    }
}

/// How long opening one connection before a run may take.
const OPENING: Duration = Duration::from_secs(5);

/// Opens the run's connections before its clock starts: `connections`
/// requests at once to `/healthz` of every instance the plan sends to,
/// whose connections then wait in the client's pool. A latency then counts
/// from sending a request on an open connection to its answer, as wrk, oha
/// and k6's `http_req_duration` count it; the TCP handshakes of a crowd's
/// first moments (and the instance setting up 1,000 connections at once)
/// would otherwise land on its first requests only. A failed request here
/// is not counted: the run itself meets the same failure and counts it.
async fn open_connections(
    client: &reqwest::Client,
    base: &str,
    requests: &[Request],
    connections: usize,
) {
    let bases: BTreeSet<Option<&Arc<str>>> = requests.iter().map(|r| r.base.as_ref()).collect();
    let opening: Vec<_> = bases
        .into_iter()
        .map(|to| to.map_or(base, |b| &**b))
        .flat_map(|base| std::iter::repeat_n(format!("{base}/healthz"), connections))
        .map(|url| {
            let client = client.clone();
            tokio::spawn(async move {
                let opened = client.get(url).timeout(OPENING).send().await;
                if let Ok(response) = opened {
                    let _ = response.bytes().await;
                }
            })
        })
        .collect();
    for opened in opening {
        let _ = opened.await;
    }
}

/// Sends one request; its answer, to be counted in a tally.
pub async fn exchange(client: &reqwest::Client, base: &str, request: &Request) -> Answered {
    let base = request.base.as_deref().unwrap_or(base);
    let mut builder = client.request(request.method.clone(), format!("{base}{}", request.path));
    if let Some(token) = &request.token {
        builder = builder.bearer_auth(token);
    }
    if let Some(address) = &request.from {
        builder = builder.header("x-forwarded-for", &**address);
    }
    if let Some(ticket) = &request.ticket {
        builder = builder.header("x-queue-ticket", &**ticket);
    }
    if let Some(body) = &request.body {
        builder = builder
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let sent = Instant::now();
    let result = builder.send().await;
    let mut ok = false;
    let mut order_id = None;
    let key = match result {
        Ok(response) => {
            let status = response.status();
            let body = response.bytes().await.unwrap_or_default();
            if status.is_success() {
                ok = true;
                if let Ok(json) = serde_json::from_slice::<Value>(&body) {
                    order_id = json["order_id"].as_str().map(str::to_owned);
                }
                status.as_u16().to_string()
            } else {
                let code = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|j| j["error"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "?".into());
                format!("{} {code}", status.as_u16())
            }
        }
        Err(e) if e.is_timeout() => "error: timeout".to_owned(),
        Err(e) if e.is_connect() => "error: connect".to_owned(),
        Err(_) => "error: transport".to_owned(),
    };
    let micros = u64::try_from(sent.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    Answered {
        key,
        order_id,
        ok,
        sent,
        micros,
    }
}

impl Tally {
    /// Counts one answer.
    pub fn record(&mut self, answered: Answered) {
        let Answered {
            key,
            order_id,
            ok,
            sent,
            micros,
        } = answered;
        self.order_ids.extend(order_id);
        self.latency.saturating_record(micros);
        self.samples.push(Sample {
            at_ms: u32::try_from(sent.saturating_duration_since(self.origin).as_millis())
                .unwrap_or(u32::MAX),
            micros: u32::try_from(micros).unwrap_or(u32::MAX),
            ok,
        });
        self.requests += 1;
        *self.statuses.entry(key).or_default() += 1;
    }
}
