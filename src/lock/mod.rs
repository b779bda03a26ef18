//! Reentrant distributed locks on Redis, on the model of Redisson's RLock.
//!
//! A lock is a Redis hash of owner -> hold count with a lease on the key.
//! The owner is explicit: this process's UUID plus an id the caller picks
//! (a request, a job, a session), never an OS thread id, because tokio tasks
//! move between threads. Acquire and release are Lua scripts from `lua/`,
//! loaded once and run by EVALSHA, so the owner check and the change it
//! guards are one atomic step.
//!
//! A waiter does not poll: it subscribes to the lock's channel (one shared
//! subscriber connection per client, see `pubsub`), and sleeps until an
//! unlock message or the holder's remaining lease, whichever comes first.
//!
//! This module imports nothing of the application: it needs a
//! `redis::Client` (for its one command connection and its one subscriber
//! connection) and a key prefix, and could be published alone.

mod conn;
mod endpoint;
mod fairlock;
mod pubsub;
mod redlock;
mod rwlock;
mod watchdog;

pub use endpoint::{cluster_client, Endpoint};
pub use fairlock::FairLock;
pub use redlock::{MultiGuard, MultiNodeLocks, Quorum};
pub use rwlock::{Hold, ReadWriteLock, RwGuard};

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pubsub::{Subscriber, Woken};
use watchdog::{Registration, Renewal, Watchdog};

use deadpool_redis::redis::{self, Script};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// What can go wrong talking to Redis about a lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Redis answered with an error or the connection broke mid-command.
    #[error("Redis failed a lock command: {0}")]
    Redis(#[from] redis::RedisError),
    /// Too few lock nodes answered for a quorum to be possible at all: the
    /// lock could not be decided, which is not the same as "held".
    #[error("only {answered} of the {needed} lock nodes needed answered")]
    NodesUnavailable { answered: usize, needed: usize },
    /// The owner asked to release a lock it does not hold: it never took
    /// it, or its lease ran out (and someone else may hold it now).
    #[error("lock {key} is not held by {owner}")]
    NotHeld { key: String, owner: String },
}

/// Who holds a lock: a process UUID and an id chosen by the caller.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// The owner as stored in the lock's hash.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({})", self.0)
    }
}

/// What a successful release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The last hold was given back: the lock is free.
    Free,
    /// The owner still holds the lock this many more times (reentrancy).
    StillHeld(u32),
}

/// How long a hold lasts if its holder goes silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// This long from the acquisition, then the lock frees itself.
    Fixed(Duration),
    /// The client's watchdog lease (30 s by default), renewed every third
    /// of it while the guard lives; the guard hears if renewal finds the
    /// lock gone.
    Watchdog,
}

impl From<Duration> for Lease {
    fn from(lease: Duration) -> Self {
        Self::Fixed(lease)
    }
}

/// Tuning for a [`LockClient`].
#[derive(Debug, Clone, Copy)]
pub struct LockOptions {
    /// The lease of [`Lease::Watchdog`] holds; renewed every third of it.
    pub watchdog_lease: Duration,
    /// How long a connection attempt or a command may take before it
    /// fails (and, where safe, is resent).
    pub command_timeout: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            watchdog_lease: Duration::from_secs(30),
            command_timeout: Duration::from_secs(2),
        }
    }
}

/// The answer to an attempt to take a lock.
#[derive(Debug)]
pub enum Acquired {
    /// The lock is ours; the guard gives it back when dropped.
    Yes(LockGuard),
    /// Another owner holds it for about this long (None: no lease on it).
    HeldByOther { lease_left: Option<Duration> },
}

struct Shared {
    conn: Arc<conn::Connection>,
    prefix: String,
    process: Uuid,
    acquire: Script,
    release: Script,
    force_unlock: Script,
    rw_read: Script,
    rw_write: Script,
    rw_unlock: Script,
    fair_acquire: Script,
    fair_leave: Script,
    subscriber: Arc<Subscriber>,
    watchdog: Arc<Watchdog>,
    /// Releases started by guards dropped without `unlock`; shutdown waits
    /// for them so that a stopping process leaves no lock behind.
    pending_releases: TaskTracker,
}

