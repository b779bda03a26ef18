//! Order events out to the shop: the feed (`GET /admin/events`), the
//! webhooks that push them (`webhook`), the failed list and its retry, and
//! the deletion of old acknowledged events. The events themselves are
//! written by Postgres triggers in each change's transaction (the
//! `order_events` outbox; see its migration).

pub mod body;
pub mod webhook;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::{EventId, OrderEvent};
use crate::store::{Store, StoreError};
use crate::telemetry::Chain;
pub use webhook::{signature, WebhookSettings, SIGNATURE_HEADER};

/// Most events one feed page or the failed list gives.
pub const MAX_PAGE: i64 = 1000;
/// Events deleted per statement: small, so that no sale waits on it.
const RETENTION_BATCH: i64 = 1000;
/// How often old events are looked for.
const RETENTION_EVERY: Duration = Duration::from_secs(60);
/// How often the backlog's gauges are read.
const BACKLOG_EVERY: Duration = Duration::from_secs(2);

/// Webhook deliveries, by `outcome` (`acknowledged`, `refused`).
pub const DELIVERIES: &str = "seckill_webhook_deliveries_total";
/// Events the receiver acknowledged.
pub const DELIVERED: &str = "seckill_webhook_events_delivered_total";
/// Batches that held an event failed after its retry period.
pub const FAILED_BATCHES: &str = "seckill_webhook_failed_batches_total";
/// Seconds since the oldest event not yet acknowledged (nor failed) was written.
pub const LAG: &str = "seckill_webhook_lag_seconds";
/// Events whose delivery failed, not yet retried.
pub const FAILED_EVENTS: &str = "seckill_webhook_failed_events";

/// The events of an instance.
#[derive(Clone)]
pub struct Events {
    store: Store,
    webhook: Option<WebhookSettings>,
    retention_days: u32,
}

impl Events {
    pub fn new(store: Store, webhook: Option<WebhookSettings>, retention_days: u32) -> Self {
        Self {
            store,
            webhook,
            retention_days,
        }
    }

    /// Up to `limit` events after `after`, in commit order.
    pub async fn feed(
        &self,
        after: Option<EventId>,
        limit: i64,
    ) -> Result<Vec<OrderEvent>, StoreError> {
        self.store
            .events_after(after, limit.clamp(1, MAX_PAGE))
            .await
    }

    /// The events whose delivery failed (the oldest first, at most a page).
    pub async fn failed(&self) -> Result<Vec<OrderEvent>, StoreError> {
        self.store.failed_events(MAX_PAGE).await
    }

    /// Puts the failed events back to be delivered; how many.
    pub async fn retry_failed(&self) -> Result<u64, StoreError> {
        self.store.retry_failed_events().await
    }

    /// The background work, each task until `stop`: the webhooks' sender
    /// and gauges (when a URL is set), and the deletion of old events.
    pub fn tasks(
        &self,
        stop: &CancellationToken,
    ) -> Vec<futures_util::future::BoxFuture<'static, ()>> {
        // Every series on the page from start-up (at 0 without webhooks).
        for outcome in ["acknowledged", "refused"] {
            metrics::counter!(DELIVERIES, "outcome" => outcome).increment(0);
        }
        metrics::counter!(DELIVERED).increment(0);
        metrics::counter!(FAILED_BATCHES).increment(0);
        metrics::gauge!(LAG).set(0.0);
        metrics::gauge!(FAILED_EVENTS).set(0.0);
        let mut tasks: Vec<futures_util::future::BoxFuture<'static, ()>> = vec![Box::pin(retain(
            self.store.clone(),
            self.retention_days,
            self.webhook.is_some(),
            stop.clone(),
        ))];
        if let Some(settings) = &self.webhook {
            tasks.push(Box::pin(webhook::deliver(
                self.store.clone(),
                settings.clone(),
                stop.clone(),
            )));
            tasks.push(Box::pin(gauges(self.store.clone(), stop.clone())));
        }
        tasks
    }
}

/// Deletes events older than the retention, a small batch at a time.
async fn retain(store: Store, days: u32, acknowledged_only: bool, stop: CancellationToken) {
    let days = i32::try_from(days).unwrap_or(i32::MAX);
    loop {
        loop {
            match store
                .delete_old_events(days, acknowledged_only, RETENTION_BATCH)
                .await
            {
                Ok(deleted) => {
                    metrics::counter!("seckill_events_deleted_total").increment(deleted);
                    if deleted < RETENTION_BATCH as u64 {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %Chain(&error), "cannot delete old order events yet");
                    break;
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETENTION_EVERY) => {}
        }
    }
}

/// The webhooks' lag (age of the oldest event not acknowledged) and
/// failed events, as gauges.
async fn gauges(store: Store, stop: CancellationToken) {
    loop {
        if let Ok(backlog) = store.event_backlog().await {
            metrics::gauge!(LAG).set(backlog.lag_seconds);
            metrics::gauge!(FAILED_EVENTS).set(backlog.failed as f64);
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(BACKLOG_EVERY) => {}
        }
    }
}
