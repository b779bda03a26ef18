//! The one clock every instance judges a sale's window by: Redis's, which
//! already stamps the order ids. Each instance measures its offset from
//! Redis's `TIME` every second and reads "now" as its own clock plus that
//! offset, so instances whose clocks disagree still open and close a sale
//! at the same moment, within half a round trip to Redis.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::metric;
use crate::kv::{Kv, KvError};

/// How often the offset is measured again.
const RESYNC: Duration = Duration::from_secs(1);

/// Redis's clock as seen from this instance. Cheap to clone.
#[derive(Clone)]
pub struct SaleClock {
    inner: Arc<Inner>,
}

struct Inner {
    redis: Kv,
    /// Redis's clock minus ours, in microseconds (0 until measured).
    offset_micros: AtomicI64,
    /// Added to this host's clock: a fault to inject (a host whose clock
    /// is off), zero in production.
    local_skew: TimeDelta,
}

impl SaleClock {
    /// A clock that measures itself against `redis` every second from now
    /// on, for as long as a handle on it lives.
    pub fn start(redis: Kv, local_skew: TimeDelta) -> Self {
        let clock = Self {
            inner: Arc::new(Inner {
                redis,
                offset_micros: AtomicI64::new(0),
                local_skew,
            }),
        };
        tokio::spawn(resync(Arc::downgrade(&clock.inner)));
        clock
    }

    /// Now, by Redis's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.local() + TimeDelta::microseconds(self.inner.offset_micros.load(Ordering::Relaxed))
    }

    /// Redis's clock minus this host's, as last measured.
    pub fn offset(&self) -> TimeDelta {
        TimeDelta::microseconds(self.inner.offset_micros.load(Ordering::Relaxed))
    }

    fn local(&self) -> DateTime<Utc> {
        Utc::now() + self.inner.local_skew
    }

    /// Measures the offset now: Redis's `TIME` against the middle of the
    /// round trip that fetched it. Until it succeeds the last offset stays.
    pub async fn sync(&self) -> Result<(), KvError> {
        let sent = self.local();
        let (secs, micros): (i64, i64) = self.inner.redis.query(&redis::cmd("TIME")).await?;
        let received = self.local();
        let theirs = secs * 1_000_000 + micros;
        let ours = sent.timestamp_micros() + (received - sent).num_microseconds().unwrap_or(0) / 2;
        let offset = theirs - ours;
        self.inner.offset_micros.store(offset, Ordering::Relaxed);
        metrics::gauge!(metric::CLOCK_OFFSET_SECONDS).set(offset as f64 / 1e6);
        Ok(())
    }
}

async fn resync(clock: Weak<Inner>) {
    loop {
        tokio::time::sleep(RESYNC).await;
        let Some(inner) = clock.upgrade() else {
            return;
        };
        let clock = SaleClock { inner };
        if let Err(error) = clock.sync().await {
            tracing::debug!(%error, "could not read Redis's clock; keeping the last offset");
        }
    }
}