impl Shared {
    /// The lease a hold gets, and whether the watchdog renews it.
    fn resolve(&self, lease: Lease) -> (Duration, bool) {
        match lease {
            Lease::Fixed(lease) => (lease, false),
            Lease::Watchdog => (self.watchdog.lease, true),
        }
    }
}

/// Makes locks and owners; cheap to clone, one per process is enough.
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<Shared>,
}

impl LockClient {
    /// A client whose lock keys all start with `prefix` (may be empty). It
    /// opens two connections to the endpoint's Redis (a `redis::Client`, or
    /// an [`Endpoint`] such as a Sentinel master) when first used: one for
    /// commands, one that waiters share to hear unlock messages.
    pub fn new(endpoint: impl Into<Endpoint>, prefix: impl Into<String>) -> Self {
        Self::with_options(endpoint, prefix, LockOptions::default())
    }

    /// Like [`LockClient::new`], with options.
    pub fn with_options(
        endpoint: impl Into<Endpoint>,
        prefix: impl Into<String>,
        options: LockOptions,
    ) -> Self {
        let client = endpoint.into();
        let conn = Arc::new(conn::Connection::new(
            client.clone(),
            options.command_timeout,
        ));
        Self {
            shared: Arc::new(Shared {
                conn: conn.clone(),
                prefix: prefix.into(),
                process: Uuid::new_v4(),
                acquire: Script::new(include_str!("../../lua/lock_acquire.lua")),
                release: Script::new(include_str!("../../lua/lock_release.lua")),
                force_unlock: Script::new(include_str!("../../lua/lock_force_unlock.lua")),
                rw_read: Script::new(include_str!("../../lua/rwlock_read.lua")),
                rw_write: Script::new(include_str!("../../lua/rwlock_write.lua")),
                rw_unlock: Script::new(include_str!("../../lua/rwlock_unlock.lua")),
                fair_acquire: Script::new(include_str!("../../lua/fairlock_acquire.lua")),
                fair_leave: Script::new(include_str!("../../lua/fairlock_leave.lua")),
                subscriber: Subscriber::new(client),
                watchdog: Watchdog::new(conn, options.watchdog_lease),
                pending_releases: TaskTracker::new(),
            }),
        }
    }

    /// This process's part of every owner it makes.
    pub fn process_id(&self) -> Uuid {
        self.shared.process
    }

    /// The owner `id` of this process. Two owners with the same id are the
    /// same owner: that is what makes the lock reentrant for them.
    pub fn owner(&self, id: impl fmt::Display) -> Owner {
        Owner(format!("{}:{id}", self.shared.process).into())
    }

    /// The lock called `name`. Its key is `{prefix}lock:{name}`, a hash tag
    /// so that every key of one lock lands in one Redis Cluster slot.
    pub fn lock(&self, name: &str) -> Lock {
        Lock {
            shared: self.shared.clone(),
            key: format!("{}lock:{{{name}}}", self.shared.prefix).into(),
        }
    }

    /// The read-write lock called `name`, key `{prefix}rwlock:{name}`.
    pub fn read_write_lock(&self, name: &str) -> ReadWriteLock {
        ReadWriteLock {
            shared: self.shared.clone(),
            key: format!("{}rwlock:{{{name}}}", self.shared.prefix).into(),
        }
    }

    /// The fair lock called `name`, key `{prefix}fairlock:{name}`.
    pub fn fair_lock(&self, name: &str) -> FairLock {
        FairLock {
            lock: Lock {
                shared: self.shared.clone(),
                key: format!("{}fairlock:{{{name}}}", self.shared.prefix).into(),
            },
        }
    }

    /// Whether this client's Redis takes writes now (a master that has its
    /// replicas, not a replica left behind by a failover): a key of the
    /// client's own, written with a short life.
    pub async fn check_writable(&self) -> Result<(), LockError> {
        let mut conn = self.shared.conn.get().await?;
        let key = format!(
            "{}lock-client:{}:writable",
            self.shared.prefix, self.shared.process
        );
        redis::cmd("SET")
            .arg(key)
            .arg(1)
            .arg("PX")
            .arg(10_000)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// How many locks this client's watchdog is keeping alive now.
    pub fn watched_locks(&self) -> usize {
        self.shared.watchdog.watched()
    }

    /// How many lock channels this client's waiters are subscribed to now.
    pub fn waiting_channels(&self) -> usize {
        self.shared.subscriber.active_channels()
    }

    /// Waits (at most `timeout`) for releases started by dropped guards.
    /// Returns false if some were still running when the time ran out.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        let tracker = &self.shared.pending_releases;
        tracker.close();
        tokio::time::timeout(timeout, tracker.wait()).await.is_ok()
    }
}

