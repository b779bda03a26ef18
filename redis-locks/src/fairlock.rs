//! Fair locks, on the model of Redisson's RFairLock.

use std::time::{Duration, Instant};

use super::lock::{lease_ms, wait_turn, FENCE_KEY_TTL_MS};
use super::{Lease, Lock, LockError, LockGuard, Owner};

/// How long a waiter keeps its place without trying again: a live one tries
/// at least every third of it, so one that died blocks the line this long
/// at most (Redisson's `threadWaitTime` is 5 s too).
pub const WAITER_HEARTBEAT: Duration = Duration::from_secs(5);

/// A reentrant lock granted in the order owners asked, with the same hash
/// and guard as [`Lock`]. A waiter keeps its place while it waits and tries
/// again at least every third of [`WAITER_HEARTBEAT`], so one that died
/// blocks the line for that long at most. Cheap to clone.
#[derive(Clone)]
pub struct FairLock {
    pub(super) lock: Lock,
}

impl FairLock {
    /// The Redis key of this lock's hash.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    fn queue_key(&self) -> String {
        format!("{}:queue", self.lock.key)
    }

    fn deadlines_key(&self) -> String {
        format!("{}:deadlines", self.lock.key)
    }

    async fn attempt(
        &self,
        owner: &Owner,
        lease: Lease,
        wait: Duration,
    ) -> Result<Result<LockGuard, Option<Duration>>, LockError> {
        let shared = &self.lock.shared;
        let term = shared.resolve(lease);
        let answer: (i64, i64, i64) = shared
            .conn
            .invoke(
                shared
                    .fair_acquire
                    .key(&*self.lock.key)
                    .key(self.lock.fence_key())
                    .key(self.queue_key())
                    .key(self.deadlines_key())
                    .arg(lease_ms(term.lease))
                    .arg(owner.as_str())
                    .arg(FENCE_KEY_TTL_MS)
                    .arg(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
                    .arg(lease_ms(WAITER_HEARTBEAT)),
            )
            .await?;
        Ok(self.lock.granted(owner, term, answer))
    }

    /// Takes the lock for `owner` when its turn comes, waiting at most `wait`;
    /// `Ok(None)` when the wait ran out (the owner leaves the line).
    pub async fn acquire(
        &self,
        owner: &Owner,
        wait: Duration,
        lease: impl Into<Lease>,
    ) -> Result<Option<LockGuard>, LockError> {
        let lease = lease.into();
        let until = super::lock::deadline_after(wait);
        let got = wait_turn(
            &self.lock.shared.subscriber,
            &self.lock.channel(),
            wait,
            || {
                self.attempt(
                    owner,
                    lease,
                    until.saturating_duration_since(Instant::now()),
                )
            },
        )
        .await;
        if !matches!(got, Ok(Some(_))) {
            // Give up our place at once rather than when our wait ends.
            if let Err(error) = self.leave(owner).await {
                tracing::debug!(%error, "leaving a fair lock's queue failed; the deadline will");
            }
        }
        got
    }

    /// Takes the lock if it is free and nobody waits.
    pub async fn try_acquire(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
    ) -> Result<Option<LockGuard>, LockError> {
        self.acquire(owner, Duration::ZERO, lease).await
    }

    async fn leave(&self, owner: &Owner) -> Result<(), LockError> {
        let shared = &self.lock.shared;
        let _: i64 = shared
            .conn
            .invoke(
                shared
                    .fair_leave
                    .key(self.queue_key())
                    .key(self.deadlines_key())
                    .key(self.lock.channel())
                    .arg(owner.as_str()),
            )
            .await?;
        Ok(())
    }

    /// Owners waiting in line now, first first.
    pub async fn queue(&self) -> Result<Vec<String>, LockError> {
        Ok(self
            .lock
            .shared
            .conn
            .query(redis::cmd("LRANGE").arg(self.queue_key()).arg(0).arg(-1))
            .await?)
    }

    /// The reentrant lock underneath, for `is_locked`, `hold_count`, ...
    pub fn as_lock(&self) -> &Lock {
        &self.lock
    }
}
