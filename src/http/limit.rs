//! Rate limits, before any Redis or Postgres work: per client address on
//! every route, per user on the routes that buy, read orders or queue.
//! GCRA (`governor`): one atomic state per key, idle keys evicted.
//!
//! The client is the socket's peer, or, when the peer is a trusted proxy,
//! the last `X-Forwarded-For` hop that is not one (read from the right:
//! each trusted proxy appended the hop before it; hops left of the first
//! untrusted one are whatever the client wrote). IPv6 clients count by their /64: one
//! subscriber gets a whole /64 and could otherwise rotate through it.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use ipnet::IpNet;

use super::error::ApiError;
use super::extract::{bearer, SignIn, Verification};

type Keyed<K> = RateLimiter<K, DefaultKeyedStateStore<K>, DefaultClock>;

/// How often idle keys are dropped: a key whose bucket is full again
/// holds nothing a fresh one would not.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The limits of one instance.
pub struct Limits {
    inner: Arc<Limiters>,
    /// How long a refusal is held before it is sent (see
    /// [`Limits::delaying_refusals`]).
    delay: Duration,
}

struct Limiters {
    per_address: Option<Keyed<IpAddr>>,
    per_user: Option<Keyed<i64>>,
    trusted: Vec<IpNet>,
    clock: DefaultClock,
}

/// Who a limit refused, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub limit: Limit,
    pub wait: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Address,
    User,
}

/// A forwarded hop's address: `192.0.2.1`, `2001:db8::1`, or either with
/// a port (`192.0.2.1:443`, `[2001:db8::1]:443`) or in brackets
/// (`[2001:db8::1]`), as proxies write them; `None` for anything else.
fn hop_address(hop: &[u8]) -> Option<IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(socket) = hop.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    hop.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

impl Limits {
    /// `per_address` and `per_user` requests per second, each with a burst
    /// of the same size; 0 turns one off. Must run inside a tokio runtime:
    /// the sweep of idle keys runs beside it, as long as the limits live.
    pub fn new(per_address: u32, per_user: u32, trusted: Vec<IpNet>) -> Self {
        let quota = |n: u32| NonZeroU32::new(n).map(|n| Quota::per_second(n).allow_burst(n));
        let inner = Arc::new(Limiters {
            per_address: quota(per_address).map(RateLimiter::keyed),
            per_user: quota(per_user).map(RateLimiter::keyed),
            trusted,
            clock: DefaultClock::default(),
        });
        if inner.per_address.is_some() || inner.per_user.is_some() {
            tokio::spawn(sweep(Arc::downgrade(&inner)));
        }
        Self {
            inner,
            delay: Duration::ZERO,
        }
    }

    /// Holds each refusal this long before sending it. A client that asks
    /// again as soon as it is answered (a script on a hundred keep-alive
    /// connections) then sends a hundred requests per delay instead of as
    /// many as the service can refuse: the refusals cost a timer each, not
    /// a core. Nobody who honours `Retry-After` notices.
    pub fn delaying_refusals(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The address a request's limit is counted under: from the peer
    /// leftwards through `X-Forwarded-For`, the first address that is not
    /// a trusted proxy (a CDN in front of the shipped nginx makes two
    /// trusted hops). A hop that is no address ends the walk at the last
    /// trusted one.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let trusted = |ip: &IpAddr| self.inner.trusted.iter().any(|net| net.contains(ip));
        let mut client = canonical(peer);
        // Split as bytes, each hop read alone: a byte that is not ASCII in
        // a hop the client wrote does not make the whole header unreadable
        // (the client then counted as the proxy, in its shared bucket).
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .rev()
            .flat_map(|v| v.as_bytes().rsplit(|b| *b == b','));
        for hop in hops {
            if !trusted(&client) {
                break;
            }
            match hop_address(hop) {
                Some(ip) => client = canonical(ip),
                None => break,
            }
        }
        client
    }

    /// One request from `client`.
    pub fn check_address(&self, client: IpAddr) -> Result<(), Refused> {
        let Some(limiter) = &self.inner.per_address else {
            return Ok(());
        };
        limiter
            .check_key(&limit_key(client))
            .map_err(|not_until| Refused {
                limit: Limit::Address,
                wait: not_until.wait_time_from(self.inner.clock.now()),
            })
    }

    /// Whether users are limited at all (the token need not be read).
    pub fn limits_users(&self) -> bool {
        self.inner.per_user.is_some()
    }

    /// One request of `user_id`.
    pub fn check_user(&self, user_id: i64) -> Result<(), Refused> {
        let Some(limiter) = &self.inner.per_user else {
            return Ok(());
        };
        limiter.check_key(&user_id).map_err(|not_until| Refused {
            limit: Limit::User,
            wait: not_until.wait_time_from(self.inner.clock.now()),
        })
    }

