//! Load shedding by criticality: when the instance is saturated, the least
//! critical requests are refused first (`503 unavailable`, `Retry-After`),
//! before any body is read or any Redis or Postgres work is done.
//!
//! Saturation is the queueing delay a request meets inside the instance:
//! a probe, a byte written to a socket every 10 ms, is read by a task woken
//! as a connection is, and the time from the write to the read is how long
//! ready work waits for a core (CoDel's signal: time spent queued, not how
//! many are queued, which says nothing about requests that wait on
//! Postgres). The delay is the instance's own only while its runtime is
//! busy: when its workers were idle half the time or more, the cores went
//! to other processes on the machine (a build, a database), and refusing
//! this instance's requests would give back nothing. While that
//! delay, smoothed, is over the target, the share refused of the least
//! critical class that still gets in rises; a class is touched only once
//! every class below it is refused whole, and the more critical ones need a
//! larger delay (admin ten times the target, orders 25 times, the sale's
//! purchases a hundred times: at the default target of 2 ms, 200 ms, when
//! its buyers wait longer than the shedding would spare them). Under the
//! target the shares fall again, the most critical first. As the rate
//! limits do, a refusal is held for the refusals' delay before it is sent,
//! so that a client on a keep-alive connection that asks again at once
//! sends a few requests a second, not as many as can be refused.
//!
//! (tower's `LoadShed` over a `ConcurrencyLimit` refuses by how many are
//! in flight, whatever they are: a sale's purchases wait on Postgres with
//! the cores idle, and a flood of reads from memory saturates the cores
//! with few in flight. Google SRE's criticality classes and a delay
//! target are what this needs.)

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::limit::RouteClass;
use crate::telemetry::Chain;

/// How requests rank when the instance must refuse some, least critical
/// last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Criticality {
    /// The sale's own requests: purchases, the waiting room's joins and
    /// polls.
    Sale,
    /// What follows a sale and must not be lost: orders, payments (the
    /// provider's notifications) and cancels.
    Orders,
    /// The admin's routes: one operator, who must keep the sale in hand
    /// (restock, stats, the events) while it is attacked.
    Admin,
    /// Anonymous reads and probes: answered from memory, and cacheable by
    /// a front (`deploy/nginx.conf`).
    Reads,
}

impl Criticality {
    /// Most critical first.
    pub const ALL: [Self; 4] = [Self::Sale, Self::Orders, Self::Admin, Self::Reads];

