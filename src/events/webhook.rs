//! Delivering the order events to the shop's webhook: batches read from
//! the feed after the webhooks' cursor, signed as Stripe signs
//! (`t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`), POSTed without
//! following redirects, acknowledged by a `2xx` within the timeout (the
//! cursor then moves past them), retried with exponential backoff and
//! jitter, failed after the retry period (held back, with every later
//! event of their orders, until an admin puts them back).

use std::collections::HashSet;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use super::body::EventsBody;
use crate::domain::{EventId, OrderEvent, OrderId};
use crate::store::{BatchEnd, BatchOf, FeedEvent, Store, StoreError};

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "X-Seckill-Signature";
/// The first retry comes within this (less its jitter).
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
/// Retries are never further apart than this.
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// How often an idle sender looks for new events.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long the sender's lease outlives the delivery's timeout: a sender
/// killed mid-delivery leaves its batch to another instance within that.
const LEASE_MARGIN: Duration = Duration::from_secs(10);

/// Where and how events are delivered.
#[derive(Clone)]
pub struct WebhookSettings {
    pub url: reqwest::Url,
    pub secret: Vec<u8>,
    pub batch: u32,
    pub timeout: Duration,
    /// Retried for this long from a batch's first attempt, then failed.
    pub retry_for: Duration,
}