    /// Keys held now (addresses, users), for the metrics page.
    pub fn keys(&self) -> (usize, usize) {
        (
            self.inner.per_address.as_ref().map_or(0, RateLimiter::len),
            self.inner.per_user.as_ref().map_or(0, RateLimiter::len),
        )
    }

    /// Drops every key that holds nothing (its bucket full again).
    pub fn sweep(&self) {
        self.inner.sweep();
    }
}

impl Limiters {
    fn sweep(&self) {
        if let Some(limiter) = &self.per_address {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        if let Some(limiter) = &self.per_user {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

/// Sweeps idle keys until the limits are dropped.
async fn sweep(limits: Weak<Limiters>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        match limits.upgrade() {
            Some(limits) => limits.sweep(),
            None => return,
        }
    }
}

/// An IPv4 address as itself, also when it comes mapped into IPv6.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The key an address is limited under: itself, or its /64.
fn limit_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// Routes by what limits them and how they are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    Purchase,
    Orders,
    Queue,
    Reads,
    Admin,
    Payments,
    Ops,
    Unmatched,
}

impl RouteClass {
    pub const ALL: [Self; 8] = [
        Self::Purchase,
        Self::Orders,
        Self::Queue,
        Self::Reads,
        Self::Admin,
        Self::Payments,
        Self::Ops,
        Self::Unmatched,
    ];

    /// The class the route table gave `request` (`routes::classify`);
    /// unmatched where none did.
    pub fn of_request(request: &Request) -> Self {
        request
            .extensions()
            .get::<Self>()
            .copied()
            .unwrap_or(Self::Unmatched)
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Purchase => "purchase",
            Self::Orders => "orders",
            Self::Queue => "queue",
            Self::Reads => "reads",
            Self::Admin => "admin",
            Self::Payments => "payments",
            Self::Ops => "ops",
            Self::Unmatched => "unmatched",
        }
    }

    /// Whether a user's own limit applies too.
    pub(super) fn per_user(self) -> bool {
        matches!(self, Self::Purchase | Self::Orders | Self::Queue)
    }
}

/// `seckill_rate_limited_total{class, limit}`, every pair registered at 0
/// once, so that a refusal counts without building a labelled key.
fn refusals() -> &'static [[metrics::Counter; 2]; RouteClass::ALL.len()] {
    static COUNTERS: OnceLock<[[metrics::Counter; 2]; RouteClass::ALL.len()]> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        RouteClass::ALL.map(|class| {
            ["address", "user"].map(|limit| {
                let counter = metrics::counter!(
                    "seckill_rate_limited_total",
                    "class" => class.label(),
                    "limit" => limit
                );
                counter.absolute(0);
                counter
            })
        })
    })
}

/// Registers the refusal counters (at 0) with the metrics recorder.
pub fn register_metrics() {
    refusals();
}

fn count(class: RouteClass, limit: Limit) {
    let at = RouteClass::ALL
        .iter()
        .position(|c| *c == class)
        .unwrap_or(RouteClass::ALL.len() - 1);
    refusals()[at][usize::from(limit == Limit::User)].increment(1);
}

/// The client address's limit, on every request, as the outermost layer:
/// a refusal costs no request id, no span, no route lookup. A request
/// without a known peer (a router driven in-process) is not limited.
pub async fn limit_address<S: AsRef<Limits>>(
    State(state): State<S>,
    request: Request,
    next: Next,
) -> Response {
    let limits = state.as_ref();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    if let Some(peer) = peer {
        let client = limits.client(peer, request.headers());
        if let Err(refused) = limits.check_address(client) {
            count(RouteClass::of_request(&request), refused.limit);
            return too_many(limits, refused).await;
        }
    }
    next.run(request).await
}

/// The user's limit, on the routes it covers (known once routed): the
/// token is verified here once, and the extractor takes the user from it.
pub async fn limit_user<S: SignIn + AsRef<Limits>>(
    State(state): State<S>,
    mut request: Request,
    next: Next,
) -> Response {
    let limits = state.as_ref();
    let class = RouteClass::of_request(&request);
    if class.per_user() && limits.limits_users() {
        if let Ok(token) = bearer(request.headers()) {
            let verified = state
                .authenticator()
                .verify(token, chrono::Utc::now().timestamp())
                .await;
            if let Ok(user_id) = verified {
                if let Err(refused) = limits.check_user(user_id.get()) {
                    count(class, refused.limit);
                    return too_many(limits, refused).await;
                }
            }
            request.extensions_mut().insert(Verification(verified));
        }
    }
    next.run(request).await
}