    /// How critical the routes of a class are. The route table marks the
    /// probes that are never shed: `/healthz` (a process that answers is
    /// alive), `/readyz` (a load balancer that saw it refused would take a
    /// saturated, healthy instance out of its pool, and then all of them)
    /// and `/metrics` (the operator's eyes during an attack).
    pub fn of(class: RouteClass) -> Self {
        match class {
            RouteClass::Purchase | RouteClass::Queue => Self::Sale,
            RouteClass::Orders | RouteClass::Payments => Self::Orders,
            RouteClass::Admin => Self::Admin,
            RouteClass::Reads | RouteClass::Ops | RouteClass::Unmatched => Self::Reads,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Sale => "sale",
            Self::Orders => "orders",
            Self::Reads => "reads",
            Self::Admin => "admin",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// How many times the target the delay must be before this class is
    /// refused at all.
    fn patience(self) -> u32 {
        match self {
            Self::Sale => 100,
            Self::Orders => 25,
            Self::Admin => 10,
            Self::Reads => 1,
        }
    }
}

/// Shares are counted in thousandths.
const WHOLE: u32 = 1_000;
/// How often the delay is probed and the shares adjusted.
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How much a share rises per probe over the target, and falls per probe
/// under half of it: quick to shed, slow to let in again.
const RISE: u32 = 100;
const FALL: u32 = 10;
/// The share of its workers' time the runtime must spend busy, smoothed,
/// for a delay over the target to be its own, in thousandths.
const BUSY_FLOOR: u32 = 500;

/// The shedder of one instance.
#[derive(Clone)]
pub struct Shedder {
    inner: Arc<Shares>,
}

struct Shares {
    /// The share of each class refused now, in thousandths.
    refused: [AtomicU32; 4],
    /// The smoothed queueing delay, in microseconds.
    delay_us: AtomicU64,
    /// The smoothed share of its workers' time the runtime was busy, in
    /// thousandths.
    busy: AtomicU32,
    /// Requests seen, to spread refusals evenly over a class.
    seen: AtomicU64,
    /// `None`: shedding off.
    target: Option<Duration>,
    /// How long a refusal is held before it is sent.
    hold: Duration,
}

impl Shedder {
    /// Sheds when the queueing delay exceeds `target` (zero: never); each
    /// refusal held `hold`. Must run inside a tokio runtime: the probe
    /// runs beside it as long as the shedder lives.
    pub fn new(target: Duration, hold: Duration) -> Self {
        let inner = Arc::new(Shares {
            refused: Default::default(),
            delay_us: AtomicU64::new(0),
            busy: AtomicU32::new(0),
            seen: AtomicU64::new(0),
            target: (!target.is_zero()).then_some(target),
            hold,
        });
        if inner.target.is_some() {
            tokio::spawn(probe(Arc::downgrade(&inner)));
        }
        Self { inner }
    }

    /// Whether a request of `class` gets in now.
    pub fn admits(&self, class: Criticality) -> bool {
        let share = self.inner.refused[class.index()].load(Ordering::Relaxed);
        if share == 0 {
            return true;
        }
        if share >= WHOLE {
            return false;
        }
        // Every request's turn, spread by a multiplicative hash: `share` of
        // each thousand consecutive ones are refused.
        let n = self.inner.seen.fetch_add(1, Ordering::Relaxed);
        let spread = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % u64::from(WHOLE);
        spread >= u64::from(share)
    }

    /// Waits the refusals' delay if any class is being shed now: a refusal
    /// the service answers cheaply (a buyer asking again for what it
    /// holds) is then held as a shed request is.
    pub async fn hold_while_pressed(&self) {
        if self.pressed() && !self.inner.hold.is_zero() {
            tokio::time::sleep(self.inner.hold).await;
        }
    }

    /// Whether any class is being shed now.
    pub fn pressed(&self) -> bool {
        self.inner
            .refused
            .iter()
            .any(|share| share.load(Ordering::Relaxed) > 0)
    }

    /// The share of `class` refused now, from 0 to 1.
    pub fn refused_share(&self, class: Criticality) -> f64 {
        f64::from(self.inner.refused[class.index()].load(Ordering::Relaxed)) / f64::from(WHOLE)
    }

    /// The smoothed queueing delay.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.inner.delay_us.load(Ordering::Relaxed))
    }
}

impl Shares {
    /// One probe's delay, and the share of the workers' time (in
    /// thousandths) the runtime was busy since the last: smooths both in
    /// and moves the shares.
    fn observe(&self, delay: Duration, busy: u32, target: Duration) {
        let sample = delay.as_micros() as u64;
        let old = self.delay_us.load(Ordering::Relaxed);
        let smoothed = (old * 7 + sample) / 8;
        self.delay_us.store(smoothed, Ordering::Relaxed);
        let busy = (self.busy.load(Ordering::Relaxed) * 7 + busy.min(WHOLE)) / 8;
        self.busy.store(busy, Ordering::Relaxed);
        let target_us = target.as_micros() as u64;
        if smoothed > target_us && busy >= BUSY_FLOOR {
            // The least critical class not yet refused whole, if the delay
            // is over its patience.
            for class in Criticality::ALL.into_iter().rev() {
                let share = &self.refused[class.index()];
                let now = share.load(Ordering::Relaxed);
                if now >= WHOLE {
                    continue;
                }
                if smoothed > target_us * u64::from(class.patience()) {
                    share.store((now + RISE).min(WHOLE), Ordering::Relaxed);
                }
                break;
            }
        } else if smoothed < target_us / 2 || busy < BUSY_FLOOR {
            // The most critical class still refused in part.
            for class in Criticality::ALL {
                let share = &self.refused[class.index()];
                let now = share.load(Ordering::Relaxed);
                if now > 0 {
                    share.store(now.saturating_sub(FALL), Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// Probes the queueing delay until the shedder is dropped, as a request
/// meets it: a thread of its own writes a byte to a socket every
/// [`PROBE_EVERY`], and a task on the runtime reads it. The task is woken
/// by the I/O driver like a connection whose request arrived, and waits
/// behind every task ready before it (and for a core, when the machine has
/// none to spare): the time from the write to the read is that wait.
/// (A timer or a yield would not do: tokio polls its timers and yielded
/// tasks every few dozen tasks, however long the queue behind them.)
async fn probe(shares: Weak<Shares>) {
    let (theirs, ours) = match std::os::unix::net::UnixStream::pair() {
        Ok(pair) => pair,
        Err(error) => {
            tracing::warn!(error = %Chain(&error), "no socket pair for the shedder's probe: shedding is off");
            return;
        }
    };
    let ours = match ours
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(ours))
    {
        Ok(ours) => ours,
        Err(error) => {
            tracing::warn!(error = %Chain(&error), "the shedder's probe socket: shedding is off");
            return;
        }
    };
    let origin = Instant::now();
    let sent_at = Arc::new(AtomicU64::new(0));
    let writer_sent_at = sent_at.clone();
    let writer = std::thread::Builder::new()
        .name("shed-probe".into())
        .spawn(move || write_probes(theirs, origin, &writer_sent_at));
    if let Err(error) = writer {
        tracing::warn!(error = %Chain(&error), "no thread for the shedder's probe: shedding is off");
        return;
    }
    let mut busy = Busy::new(tokio::runtime::Handle::current().metrics());
    let mut byte = [0u8; 64];
    loop {
        // The writer ends (and this read sees the end) once the shedder is
        // dropped and its next write fails.
        if ours.readable().await.is_err() {
            return;
        }
        let read_at = origin.elapsed();
        match ours.try_read(&mut byte) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
        // Taken, so that the writer sends the next one only now: a probe
        // read late is measured from its own write, not a later one's.
        let sent = Duration::from_nanos(sent_at.swap(0, Ordering::AcqRel));
        let Some(shares) = shares.upgrade() else {
            return;
        };
        if let Some(target) = shares.target {
            shares.observe(read_at.saturating_sub(sent), busy.since_last(), target);
        }
        publish(&shares);
    }
}

/// How busy the runtime's workers were between two looks.
struct Busy {
    metrics: tokio::runtime::RuntimeMetrics,
    /// The workers' busy time, summed, and when, at the last look.
    total: Duration,
    at: Instant,
}

impl Busy {
    fn new(metrics: tokio::runtime::RuntimeMetrics) -> Self {
        let total = Self::total(&metrics);
        Self {
            metrics,
            total,
            at: Instant::now(),
        }
    }

    fn total(metrics: &tokio::runtime::RuntimeMetrics) -> Duration {
        (0..metrics.num_workers())
            .map(|worker| metrics.worker_total_busy_duration(worker))
            .sum()
    }

    /// The share of the workers' time spent busy since the last look, in
    /// thousandths.
    fn since_last(&mut self) -> u32 {
        let (total, at) = (Self::total(&self.metrics), Instant::now());
        let busy = total.saturating_sub(self.total);
        let span = at.saturating_duration_since(self.at) * self.metrics.num_workers() as u32;
        (self.total, self.at) = (total, at);
        if span.is_zero() {
            return 0;
        }
        (busy.as_nanos() * u128::from(WHOLE) / span.as_nanos()).min(u128::from(WHOLE)) as u32
    }
}

/// The probe's writer: a byte every [`PROBE_EVERY`] once the last one was
/// read, its time stored first (never 0: 0 means read). Ends when the
/// reading side is gone.
fn write_probes(mut socket: std::os::unix::net::UnixStream, origin: Instant, sent_at: &AtomicU64) {
    use std::io::Write;
    loop {
        std::thread::sleep(PROBE_EVERY);
        if sent_at.load(Ordering::Acquire) != 0 {
            continue;
        }
        let now = origin.elapsed().as_nanos() as u64;
        sent_at.store(now.max(1), Ordering::Release);
        if socket.write_all(&[1]).is_err() {
            return;
        }
    }
}

/// The per-class counters and gauges, registered once at 0.
struct Meters {
    admitted: [metrics::Counter; 4],
    shed: [metrics::Counter; 4],
    refused_share: [metrics::Gauge; 4],
    delay: metrics::Gauge,
    busy: metrics::Gauge,
}

fn meters() -> &'static Meters {
    static METERS: OnceLock<Meters> = OnceLock::new();
    METERS.get_or_init(|| {
        let counter = |name: &'static str, class: Criticality| {
            let counter = metrics::counter!(name, "class" => class.label());
            counter.absolute(0);
            counter
        };
        Meters {
            admitted: Criticality::ALL.map(|c| counter("seckill_shed_admitted_total", c)),
            shed: Criticality::ALL.map(|c| counter("seckill_shed_refused_total", c)),
            refused_share: Criticality::ALL
                .map(|c| metrics::gauge!("seckill_shed_refused_share", "class" => c.label())),
            delay: metrics::gauge!("seckill_shed_delay_seconds"),
            busy: metrics::gauge!("seckill_shed_busy_share"),
        }
    })
}

/// Registers the shedding metrics (at 0) with the metrics recorder.
pub fn register_metrics() {
    meters();
}

fn publish(shares: &Shares) {
    let meters = meters();
    for class in Criticality::ALL {
        let share = shares.refused[class.index()].load(Ordering::Relaxed);
        meters.refused_share[class.index()].set(f64::from(share) / f64::from(WHOLE));
    }
    meters
        .delay
        .set(shares.delay_us.load(Ordering::Relaxed) as f64 / 1e6);
    meters
        .busy
        .set(f64::from(shares.busy.load(Ordering::Relaxed)) / f64::from(WHOLE));
}

/// The shedder as a layer, just inside the address's limit: a refused
/// request costs no request id, no span, no route lookup, no body.
pub async fn shed<S: AsRef<Shedder>>(
    State(state): State<S>,
    request: Request,
    next: Next,
) -> Response {
    let shedder = state.as_ref();
    if shedder.inner.target.is_none() {
        return next.run(request).await;
    }
    // The route table's class; none for the probes, never shed.
    let Some(&class) = request.extensions().get::<Criticality>() else {
        return next.run(request).await;
    };
    let meters = meters();
    if shedder.admits(class) {
        meters.admitted[class.index()].increment(1);
        let buyers = request
            .extensions()
            .get::<RouteClass>()
            .is_some_and(|route| route.per_user());
        let response = next.run(request).await;
        if buyers && response.status() == StatusCode::UNAUTHORIZED {
            // A sign-in refused on a buyer's route is answered at once,
            // unless the instance is shedding: then it is held as any
            // refusal (bad tokens and garbage JWTs, whose signatures cost
            // a check each, asked again on every connection, are slowed
            // to a timer's cost).
            shedder.hold_while_pressed().await;
        }
        return response;
    }
    meters.shed[class.index()].increment(1);
    if !shedder.inner.hold.is_zero() {
        tokio::time::sleep(shedder.inner.hold).await;
    }
    ApiError::Overloaded.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(target: Duration) -> Shares {
        Shares {
            refused: Default::default(),
            delay_us: AtomicU64::new(0),
            busy: AtomicU32::new(0),
            seen: AtomicU64::new(0),
            target: Some(target),
            hold: Duration::ZERO,
        }
    }

    fn refused(s: &Shares) -> [u32; 4] {
        Criticality::ALL.map(|c| s.refused[c.index()].load(Ordering::Relaxed))
    }

    #[test]
    fn over_the_target_the_least_critical_go_first_and_the_sale_last() {
        let target = Duration::from_millis(10);
        let s = shares(target);
        // Twice the target: reads are refused whole; admin and orders are
        // not, short of ten and 25 times it.
        for _ in 0..200 {
            s.observe(Duration::from_millis(25), WHOLE, target);
        }
        assert_eq!(refused(&s), [0, 0, 0, WHOLE]);
        // 30 times: admin, then orders too; the sale's purchases not,
        // short of a hundred.
        for _ in 0..200 {
            s.observe(Duration::from_millis(300), WHOLE, target);
        }
        assert_eq!(refused(&s), [0, WHOLE, WHOLE, WHOLE]);
        for _ in 0..200 {
            s.observe(Duration::from_millis(1_100), WHOLE, target);
        }
        assert_eq!(refused(&s), [WHOLE, WHOLE, WHOLE, WHOLE]);
        // Under half the target: let in again, the most critical first.
        for _ in 0..250 {
            s.observe(Duration::ZERO, WHOLE, target);
        }
        let back = refused(&s);
        assert_eq!(back[0], 0);
        assert!(back[3] > 0, "reads are let in last: {back:?}");
    }

    #[test]
    fn a_delay_over_the_target_while_the_runtime_idles_is_the_machines_and_sheds_nothing() {
        let target = Duration::from_millis(2);
        let s = shares(target);
        // Other processes hold the cores: the probe waits 50 ms while the
        // runtime's workers are busy a fifth of the time.
        for _ in 0..200 {
            s.observe(Duration::from_millis(50), 200, target);
        }
        assert_eq!(refused(&s), [0; 4]);
        // The instance's own work: the same delay with its workers busy.
        for _ in 0..200 {
            s.observe(Duration::from_millis(50), 900, target);
        }
        assert_eq!(refused(&s), [0, 0, WHOLE, WHOLE]);
        // Idle again while the delay stays: let in again.
        for _ in 0..200 {
            s.observe(Duration::from_millis(50), 100, target);
        }
        assert!(refused(&s)[2] < WHOLE, "{:?}", refused(&s));
    }

    #[test]
    fn a_class_refused_in_part_is_refused_that_share_of_its_requests() {
        let shedder = Shedder {
            inner: Arc::new(shares(Duration::from_millis(10))),
        };
        shedder.inner.refused[Criticality::Reads.index()].store(300, Ordering::Relaxed);
        let admitted = (0..10_000)
            .filter(|_| shedder.admits(Criticality::Reads))
            .count();
        assert!((6_800..=7_200).contains(&admitted), "{admitted}");
        assert!((0..100).all(|_| shedder.admits(Criticality::Sale)));
    }

    /// One request through the shedder, classed as `route` and `class`, to
    /// a handler answering `status`: how long its answer took (paused
    /// time: exactly what was slept).
    async fn through(
        shedder: &Shedder,
        route: RouteClass,
        status: StatusCode,
    ) -> std::time::Duration {
        use tower::ServiceExt;
        let app = axum::Router::new()
            .route("/", axum::routing::post(move || async move { status }))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(Shedder {
                    inner: shedder.inner.clone(),
                }),
                |State(shedder): State<Arc<Shedder>>, request, next| async move {
                    shed(State(shedder), request, next).await
                },
            ))
            .layer(axum::Extension(route))
            .layer(axum::Extension(Criticality::of(route)));
        let began = tokio::time::Instant::now();
        let request = Request::post("/").body(axum::body::Body::empty()).unwrap();
        let answer = app.oneshot(request).await.unwrap();
        assert_eq!(answer.status(), status);
        began.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_sign_in_on_a_buyers_route_is_held_while_the_instance_sheds() {
        let mut held = shares(Duration::from_millis(10));
        held.hold = Duration::from_millis(500);
        let shedder = Shedder {
            inner: Arc::new(held),
        };
        // Not shedding: a 401 goes at once.
        let quiet = through(&shedder, RouteClass::Purchase, StatusCode::UNAUTHORIZED).await;
        assert_eq!(quiet, Duration::ZERO);
        // Reads shed, purchases admitted: a purchase's 401 is held, its
        // other answers are not, nor a 401 of another class.
        shedder.inner.refused[Criticality::Reads.index()].store(WHOLE, Ordering::Relaxed);
        for (route, status, wait) in [
            (RouteClass::Purchase, StatusCode::UNAUTHORIZED, 500),
            (RouteClass::Queue, StatusCode::UNAUTHORIZED, 500),
            (RouteClass::Orders, StatusCode::UNAUTHORIZED, 500),
            (RouteClass::Purchase, StatusCode::OK, 0),
            (RouteClass::Payments, StatusCode::UNAUTHORIZED, 0),
        ] {
            let took = through(&shedder, route, status).await;
            assert_eq!(took, Duration::from_millis(wait), "{route:?} {status}");
        }
    }
}
