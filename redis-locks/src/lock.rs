//! The reentrant lock and its guard, the scripts that take and give back
//! holds, and waiting for a turn on the lock's channel.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, Script, ScriptInvocation};

use super::client::{new_request_id, Shared};
use super::guard::{GuardCore, GuardedLock, Term};
use super::pubsub::{Subscriber, Woken};
use super::watchdog::Renewal;
use super::{Acquired, Lease, LockError, Owner, Released};

/// One named lock. Cheap to clone; holds no connection.
#[derive(Clone)]
pub struct Lock {
    pub(super) shared: Arc<Shared>,
    pub(super) key: Arc<str>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock").field("key", &self.key).finish()
    }
}

impl GuardedLock for Lock {
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn hash_key(&self) -> &Arc<str> {
        &self.key
    }
}

impl Lock {
    /// The Redis key of this lock.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key holding this lock's last fencing token.
    pub(super) fn fence_key(&self) -> String {
        format!("{}:fence", self.key)
    }

    /// The channel on which this lock's release is announced.
    pub fn channel(&self) -> String {
        format!("{}:released", self.key)
    }

    /// Takes the lock for `owner`, waiting at most `wait` (on the lock's
    /// channel, not polling). `Ok(None)`: still held when `wait` ran out.
    pub async fn acquire(
        &self,
        owner: &Owner,
        wait: Duration,
        lease: impl Into<Lease>,
    ) -> Result<Option<LockGuard>, LockError> {
        let lease = lease.into();
        wait_turn(&self.shared.subscriber, &self.channel(), wait, || async {
            Ok(match self.try_acquire(owner, lease).await? {
                Acquired::Yes(guard) => Ok(guard),
                Acquired::HeldByOther { lease_left } => Err(lease_left),
            })
        })
        .await
    }

    /// Frees the lock whoever holds it (for operators) and wakes its
    /// waiters; the holder is not told. Returns whether it was held.
    pub async fn force_unlock(&self) -> Result<bool, LockError> {
        let deleted: i64 = self
            .shared
            .conn
            .invoke(self.shared.force_unlock.key(&*self.key).key(self.channel()))
            .await?;
        Ok(deleted == 1)
    }

    /// Whether `owner` holds the lock.
    pub async fn is_held_by(&self, owner: &Owner) -> Result<bool, LockError> {
        Ok(self.hold_count(owner).await? > 0)
    }

    /// The lease left on the lock: `None` when it is free (or has no lease).
    pub async fn remaining_lease(&self) -> Result<Option<Duration>, LockError> {
        let pttl: i64 = self
            .shared
            .conn
            .query(redis::cmd("PTTL").arg(&*self.key))
            .await?;
        Ok(lease_left(pttl))
    }

    /// Takes the lock without waiting; if `owner` holds it already, one more
    /// hold, and the lease starts again. Resent on transient errors.
    pub async fn try_acquire(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
    ) -> Result<Acquired, LockError> {
        self.try_acquire_request(owner, lease, &new_request_id())
            .await
    }

    /// [`Lock::try_acquire`] under the caller's request id: sent again with
    /// it, it gets the first answer and takes no second hold.
    pub async fn try_acquire_request(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
        request_id: &str,
    ) -> Result<Acquired, LockError> {
        let term = self.shared.resolve(lease.into());
        let take = HoldChange::new(self, owner, Take(term), request_id.to_owned());
        self.shared.change_one(&take).await
    }

    /// Gives back one hold of `owner`, renewing the lease of those left;
    /// [`LockError::NotHeld`] (and no change) if `owner` holds none.
    pub async fn release(&self, owner: &Owner, lease: Duration) -> Result<Released, LockError> {
        self.release_request(owner, lease, &new_request_id()).await
    }

    /// [`Lock::release`] under the caller's request id: sent again with it,
    /// it gets the first answer and gives back no second hold.
    pub async fn release_request(
        &self,
        owner: &Owner,
        lease: Duration,
        request_id: &str,
    ) -> Result<Released, LockError> {
        self.give_back(owner, GiveBack(lease, None), request_id.to_owned())
            .await
    }

    /// Gives back a hold of `owner` as `kind` says (of any tenure, or of a
    /// guard's only).
    async fn give_back(
        &self,
        owner: &Owner,
        kind: GiveBack,
        request_id: String,
    ) -> Result<Released, LockError> {
        let give_back = HoldChange::new(self, owner, kind, request_id);
        self.shared.change_one(&give_back).await
    }

    /// Reads an acquire answer: `(1, holds, token)` or `(0, pttl, 0)`.
    pub(super) fn granted(
        &self,
        owner: &Owner,
        term: Term,
        (granted, value, fence): (i64, i64, i64),
    ) -> Result<LockGuard, Option<Duration>> {
        if granted == 1 {
            Ok(LockGuard::granted(self.clone(), owner, term, fence))
        } else {
            Err(lease_left(value))
        }
    }

