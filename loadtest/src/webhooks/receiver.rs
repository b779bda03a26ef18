//! What the shop's webhook receiver (testkit's) saw, added up for the
//! report: events acknowledged once or again, the order of events within
//! each order, the delivery lag, and when the deliveries came.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use hdrhistogram::Histogram;
use testkit::{acknowledged, Delivery};

/// What the receiver's deliveries add up to.
pub struct Seen {
    pub bad_signatures: u64,
    /// Events acknowledged, each id with how often it came.
    pub times_seen: HashMap<String, u32>,
    /// Events that came before an earlier one of their order.
    pub out_of_order: u64,
    /// Milliseconds from an event's commit to its acknowledged delivery.
    pub lag_ms: Histogram<u64>,
    /// When each acknowledged delivery came, and how many new events.
    pub arrivals: Vec<(Instant, u64)>,
}

impl Seen {
    /// The receiver's deliveries so far, added up.
    pub fn of(receiver: &testkit::Receiver) -> Self {
        let mut seen = receiver.deliveries(|deliveries| {
            let mut seen = Self {
                bad_signatures: 0,
                times_seen: HashMap::new(),
                out_of_order: 0,
                lag_ms: Histogram::new_with_bounds(1, 3_600_000, 3).expect("valid bounds"),
                arrivals: Vec::new(),
            };
            let mut last_sequence: HashMap<&str, i64> = HashMap::new();
            for delivery in deliveries.iter().filter(|d| d.acknowledged) {
                let mut new = 0;
                for event in &delivery.events {
                    let id = event["id"].as_str().unwrap_or_default().to_owned();
                    let count = seen.times_seen.entry(id).or_insert(0);
                    *count += 1;
                    if *count > 1 {
                        continue;
                    }
                    new += 1;
                    let order = event["order"]["order_id"].as_str().unwrap_or_default();
                    let sequence = event["sequence"].as_i64().unwrap_or(0);
                    let last = last_sequence.entry(order).or_insert(0);
                    if sequence != *last + 1 {
                        seen.out_of_order += 1;
                    }
                    *last = (*last).max(sequence);
                    let committed = event["created_at"]
                        .as_str()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                    if let Some(committed) = committed {
                        let ms = (delivery.at_utc - committed.to_utc()).num_milliseconds();
                        seen.lag_ms
                            .saturating_record(u64::try_from(ms.max(1)).unwrap_or(1));
                    }
                }
                seen.arrivals.push((delivery.at, new));
            }
            seen
        });
        seen.bad_signatures = receiver.bad_signatures();
        seen
    }

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

/// Orders whose `order.created` was acknowledged.
pub fn created(deliveries: &[Delivery]) -> usize {
    let orders: HashSet<&str> = acknowledged(deliveries)
        .filter(|e| e["type"] == "order.created")
        .filter_map(|e| e["order"]["order_id"].as_str())
        .collect();
    orders.len()
}

/// Distinct events acknowledged.
pub fn distinct(deliveries: &[Delivery]) -> usize {
    let ids: HashSet<&str> = acknowledged(deliveries)
        .filter_map(|e| e["id"].as_str())
        .collect();
    ids.len()
}

/// Waits (at most `limit`) until `want` orders' creations came; how many
/// did.
pub async fn wait_for_created(
    receiver: &testkit::Receiver,
    want: usize,
    limit: std::time::Duration,
) -> usize {
    let pause = std::time::Duration::from_millis(50);
    receiver
        .wait_until(limit, pause, |d| created(d) >= want)
        .await;
    receiver.deliveries(created)
}