/// One named lock. Cheap to clone; holds no connection.
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
    key: Arc<str>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock").field("key", &self.key).finish()
    }
}

impl Lock {
    /// The Redis key of this lock.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The hash remembering recent request ids and their answers.
    fn requests_key(&self) -> String {
        format!("{}:requests", self.key)
    }

    /// The key holding this lock's last fencing token.
    fn fence_key(&self) -> String {
        format!("{}:fence", self.key)
    }

    /// The channel on which this lock's release is announced.
    pub fn channel(&self) -> String {
        format!("{}:released", self.key)
    }

    /// Takes the lock for `owner`, waiting at most `wait` for its holder to
    /// let go. `Ok(None)`: still held by another owner when `wait` ran out.
    ///
    /// Without polling: after one failed attempt the waiter subscribes to
    /// the lock's channel, then tries again (a release between the two is
    /// caught by the second attempt, one after it by the subscription), and
    /// sleeps until a release message or the end of the holder's lease,
    /// whichever comes first.
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

    /// Frees the lock whoever holds it, and wakes its waiters. Returns
    /// whether it was held. For operators; the holder is not told.
    pub async fn force_unlock(&self) -> Result<bool, LockError> {
        let mut conn = self.shared.conn.get().await?;
        let deleted: i64 = self
            .shared
            .force_unlock
            .key(&*self.key)
            .key(self.channel())
            .invoke_async(&mut conn)
            .await?;
        Ok(deleted == 1)
    }

    /// Whether `owner` holds the lock.
    pub async fn is_held_by(&self, owner: &Owner) -> Result<bool, LockError> {
        Ok(self.hold_count(owner).await? > 0)
    }