    /// How many holds `owner` has on this lock (0 when none).
    pub async fn hold_count(&self, owner: &Owner) -> Result<u32, LockError> {
        let holds: Option<u32> = self
            .shared
            .conn
            .query(redis::cmd("HGET").arg(&*self.key).arg(owner.as_str()))
            .await?;
        Ok(holds.unwrap_or(0))
    }

    /// Whether anyone holds the lock.
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        let exists: bool = self
            .shared
            .conn
            .query(redis::cmd("EXISTS").arg(&*self.key))
            .await?;
        Ok(exists)
    }
}

/// One hold of a [`Lock`] or [`FairLock`](super::FairLock); dropped without
/// `unlock`, it is given back in the background.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    pub(super) core: GuardCore<Lock>,
    fence: i64,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.debug(f, "LockGuard").finish()
    }
}

impl LockGuard {
    /// A hold just granted by Redis, with its fencing token.
    pub(super) fn granted(lock: Lock, owner: &Owner, term: Term, fence: i64) -> Self {
        Self {
            core: GuardCore::granted(lock, owner, term, || Renewal::Plain),
            fence,
        }
    }

    /// The owner this hold belongs to.
    pub fn owner(&self) -> &Owner {
        &self.core.owner
    }

    /// The lock this hold is on.
    pub fn lock(&self) -> &Lock {
        &self.core.lock
    }

    /// This hold's fencing token: larger than every earlier holder's
    /// (`max(last + 1, Redis's clock in µs)`; a reentrant acquisition keeps
    /// it). A store that refuses writes with a smaller token than the
    /// largest it accepted refuses a holder that stalled past its lease:
    ///
    /// ```rust
    /// use std::time::Duration;
    ///
    /// use redis_locks::{Acquired, LockClient, LockError};
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// # let locks = LockClient::new(client.clone(), format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple()));
    /// let lock = locks.lock("account:7");
    /// let Acquired::Yes(stalled) = lock.try_acquire(&locks.owner("job-1"), Duration::from_millis(100)).await? else {
    ///     panic!("a new lock is free");
    /// };
    /// tokio::time::sleep(Duration::from_millis(250)).await; // past its lease
    /// let Acquired::Yes(next) = lock.try_acquire(&locks.owner("job-2"), Duration::from_secs(10)).await? else {
    ///     panic!("the first lease has run out");
    /// };
    /// assert!(next.fence() > stalled.fence()); // the store refuses job 1 now
    /// assert!(matches!(stalled.unlock().await, Err(LockError::NotHeld { .. })));
    /// next.unlock().await?;
    /// # let mut conn = client.get_multiplexed_async_connection().await?;
    /// # let fence = format!("{}:fence", lock.key());
    /// # redis::cmd("DEL").arg(lock.key()).arg(fence).query_async::<()>(&mut conn).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// Whether the hold is lost: the watchdog found it gone (or could not
    /// renew it for a whole lease), or its fixed lease ran out.
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Resolves when the hold is lost: race it against the work.
    pub async fn lost(&self) {
        self.core.lost().await;
    }

    /// Gives the hold back. `Err(NotHeld)`: the lease ran out first, and
    /// someone else may have held the lock meanwhile.
    pub async fn unlock(mut self) -> Result<Released, LockError> {
        let fence = self.fence;
        let (lock, owner, lease) = self.core.give_back();
        lock.give_back(owner, GiveBack(lease, Some(fence)), new_request_id())
            .await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let fence = self.fence;
        self.core
            .release_on_drop(move |lock, owner, lease| async move {
                lock.give_back(&owner, GiveBack(lease, Some(fence)), new_request_id())
                    .await
                    .map(drop)
            });
    }
}

/// One lock's part of a call of the acquire or release script, which take
/// per lock its keys, then lease, owner and request id.
pub(super) struct HoldChange<'a, K> {
    pub(super) lock: &'a Lock,
    owner: &'a Owner,
    kind: K,
    request_id: String,
}

