//! Delivering the order events to the shop's webhook: batches claimed from
//! the outbox, signed as Stripe signs (`t=<unix>,v1=<hex HMAC-SHA256 of
//! "<t>.<body>">`), POSTed without following redirects, acknowledged by a
//! `2xx` within the timeout, retried with exponential backoff and jitter,
//! failed after the retry period.

use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use super::body::EventsBody;
use crate::store::Store;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "X-Seckill-Signature";
/// The first retry comes within this (less its jitter).
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
/// Retries are never further apart than this.
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// How often an idle sender looks for new events.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How long a claim outlives the delivery's timeout: a sender killed
/// mid-delivery leaves its batch to another within that.
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

/// Delivers until `stop`: one batch at a time per instance; the other
/// instances take other batches.
pub async fn deliver(store: Store, settings: WebhookSettings, stop: CancellationToken) {
    let client = reqwest::Client::builder()
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client with rustls and no other settings builds");
    let lease = settings.timeout + LEASE_MARGIN;
    let mut failures = 0u32;
    loop {
        let wait = match store.claim_events(i64::from(settings.batch), lease).await {
            Err(error) => {
                tracing::warn!(%error, "cannot claim order events to deliver");
                Duration::from_secs(1)
            }
            Ok(events) if events.is_empty() => IDLE_POLL,
            Ok(events) => {
                let rows: Vec<i64> = events.iter().map(|e| e.id.row).collect();
                let count = rows.len() as u64;
                let delivery = post(&client, &settings, EventsBody::of(events)).await;
                metrics::counter!("seckill_webhook_deliveries_total", "outcome" => delivery.outcome())
                    .increment(1);
                match delivery {
                    Delivery::Acknowledged => {
                        failures = 0;
                        metrics::counter!("seckill_webhook_events_delivered_total")
                            .increment(count);
                        if let Err(error) = store.acknowledge_events(rows).await {
                            // Delivered again when the claim runs out: at
                            // least once.
                            tracing::warn!(%error, "a delivered batch could not be marked; it will be sent again");
                        }
                        Duration::ZERO
                    }
                    Delivery::Refused(why) => {
                        failures = failures.saturating_add(1);
                        let wait = backoff(failures);
                        tracing::warn!(reason = %why, retry_in_ms = wait.as_millis() as u64, "webhook delivery failed");
                        match store
                            .delivery_failed(rows, why, wait, settings.retry_for)
                            .await
                        {
                            Ok(0) => {}
                            Ok(failed) => {
                                metrics::counter!("seckill_webhook_failed_batches_total")
                                    .increment(1);
                                tracing::error!(events = failed, "webhook events failed after their retry period; see GET /admin/webhooks/failed");
                            }
                            Err(error) => {
                                tracing::warn!(%error, "cannot record a failed delivery; its claim will run out")
                            }
                        }
                        wait
                    }
                }
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
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