    /// The lease left on the lock: `None` when it is free (or has no lease).
    pub async fn remaining_lease(&self) -> Result<Option<Duration>, LockError> {
        let mut conn = self.shared.conn.get().await?;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&*self.key)
            .query_async(&mut conn)
            .await?;
        Ok(u64::try_from(pttl).ok().map(Duration::from_millis))
    }

    /// Takes the lock for `owner` with the given lease, without waiting.
    /// If `owner` already holds it, its hold count goes up by one and the
    /// lease starts again.
    pub async fn try_acquire(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
    ) -> Result<Acquired, LockError> {
        self.try_acquire_request(owner, lease, &new_request_id())
            .await
    }

    /// [`Lock::try_acquire`] under a request id of the caller's: sent again
    /// with the same id (after a timeout, say), it gets the first answer
    /// and takes no second hold. `try_acquire` itself resends on transient
    /// errors with one id, so it never counts twice.
    pub async fn try_acquire_request(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
        request_id: &str,
    ) -> Result<Acquired, LockError> {
        let (lease, watched) = self.shared.resolve(lease.into());
        let sent = Instant::now();
        let (acquired, value, fence): (i64, i64, i64) = self
            .with_retries(|| {
                let mut invocation = self.shared.acquire.key(&*self.key);
                invocation
                    .key(self.fence_key())
                    .key(self.requests_key())
                    .arg(lease_ms(lease))
                    .arg(owner.as_str())
                    .arg(FENCE_KEY_TTL_MS)
                    .arg(request_id)
                    .arg(REQUEST_MEMORY_MS);
                invocation
            })
            .await?;
        if acquired == 1 {
            let life = if watched {
                Life::Watched(self.shared.watchdog.watch(
                    self.key.clone(),
                    owner.clone(),
                    Renewal::Plain,
                ))
            } else {
                Life::Until(sent + lease)
            };
            Ok(Acquired::Yes(LockGuard {
                lock: self.clone(),
                owner: owner.clone(),
                lease,
                fence,
                life,
                armed: true,
            }))
        } else {
            let lease_left = u64::try_from(value).ok().map(Duration::from_millis);
            Ok(Acquired::HeldByOther { lease_left })
        }
    }

    /// Gives back one hold of `owner`. A release by anyone but a holder
    /// changes nothing and is reported as [`LockError::NotHeld`].
    pub async fn release(&self, owner: &Owner, lease: Duration) -> Result<Released, LockError> {
        self.release_request(owner, lease, &new_request_id()).await
    }

    /// [`Lock::release`] under a request id of the caller's: sent again with
    /// the same id, it gets the first answer and gives back no second hold.
    pub async fn release_request(
        &self,
        owner: &Owner,
        lease: Duration,
        request_id: &str,
    ) -> Result<Released, LockError> {
        let left: i64 = self
            .with_retries(|| {
                let mut invocation = self.shared.release.key(&*self.key);
                invocation
                    .key(self.channel())
                    .key(self.requests_key())
                    .arg(lease_ms(lease))
                    .arg(owner.as_str())
                    .arg(request_id)
                    .arg(REQUEST_MEMORY_MS);
                invocation
            })
            .await?;
        match left {
            0 => Ok(Released::Free),
            n if n > 0 => Ok(Released::StillHeld(u32::try_from(n).unwrap_or(u32::MAX))),
            _ => Err(LockError::NotHeld {
                key: self.key.to_string(),
                owner: owner.to_string(),
            }),
        }
    }

    /// Runs a script invocation, resending it (same request id, so at most
    /// once in effect) when the connection failed or timed out.
    async fn with_retries<'s, T: redis::FromRedisValue>(
        &'s self,
        invocation: impl Fn() -> redis::ScriptInvocation<'s>,
    ) -> Result<T, LockError> {
        let mut attempt = 1;
        loop {
            let result = async {
                let mut conn = self.shared.conn.get().await?;
                Ok::<T, LockError>(invocation().invoke_async(&mut conn).await?)
            }
            .await;
            match result {
                Err(error) if attempt < SEND_ATTEMPTS && is_transient(&error) => {
                    tracing::debug!(key = %self.key, %error, attempt, "resending a lock command");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                other => return other,
            }
        }
    }

    /// How many holds `owner` has on this lock (0 when none).
    pub async fn hold_count(&self, owner: &Owner) -> Result<u32, LockError> {
        let mut conn = self.shared.conn.get().await?;
        let holds: Option<u32> = redis::cmd("HGET")
            .arg(&*self.key)
            .arg(owner.as_str())
            .query_async(&mut conn)
            .await?;
        Ok(holds.unwrap_or(0))
    }

    /// Whether anyone holds the lock.
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        let mut conn = self.shared.conn.get().await?;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&*self.key)
            .query_async(&mut conn)
            .await?;
        Ok(exists)
    }
}

/// One hold of a lock. `unlock` gives it back and reports what happened;
/// dropping the guard (an early return, a panic, a cancelled request) gives
/// it back in the background instead.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    lock: Lock,
    owner: Owner,
    lease: Duration,
    fence: i64,
    life: Life,
    armed: bool,
}

/// How a hold stays alive, and how its holder learns that it ended.
enum Life {
    /// Renewed by the watchdog, which says when it finds the hold gone.
    Watched(Registration),
    /// A fixed lease ending then, counted from before the request was sent,
    /// so it errs early, never late.
    Until(Instant),
}

impl Life {
    fn is_lost(&self) -> bool {
        match self {
            Self::Watched(watch) => *watch.lost.borrow(),
            Self::Until(expires) => Instant::now() >= *expires,
        }
    }

    async fn lost(&self) {
        match self {
            Self::Watched(watch) => {
                let mut heard = watch.lost.clone();
                // An error means the watchdog is gone with its client: the
                // lock is no longer renewed, so it will be lost.
                let _ = heard.wait_for(|lost| *lost).await;
            }
            Self::Until(expires) => tokio::time::sleep_until((*expires).into()).await,
        }
    }

    /// The hold is being released: stop renewing it.
    fn end(&self, watchdog: &Watchdog) {
        if let Self::Watched(watch) = self {
            watchdog.unwatch(watch.id);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lock.key)
            .field("owner", &self.owner)
            .finish()
    }
}

impl LockGuard {
    /// A hold just granted by Redis.
    fn new(lock: Lock, owner: Owner, lease: Duration, fence: i64, life: Life) -> Self {
        Self {
            lock,
            owner,
            lease,
            fence,
            life,
            armed: true,
        }
    }

