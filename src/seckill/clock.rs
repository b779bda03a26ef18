//! The one clock every instance judges a sale's window by: Redis's, which
//! already stamps the order ids. Each instance measures its offset from
//! Redis's `TIME` every second and reads "now" as its own clock plus that
//! offset, so instances whose clocks disagree still open and close a sale
//! at the same moment, within half a round trip to Redis. A slow round
//! trip (Redis resumed after a freeze) moves the offset only as far as it
//! proves the last one wrong.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
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
    /// Whether `offset_micros` was measured yet.
    measured: AtomicBool,
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
                measured: AtomicBool::new(false),
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
    /// round trip that fetched it (see [`next_offset`]). Until it succeeds
    /// the last offset stays.
    pub async fn sync(&self) -> Result<(), KvError> {
        let sent = self.local();
        let (secs, micros): (i64, i64) = self.inner.redis.query(&redis::cmd("TIME")).await?;
        let received = self.local();
        let theirs = secs * 1_000_000 + micros;
        let half_trip = (received - sent).num_microseconds().unwrap_or(0).max(0) / 2;
        let measured = theirs - (sent.timestamp_micros() + half_trip);
        let last = self
            .inner
            .measured
            .load(Ordering::Relaxed)
            .then(|| self.inner.offset_micros.load(Ordering::Relaxed));
        let offset = next_offset(last, measured, half_trip);
        self.inner.offset_micros.store(offset, Ordering::Relaxed);
        self.inner.measured.store(true, Ordering::Relaxed);
        metrics::gauge!(metric::CLOCK_OFFSET_SECONDS).set(offset as f64 / 1e6);
        Ok(())
    }
}

/// The offset after a sample that `measured` it with a round trip of
/// twice `half_trip`: the true offset lies within `half_trip` of the
/// measure. The `last` offset stays where the sample cannot tell it wrong
/// (a slow sample, of Redis resumed after a freeze, is off by up to half
/// its trip) and moves to the nearest offset the sample allows where it
/// can (a clock stepped, or a fast sample narrowing it). The first sample
/// is taken as it is.
fn next_offset(last: Option<i64>, measured: i64, half_trip: i64) -> i64 {
    match last {
        None => measured,
        Some(last) => last.clamp(measured - half_trip, measured + half_trip),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_sample_moves_the_offset_only_as_far_as_it_proves_it_wrong() {
        // The first sample is taken, however slow.
        assert_eq!(next_offset(None, 700, 400_000), 700);
        // A fast sample (2 ms round trip) sets it to within a millisecond.
        assert_eq!(next_offset(Some(0), 5_000, 1_000), 4_000);
        assert_eq!(next_offset(Some(4_500), 5_000, 1_000), 4_500);
        // Redis resumed after a freeze: a round trip of 1.6 s whose middle
        // is 700 ms off leaves a good offset where it was.
        assert_eq!(next_offset(Some(100), 700_100, 800_000), 100);
        // Redis's clock stepped 10 s: even a slow sample moves it there,
        // to within its half trip.
        assert_eq!(next_offset(Some(100), 10_000_000, 800_000), 9_200_000);
        assert_eq!(next_offset(Some(100), -10_000_000, 800_000), -9_200_000);
    }
}
