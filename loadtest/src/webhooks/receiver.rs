//! The shop's webhook receiver, inside the driver: it checks every
//! delivery's signature, records each event (when it came, how old it
//! was, whether it came before), checks the order of events within each
//! order, and answers as told: acknowledge, fail, or hang.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hdrhistogram::Histogram;
use serde_json::Value;

/// What the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Acknowledge,
    /// `503`, at once.
    Fail,
}

/// What the receiver saw.
pub struct Seen {
    pub mode: Mode,
    /// Deliveries with a signature that did not verify.
    pub bad_signatures: u64,
    pub deliveries: u64,
    /// Events acknowledged, each id with how often it came.
    pub times_seen: HashMap<String, u32>,
    /// Per order: the highest sequence acknowledged.
    last_sequence: HashMap<String, i64>,
    /// Events that came before an earlier one of their order.
    pub out_of_order: u64,
    /// Order ids of the `order.created` events acknowledged.
    pub created: HashMap<String, ()>,
    /// Milliseconds from an event's commit to its acknowledged delivery.
    pub lag_ms: Histogram<u64>,
    /// When each acknowledged delivery came, and how many new events.
    pub arrivals: Vec<(Instant, u64)>,
}

impl Seen {
    /// Every delivery's signature verified and every event came in its
    /// order's sequence.
    pub fn clean(&self) -> bool {
        self.bad_signatures == 0 && self.out_of_order == 0
    }

    /// Events acknowledged more than once.
    pub fn duplicates(&self) -> u64 {
        self.times_seen.values().map(|n| u64::from(n - 1)).sum()
    }
}

#[derive(Clone)]
pub struct Receiver {
    pub seen: Arc<Mutex<Seen>>,
    secret: Arc<[u8]>,
}

impl Receiver {
    /// Listens on a free loopback port; its URL.
    pub async fn start(secret: &str) -> anyhow::Result<(Self, String)> {
        let receiver = Self {
            seen: Arc::new(Mutex::new(Seen {
                mode: Mode::Acknowledge,
                bad_signatures: 0,
                deliveries: 0,
                times_seen: HashMap::new(),
                last_sequence: HashMap::new(),
                out_of_order: 0,
                created: HashMap::new(),
                lag_ms: Histogram::new_with_bounds(1, 3_600_000, 3).expect("valid bounds"),
                arrivals: Vec::new(),
            })),
            secret: Arc::from(secret.as_bytes()),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("the receiver cannot listen")?;
        let url = format!("http://{}/hooks", listener.local_addr()?);
        let router = axum::Router::new()
            .route("/hooks", axum::routing::post(receive))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok((receiver, url))
    }

    pub fn set(&self, mode: Mode) {
        self.seen.lock().expect("receiver lock").mode = mode;
    }

    /// Order ids whose `order.created` was acknowledged.
    pub fn created(&self) -> usize {
        self.seen.lock().expect("receiver lock").created.len()
    }

    /// Waits (at most `limit`) until `want` orders' creations came; how
    /// many did.
    pub async fn wait_for_created(&self, want: usize, limit: Duration) -> usize {
        let started = Instant::now();
        while self.created() < want && started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.created()
    }

    fn verified(&self, headers: &HeaderMap, body: &[u8]) -> bool {
        headers
            .get("x-seckill-signature")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|header| {
                testkit::webhook_signed(&self.secret, header, body, chrono::Utc::now().timestamp())
            })
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let verified = receiver.verified(&headers, &body);
    let events: Vec<Value> = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["events"].as_array().cloned())
        .unwrap_or_default();
    let now = chrono::Utc::now();
    let mut seen = receiver.seen.lock().expect("receiver lock");
    seen.deliveries += 1;
    if !verified {
        seen.bad_signatures += 1;
        return StatusCode::BAD_REQUEST;
    }
    if seen.mode == Mode::Fail {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let mut new = 0;
    for event in &events {
        let id = event["id"].as_str().unwrap_or_default().to_owned();
        let count = seen.times_seen.entry(id).or_insert(0);
        *count += 1;
        if *count > 1 {
            continue;
        }
        new += 1;
        let order = event["order"]["order_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let sequence = event["sequence"].as_i64().unwrap_or(0);
        let last = seen.last_sequence.get(&order).copied().unwrap_or(0);
        if sequence != last + 1 {
            seen.out_of_order += 1;
        }
        seen.last_sequence.insert(order.clone(), last.max(sequence));
        if event["type"] == "order.created" {
            seen.created.insert(order, ());
        }
        let committed = event["created_at"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if let Some(committed) = committed {
            let ms = (now - committed.to_utc()).num_milliseconds().max(1);
            seen.lag_ms
                .saturating_record(u64::try_from(ms).unwrap_or(1));
        }
    }
    seen.arrivals.push((Instant::now(), new));
    StatusCode::NO_CONTENT
}