    /// The owner this hold belongs to.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The lock this hold is on.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// This hold's fencing token: larger than the token of every earlier
    /// holder of the lock. Send it with every write the lock protects, and
    /// have the store refuse a write whose token is smaller than the last
    /// one it accepted: a holder that stalled past its lease then cannot
    /// write after the next holder did.
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// Whether this hold can no longer be trusted: the watchdog found the
    /// lock gone, or a fixed lease has run out.
    pub fn is_lost(&self) -> bool {
        self.life.is_lost()
    }

    /// Resolves when the hold is lost (see [`LockGuard::is_lost`]): race it
    /// against the work done under the lock and abort the work if it wins.
    pub async fn lost(&self) {
        self.life.lost().await;
    }

    fn disarm(&mut self) {
        self.armed = false;
        self.life.end(&self.lock.shared.watchdog);
    }

    /// Gives the hold back now. `Err(NotHeld)` means the lease ran out
    /// while the work was being done: someone else may have held the lock.
    pub async fn unlock(mut self) -> Result<Released, LockError> {
        self.disarm();
        self.lock.release(&self.owner, self.lease).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.disarm();
        let (lock, owner, lease) = (self.lock.clone(), self.owner.clone(), self.lease);
        let shared = lock.shared.clone();
        shared.release_in_background(lock.key.clone(), owner.clone(), async move {
            lock.release(&owner, lease).await.map(drop)
        });
    }
}

impl Shared {
    /// Releases the hold of a guard dropped without `unlock`, on a task the
    /// client tracks (so `shutdown` waits for it). Failing that, the lease
    /// frees the lock; either way it is logged.
    fn release_in_background(
        &self,
        key: Arc<str>,
        owner: Owner,
        release: impl std::future::Future<Output = Result<(), LockError>> + Send + 'static,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%key, %owner, "lock guard dropped outside a runtime; the lease will free it");
            return;
        };
        self.pending_releases.spawn_on(
            async move {
                if let Err(error) = release.await {
                    tracing::warn!(%key, %owner, %error, "releasing a dropped lock guard failed; the lease will free it");
                }
            },
            &runtime,
        );
    }
}

/// Runs `attempt` until it wins or `wait` is spent, without polling: after
/// the first failure it subscribes to `channel`, then each round marks the
/// messages seen, attempts, and sleeps until a message or the holder's
/// lease (`Err(lease_left)` of the attempt), whichever comes first. A
/// release between the attempt and the sleep is caught by the mark.
async fn wait_turn<G, F, Fut>(
    subscriber: &Arc<Subscriber>,
    channel: &str,
    wait: Duration,
    mut attempt: F,
) -> Result<Option<G>, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<G, Option<Duration>>, LockError>>,
{
    let deadline = Instant::now() + wait;
    if let Ok(won) = attempt().await? {
        return Ok(Some(won));
    }
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
        // The lease may run out without a message: no one publishes an
        // expiry. Wake then, at the latest (1 ms past, so the key is gone).
        let nap = lease_left.map_or(left, |l| left.min(l + Duration::from_millis(1)));
        if sub.wait(nap).await == Woken::Lost {
            subscription = None;
        }
    }
}

/// How many times a lock command is sent before its error is returned.
const SEND_ATTEMPTS: u64 = 3;
/// How long a lock remembers a request id: longer than any resend.
const REQUEST_MEMORY_MS: u64 = 60_000;

fn new_request_id() -> String {
    Uuid::new_v4().simple().to_string()
}

/// Errors after which the command may or may not have been applied, and a
/// resend (idempotent, by request id) is the way to find out.
fn is_transient(error: &LockError) -> bool {
    match error {
        LockError::Redis(e) => e.is_io_error() || e.is_timeout() || e.is_connection_dropped(),
        LockError::NotHeld { .. } | LockError::NodesUnavailable { .. } => false,
    }
}

/// Lifetime of a lock's fencing-token key, renewed by each new holder. Only
/// a speed-up: tokens keep growing with Redis's clock if the key expires.
const FENCE_KEY_TTL_MS: u64 = 7 * 86_400_000;

fn lease_ms(lease: Duration) -> u64 {
    // PEXPIRE 0 would delete the key at once; a lease is at least 1 ms.
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}