/// The header value that signs `body`, sent at `unix_seconds`.
pub fn signature(secret: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={unix_seconds},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// The wait before the next attempt after `failures` failures in a row:
/// 2 s, 4 s, 8 s ... up to 10 minutes, each cut by up to half at random so
/// that instances and receivers coming back do not retry in step.
pub fn backoff(failures: u32) -> Duration {
    let base = FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    base.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// What one delivery came to.
enum Delivery {
    Acknowledged,
    Refused(String),
}

impl Delivery {
    fn outcome(&self) -> &'static str {
        match self {
            Self::Acknowledged => "acknowledged",
            Self::Refused(_) => "refused",
        }
    }
}

/// Delivers until `stop`. One instance at a time sends (the holder of the
/// cursor's lease); the others wait to take over when its lease runs out,
/// or at once when its instance stops (it gives the lease back).
pub async fn deliver(store: Store, settings: WebhookSettings, stop: CancellationToken) {
    let client = reqwest::Client::builder()
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client with rustls and no other settings builds");
    let me = uuid::Uuid::new_v4();
    loop {
        // A bug in one step must not end deliveries for good: it is
        // logged, and the next step starts from the cursor again.
        let step =
            std::panic::AssertUnwindSafe(deliver_once(&store, &settings, &client, me, &stop));
        let wait = match futures_util::FutureExt::catch_unwind(step).await {
            Ok(Ok(wait)) => wait,
            Ok(Err(error)) => {
                tracing::warn!(%error, "webhooks: Postgres cannot be reached; trying again");
                Duration::from_secs(1)
            }
            Err(_) => {
                tracing::error!("webhooks: a delivery step panicked; trying again");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => {
                // Within the dependency deadline, as every query; if it
                // fails, the lease runs out as for an instance killed.
                if let Err(error) = store.release_webhook_lease(me).await {
                    tracing::warn!(%error, "webhooks: the lease was not given back; it runs out");
                }
                return;
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One step: take the lease, send the next batch (held-back events put
/// back for a retry first, when due; the feed otherwise), and record what
/// came of it. How long to wait before the next step.
async fn deliver_once(
    store: &Store,
    settings: &WebhookSettings,
    client: &reqwest::Client,
    me: uuid::Uuid,
    stop: &CancellationToken,
) -> Result<Duration, StoreError> {
    let lease = settings.timeout + LEASE_MARGIN;
    let Some(cursor) = store.take_webhook_lease(me, lease).await? else {
        // Another instance sends; this one takes over if it dies.
        return Ok(Duration::from_secs(1));
    };
    let batch = i64::from(settings.batch);
    // The lease said whether any wait: the usual step reads no retries.
    let put_back = match cursor.retries {
        Some(attempts) if attempts.due_in.is_zero() => {
            Some((attempts, store.webhook_retries(batch).await?))
        }
        _ => None,
    };
    let (of, attempts, send, held) = match put_back.filter(|(_, retries)| !retries.is_empty()) {
        Some((attempts, mut retries)) => {
            retries.truncate(one_event_per_order(&retries));
            (BatchOf::PutBack, attempts, retries, Vec::new())
        }
        None => {
            if !cursor.feed.due_in.is_zero() {
                // Backing off after a failure (the lease is renewed
                // meanwhile), or until events put back are due (none was,
                // or those due wait behind an earlier event of their order).
                let put_back = match cursor.retries {
                    Some(r) if !r.due_in.is_zero() => r.due_in,
                    _ => Duration::MAX,
                };
                return Ok(cursor.feed.due_in.min(put_back).min(Duration::from_secs(1)));
            }
            let feed = store.feed(cursor.after, cursor.failing_upto, batch).await?;
            if feed.is_empty() {
                if let Some(upto) = cursor.failing_upto {
                    // Nothing left of the failing batch (none is expected):
                    // the cursor moves to its end, and the feed goes on.
                    let of = BatchOf::Feed { upto };
                    store.webhook_advance(me, of, BatchEnd::default()).await?;
                    return Ok(Duration::ZERO);
                }
                return Ok(IDLE_POLL);
            }
            let (upto, send, held) = feed_batch(feed);
            (BatchOf::Feed { upto }, cursor.feed, send, held)
        }
    };
    let retried: Vec<EventId> = match of {
        BatchOf::PutBack => send.iter().map(|e| e.id).collect(),
        BatchOf::Feed { .. } => Vec::new(),
    };
    let delivered = |held| BatchEnd {
        held,
        retried,
        ..BatchEnd::default()
    };
    if send.is_empty() {
        store.webhook_advance(me, of, delivered(held)).await?;
        return Ok(Duration::ZERO);
    }
    let sent: Vec<(EventId, OrderId)> = send.iter().map(|e| (e.id, e.order.id)).collect();
    let began = std::time::Instant::now();
    // A stop does not wait for a receiver that hangs: the batch is left
    // as it was (the next holder sends it, at least once), and the lease
    // is given back at once.
    let delivery = tokio::select! {
        biased;
        () = stop.cancelled() => return Ok(Duration::ZERO),
        delivery = post(client, settings, EventsBody::of(send)) => delivery,
    };
    metrics::counter!(super::DELIVERIES, "outcome" => delivery.outcome()).increment(1);
    match delivery {
        Delivery::Acknowledged => {
            metrics::counter!(super::DELIVERED).increment(sent.len() as u64);
            // A lease lost meanwhile: the next holder sends the batch again
            // (at least once).
            store.webhook_advance(me, of, delivered(held)).await?;
            Ok(Duration::ZERO)
        }
        Delivery::Refused(why) => {
            // Attempts start at most MAX_BACKOFF apart: the wait counts
            // from the failure, which came this long after the start.
            let failures = u32::try_from(attempts.failures).unwrap_or(0);
            let wait = backoff(failures.saturating_add(1))
                .min(MAX_BACKOFF.saturating_sub(began.elapsed()));
            tracing::warn!(reason = %why, retry_in_ms = wait.as_millis() as u64, "webhook delivery failed");
            let Some((_, given_up)) = store
                .webhook_failed_attempt(me, of, wait, settings.retry_for, why.clone())
                .await?
            else {
                return Ok(Duration::ZERO);
            };
            if given_up {
                let mut failed = sent;
                failed.extend(held);
                metrics::counter!(super::FAILED_BATCHES).increment(1);
                tracing::error!(events = failed.len(), "webhook events failed after their retry period; see GET /admin/webhooks/failed");
                let end = BatchEnd {
                    failed,
                    error: why,
                    ..BatchEnd::default()
                };
                store.webhook_advance(me, of, end).await?;
                return Ok(Duration::ZERO);
            }
            Ok(wait.min(Duration::from_secs(1)))
        }
    }
}

/// The next batch of the feed, read up to its limit: where it ends, the
/// events to send, and those held back behind an earlier event of their
/// order. It ends before a second event of an order it sends: an event
/// goes out only after every earlier one of its order was acknowledged,
/// not in the same delivery.
fn feed_batch(feed: Vec<FeedEvent>) -> (EventId, Vec<OrderEvent>, Vec<(EventId, OrderId)>) {
    let mut orders = HashSet::new();
    let (mut send, mut held) = (Vec::new(), Vec::new());
    let mut upto = feed[0].event.id;
    for FeedEvent {
        event,
        held: behind,
    } in feed
    {
        let id = event.id;
        if behind {
            held.push((id, event.order.id));
        } else if orders.insert(event.order.id) {
            send.push(event);
        } else {
            break;
        }
        upto = id;
    }
    (upto, send, held)
}

/// How many of `events` (oldest first) form a batch with one event per
/// order at most: an order's next event waits for this one's
/// acknowledgement.
fn one_event_per_order(events: &[OrderEvent]) -> usize {
    let mut orders = HashSet::new();
    events
        .iter()
        .take_while(|e| orders.insert(e.order.id))
        .count()
}

/// POSTs one batch, signed.
async fn post(client: &reqwest::Client, settings: &WebhookSettings, batch: EventsBody) -> Delivery {
    let body = serde_json::to_vec(&batch).expect("events serialize");
    let now = chrono::Utc::now().timestamp();
    let sent = client
        .post(settings.url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature(&settings.secret, now, &body))
        .body(body)
        .send()
        .await;
    match sent {
        Ok(answer) if answer.status().is_success() => Delivery::Acknowledged,
        Ok(answer) => Delivery::Refused(format!("the receiver answered {}", answer.status())),
        Err(error) if error.is_timeout() => Delivery::Refused(format!(
            "the receiver did not answer within {} ms",
            settings.timeout.as_millis()
        )),
        Err(error) => Delivery::Refused(format!(
            "cannot reach the receiver: {}",
            error.without_url()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_hmac_of_the_time_a_dot_and_the_body() {
        // Python's hmac.new(b"k", b"12.{}", hashlib.sha256).hexdigest().
        assert_eq!(
            signature(b"k", 12, b"{}"),
            "t=12,v1=ec1ceb64e9d1e0dbe6a67a72bc67456b853bc92a80adb39414059e96aea60b97"
        );
        assert_ne!(signature(b"k", 13, b"{}"), signature(b"k", 12, b"{}"));
        assert_ne!(signature(b"other", 12, b"{}"), signature(b"k", 12, b"{}"));
    }

    #[test]
    fn backoff_doubles_from_two_seconds_to_ten_minutes_with_jitter() {
        for _ in 0..100 {
            let first = backoff(1);
            assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2));
            let third = backoff(3);
            assert!(third >= Duration::from_secs(4) && third <= Duration::from_secs(8));
            let late = backoff(40);
            assert!(late >= Duration::from_secs(300) && late <= Duration::from_secs(600));
        }
    }
}