/// What differs between taking a hold and giving one back.
pub(super) trait ChangeKind {
    type Answer: FromRedisValue + Clone;
    type Output;
    /// The script, and the last argument of its call.
    fn script(shared: &Shared) -> (&Script, u64);
    fn lease(&self) -> Duration;
    /// Adds the keys that follow the lock's own.
    fn add_keys(lock: &Lock, invocation: &mut ScriptInvocation<'_>);
    /// Adds the arguments that follow the lease, owner and request id.
    fn add_args(&self, _invocation: &mut ScriptInvocation<'_>) {}
    fn answer(
        &self,
        lock: &Lock,
        owner: &Owner,
        answer: Option<Self::Answer>,
    ) -> Result<Self::Output, LockError>;
}

impl<'a, K: ChangeKind> HoldChange<'a, K> {
    pub(super) fn new(lock: &'a Lock, owner: &'a Owner, kind: K, request_id: String) -> Self {
        Self {
            lock,
            owner,
            kind,
            request_id,
        }
    }

    pub(super) fn add(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.key(&*self.lock.key);
        K::add_keys(self.lock, invocation);
        invocation
            .arg(lease_ms(self.kind.lease()))
            .arg(self.owner.as_str())
            .arg(self.request_id.as_str());
        self.kind.add_args(invocation);
    }

    /// This lock's answer (`None`: the script gave none).
    pub(super) fn answer(&self, answer: Option<K::Answer>) -> Result<K::Output, LockError> {
        self.kind.answer(self.lock, self.owner, answer)
    }
}

/// An acquisition (`lua/lock_acquire.lua`) under this term.
pub(super) struct Take(pub(super) Term);

impl ChangeKind for Take {
    type Answer = (i64, i64, i64);
    type Output = Acquired;

    fn script(shared: &Shared) -> (&Script, u64) {
        (&shared.acquire, FENCE_KEY_TTL_MS)
    }

    fn lease(&self) -> Duration {
        self.0.lease
    }

    fn add_keys(lock: &Lock, invocation: &mut ScriptInvocation<'_>) {
        invocation.key(lock.fence_key());
    }

    fn answer(
        &self,
        lock: &Lock,
        owner: &Owner,
        answer: Option<Self::Answer>,
    ) -> Result<Acquired, LockError> {
        Ok(
            match lock.granted(owner, self.0, answer.unwrap_or((0, -1, 0))) {
                Ok(guard) => Acquired::Yes(guard),
                Err(lease_left) => Acquired::HeldByOther { lease_left },
            },
        )
    }
}

/// A release (`lua/lock_release.lua`) renewing the holds left for this
/// lease; of the tenure whose fencing token is given (a guard's), or of any
/// hold of the owner.
pub(super) struct GiveBack(pub(super) Duration, pub(super) Option<i64>);

impl ChangeKind for GiveBack {
    /// The holds left, or -1: not held.
    type Answer = i64;
    type Output = Released;

    fn script(shared: &Shared) -> (&Script, u64) {
        (&shared.release, FENCE_KEY_TTL_MS)
    }

    fn lease(&self) -> Duration {
        self.0
    }

    fn add_keys(lock: &Lock, invocation: &mut ScriptInvocation<'_>) {
        invocation.key(lock.channel()).key(lock.fence_key());
    }

    fn add_args(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.arg(self.1.map_or_else(String::new, |fence| fence.to_string()));
    }

    fn answer(&self, lock: &Lock, owner: &Owner, left: Option<i64>) -> Result<Released, LockError> {
        match left.unwrap_or(-1) {
            0 => Ok(Released::Free),
            n if n > 0 => Ok(Released::StillHeld(u32::try_from(n).unwrap_or(u32::MAX))),
            _ => Err(LockError::not_held(&lock.key, owner)),
        }
    }
}

/// Runs `attempt` until it wins or `wait` is spent, sleeping between tries
/// until a message on `channel` or the end of the holder's lease.
pub(super) async fn wait_turn<G, F, Fut>(
    subscriber: &Arc<Subscriber>,
    channel: &str,
    wait: Duration,
    mut attempt: F,
) -> Result<Option<G>, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<G, Option<Duration>>, LockError>>,
{
    let deadline = deadline_after(wait);
    if let Ok(won) = attempt().await? {
        return Ok(Some(won));
    }
    // Subscribed after the first failure; marking the messages seen before
    // each attempt catches a release between the attempt and the sleep.
    let mut subscription = None;
    loop {
        if Instant::now() >= deadline {
            return Ok(None);
        }
        let sub = match &mut subscription {
            Some(sub) => sub,
            None => subscription.insert(subscriber.subscribe(channel).await?),
        };
        sub.mark_seen();
        let lease_left = match attempt().await? {
            Ok(won) => return Ok(Some(won)),
            Err(lease_left) => lease_left,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        // No one publishes an expiry: wake 1 ms past the lease at the latest.
        let nap = lease_left.map_or(left, |l| left.min(l + Duration::from_millis(1)));
        if sub.wait(nap).await == Woken::Lost {
            subscription = None;
        }
    }
}

/// Lifetime of a fencing-token key (tokens still grow with Redis's clock).
pub(super) const FENCE_KEY_TTL_MS: u64 = 7 * 86_400_000;

/// The lease left on a lock, from Redis's milliseconds (negative: none).
pub(super) fn lease_left(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

pub(super) fn lease_ms(lease: Duration) -> u64 {
    // PEXPIRE 0 would delete the key at once; a lease is at least 1 ms.
    // And at most what PEXPIRE takes (a longer one failed after the hold
    // was written, leaving a key with no expiry): about 292,000 years.
    u64::try_from(lease.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, MOST_LEASE_MS)
}

/// The longest lease in milliseconds: PEXPIRE adds it to Redis's clock in
/// milliseconds, and refuses a sum past `i64::MAX`.
const MOST_LEASE_MS: u64 = 1 << 53;

/// `wait` from now (see [`later`]).
pub(super) fn deadline_after(wait: Duration) -> Instant {
    later(Instant::now(), wait)
}

/// `by` after `at`, or a century after it where the clock cannot count
/// so far (`Duration::MAX`: for ever).
pub(super) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}