/// `429 rate_limited` with `Retry-After` in whole seconds, rounded up,
/// after the refusals' delay; its message names the limit (this client's
/// address, or this user).
async fn too_many(limits: &Limits, refused: Refused) -> Response {
    let seconds = refused.wait.as_secs() + u64::from(refused.wait.subsec_nanos() > 0);
    if !limits.delay.is_zero() {
        tokio::time::sleep(limits.delay).await;
    }
    match refused.limit {
        Limit::Address => ApiError::RateLimited(seconds),
        Limit::User => ApiError::UserRateLimited(seconds),
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(forwarded: &[&'static str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in forwarded {
            headers.append("x-forwarded-for", HeaderValue::from_static(value));
        }
        headers
    }

    #[tokio::test]
    async fn the_forwarded_hops_count_only_behind_trusted_proxies() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let proxy = ip("10.0.0.5");
        let limits = Limits::new(1, 1, vec!["10.0.0.0/24".parse().unwrap()]);
        let stranger = ip("192.0.2.7");
        let cases: &[(IpAddr, &[&'static str], IpAddr)] = &[
            // The last hop is the one the proxy appended; earlier ones are
            // the client's own words.
            (proxy, &["1.1.1.1, 2.2.2.2"], ip("2.2.2.2")),
            (proxy, &["1.1.1.1", "3.3.3.3"], ip("3.3.3.3")),
            (proxy, &["garbage"], proxy),
            // Two trusted proxies (a CDN, then nginx): the hop before both.
            (proxy, &["1.1.1.1, 2.2.2.2, 10.0.0.9"], ip("2.2.2.2")),
            (proxy, &["2.2.2.2", "10.0.0.9"], ip("2.2.2.2")),
            // Every hop trusted: the furthest of them.
            (proxy, &["10.0.0.7, 10.0.0.9"], ip("10.0.0.7")),
            // Garbage behind a trusted hop: that hop, never the garbage's left.
            (proxy, &["1.1.1.1, garbage, 10.0.0.9"], ip("10.0.0.9")),
            (proxy, &[], proxy),
            (stranger, &["2.2.2.2"], stranger),
            // Ports and brackets, as some proxies write hops.
            (proxy, &["2.2.2.2:443"], ip("2.2.2.2")),
            (proxy, &["[2001:db8::1]:443"], ip("2001:db8::1")),
            (proxy, &["[2001:db8::1]"], ip("2001:db8::1")),
        ];
        for (peer, hops, client) in cases {
            assert_eq!(
                limits.client(*peer, &headers(hops)),
                *client,
                "{hops:?} from {peer}"
            );
        }
        // A hop that is not ASCII ends the walk there, not the whole header:
        // the hop the proxy appended still counts.
        let mut mixed = HeaderMap::new();
        mixed.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"caf\xc3\xa9, 2.2.2.2").unwrap(),
        );
        assert_eq!(limits.client(proxy, &mixed), ip("2.2.2.2"));
    }

    #[tokio::test]
    async fn an_address_past_its_burst_is_refused_and_others_are_not() {
        let limits = Limits::new(3, 0, Vec::new());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..3 {
            assert!(limits.check_address(a).is_ok());
        }
        let refused = limits.check_address(a).unwrap_err();
        assert_eq!(refused.limit, Limit::Address);
        assert!(refused.wait > Duration::ZERO && refused.wait <= Duration::from_secs(1));
        assert!(limits.check_address(b).is_ok());
        // Users are not limited here.
        assert!(!limits.limits_users());
        for _ in 0..100 {
            assert!(limits.check_user(7).is_ok());
        }
    }

    #[tokio::test]
    async fn an_ipv6_network_counts_as_one_client() {
        let limits = Limits::new(2, 0, Vec::new());
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other_in_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(limits.check_address(one).is_ok());
        assert!(limits.check_address(other_in_64).is_ok());
        assert!(limits.check_address(one).is_err());
        assert!(limits.check_address(next_64).is_ok());
        let mapped: IpAddr = "::ffff:192.0.2.9".parse().unwrap();
        assert_eq!(canonical(mapped), "192.0.2.9".parse::<IpAddr>().unwrap());
    }

    #[tokio::test]
    async fn idle_keys_are_swept() {
        let limits = Limits::new(1000, 1000, Vec::new());
        for i in 0..50u8 {
            limits.check_address(IpAddr::from([192, 0, 2, i])).unwrap();
            limits.check_user(i64::from(i)).unwrap();
        }
        assert_eq!(limits.keys(), (50, 50));
        // A thousand per second: each bucket is full again within 1 ms.
        tokio::time::sleep(Duration::from_millis(20)).await;
        limits.sweep();
        assert_eq!(limits.keys(), (0, 0));
    }
}
