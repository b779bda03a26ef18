//! Distributed locks on Redis, owning everything they need: the Lua scripts,
//! the connections, the lease watchdog and the pub/sub waiting.
//!
//! The lock family of Redisson (Java) for tokio and redis-rs: a reentrant
//! lock, a fair lock, a read-write lock, and RedLock / MultiLock over
//! several independent Redis servers. Every hold has a lease, so a crashed
//! holder cannot keep a lock forever; reentrant and fair holds carry a
//! fencing token, so a holder that outlived its lease can be refused by the
//! store it writes to.
//!
//! # The pieces
//!
//! - [`LockClient`]: makes locks and owners; one per process and Redis is
//!   enough (it is cheap to clone). It owns one multiplexed command
//!   connection, one subscriber connection shared by all its waiters, the
//!   watchdog task, and a random process UUID. Build it with
//!   [`LockClient::new`] or [`LockClient::with_options`] ([`LockOptions`]);
//!   it connects when first used, so it can be built while Redis is down.
//! - [`Lock`] ([`LockClient::lock`]): a reentrant lock.
//! - [`FairLock`] ([`LockClient::fair_lock`]): a reentrant lock granted in
//!   the order owners asked.
//! - [`ReadWriteLock`] ([`LockClient::read_write_lock`]): many readers or
//!   one writer.
//! - [`MultiNodeLocks`]: RedLock ([`Quorum::Majority`]) or MultiLock
//!   ([`Quorum::All`]) over one [`LockClient`] per independent Redis server.
//! - [`Endpoint`]: where a client's Redis is: one server, the master that
//!   Redis Sentinel names, or a Redis Cluster.
//! - [`SharedConnection`]: the client's command connection, public so that
//!   an application can send its own commands over the same layer: one
//!   multiplexed connection, one deadline per call (connecting included),
//!   no `PING` per command, and the failover rules below.
//!
//! Its async methods must run inside a tokio runtime: the client spawns
//! tasks there (the watchdog, the subscriber's reader, the background
//! releases of dropped guards).
//!
//! # Owners
//!
//! An owner is explicit: [`LockClient::owner`] joins the client's process
//! UUID and an id the caller picks (a request, a job, a session), never an
//! OS thread id, because tokio tasks move between threads. Two [`Owner`]s
//! made from the same id by the same client are the same owner; that is
//! what makes a lock reentrant for them. The same id under two clients (two
//! processes) gives two different owners.
//!
//! # What each lock guarantees
//!
//! All of it holds while a hold's lease lasts and while the Redis server
//! keeps its data (see [Limits](#limits)).
//!
//! **[`Lock`], reentrant.** A Redis hash of owner → hold count, with a lease
//! on the key (Redisson's RLock layout). At most one owner holds it. The
//! holder may take it again ([`Lock::try_acquire`] / [`Lock::acquire`]): the
//! count goes up and the lease starts again; each [`LockGuard::unlock`] gives
//! back one hold ([`Released::StillHeld`]) and the last one frees the lock
//! ([`Released::Free`]). Acquire and release are each one Lua script, so the
//! owner check and the change it guards are one atomic step: a release by
//! anyone but a holder changes nothing and is reported as
//! [`LockError::NotHeld`], which is also what a holder hears when its lease
//! ran out before it unlocked. Both are idempotent per request id (the lock
//! remembers answers for 60 s) and are sent again, with the same id, after a
//! connection error or a timeout, so a lost answer never counts a hold twice;
//! [`Lock::try_acquire_request`] and [`Lock::release_request`] take the
//! caller's own id. A guard dropped without `unlock` (an early return, a
//! panic, a cancelled task) is released in the background;
//! [`LockClient::shutdown`] waits for those releases. [`Lock::force_unlock`]
//! frees a lock whoever holds it, for operators.
//!
//! **[`FairLock`].** The same hash and the same [`LockGuard`], plus a queue:
//! the lock goes to waiters in the order they first asked. A waiter keeps
//! its place only as long as its own wait, so one that died or gave up is
//! skipped when its time is over and cannot block the line; one that gives
//! up through [`FairLock::acquire`] leaves the line at once.
//!
//! **[`ReadWriteLock`].** Many readers or one writer, each reentrant. The
//! writer may also read, and by giving back its write hold while it still
//! reads, downgrades to a reader; a reader cannot upgrade (two readers
//! upgrading at once would wait on each other forever), so a reader that
//! asks to write waits until its wait runs out. Each read hold has a lease
//! key of its own, so a reader that died does not keep a writer out past
//! its own lease once the other readers have left. [`RwGuard`]s carry no
//! fencing token.
//!
//! **[`MultiNodeLocks`].** RedLock: the lock is asked of every node at once,
//! each within a node timeout, and held only if a majority granted it (or
//! every node, for [`Quorum::All`]) with time left: the hold's validity is
//! the lease minus the time acquiring took minus an allowance for clock
//! drift (1 % of the lease plus 2 ms), see [`MultiGuard::valid_until`] and
//! [`MultiGuard::is_expired`]. A failed attempt gives back whatever it was
//! granted. When so few nodes answered that no quorum was possible, the
//! answer is [`LockError::NodesUnavailable`]: the lock's state is unknown,
//! which is not the same as "held". A node that failed to answer is skipped
//! for a second. Multi-node holds have fixed leases (no watchdog).
//!
//! # Leases and the watchdog
//!
//! Every hold has a [`Lease`]: [`Lease::Fixed`] (any `Duration` converts
//! into one) frees the lock that long after it was taken, whatever the
//! holder is doing. [`Lease::Watchdog`] gives the hold the client's
//! [`LockOptions::watchdog_lease`] (30 s by default) and has the client's
//! watchdog renew it every third of that while the guard lives: one task per
//! client, started by the first watched hold and stopped when there is none.
//! It renews reentrant and fair holds up to 256 per script call (per slot
//! on a Redis Cluster), read-write holds one call each. A process that dies stops renewing, and its locks free
//! themselves within a lease.
//!
//! Unlike Redisson's watchdog, which only stops renewing, this one tells the
//! holder: [`LockGuard::lost`] resolves (and [`LockGuard::is_lost`] turns
//! true) as soon as a renewal finds the hold gone (it expired, was forced
//! open, or Redis lost it), or when renewals have failed for a whole lease.
//! For a fixed lease they go by the local clock, counted from before the
//! request was sent, so they err early, never late. Race the work done under
//! the lock against `lost()`, and stop the work if `lost()` wins.
//!
//! # Fencing tokens
//!
//! Each new holder of a [`Lock`] or [`FairLock`] gets a token,
//! [`LockGuard::fence`], larger than the token of every earlier holder of
//! that lock: `max(last token + 1, Redis's clock in µs)`, minted by the
//! acquire script; a reentrant acquisition keeps the holder's token. Send it
//! with every write the lock protects, and have the store refuse a write
//! whose token is smaller than the largest it has accepted: a holder that
//! stalled past its lease (a pause, a slow disk) then cannot write after the
//! next holder did. Fencing protects only stores that make that check, and
//! only writes that carry the token; it does not keep two holders from
//! running at once. [`MultiGuard::fence`] is the largest of the granting
//! nodes' tokens, which grows only as far as the nodes' clocks agree.
//!
//! # Waiting without polling
//!
//! [`Lock::acquire`], [`FairLock::acquire`], [`ReadWriteLock::read`] and
//! [`ReadWriteLock::write`] wait at most the time they are given. After one
//! failed attempt the waiter subscribes to the lock's channel
//! ([`Lock::channel`]) on the client's one subscriber connection (shared by
//! all its waiters, with a reference count per channel), tries again (so a
//! release between the first attempt and the subscription is not missed),
//! and sleeps until a release message or the end of the holder's lease,
//! whichever comes first. A lost subscriber connection closes every channel,
//! and the waiters subscribe again on a new one.
//! [`LockClient::waiting_channels`] counts the channels waited on.
//!
//! # Endpoints: one server, Sentinel, Cluster
//!
//! - [`Endpoint::Server`], what a `redis::Client` converts into: one address
//!   (a server, a proxy, a managed endpoint). A connection that answers
//!   `READONLY` or `MASTERDOWN` (a failover left it on a replica) is
//!   dropped, and the next command connects afresh.
//! - [`Endpoint::sentinel`]: the master that the sentinels name, looked up
//!   again for every new connection; behind Sentinel any broken connection is
//!   also dropped, so the client follows a failover.
//! - [`Endpoint::cluster`]: a Redis Cluster reached through any of the
//!   given nodes. Every key of one lock carries the lock's name as a hash
//!   tag (`…lock:{name}…`), so each script touches one slot; the subscriber
//!   connects to any one node (a `PUBLISH` reaches every node) and moves to
//!   the next when its connection breaks. [`cluster_client`] builds the
//!   cluster client with the timeouts the lock client uses, for other
//!   commands of the caller's.
//!
//! [`LockClient::check_writable`] (and [`MultiNodeLocks::check_writable`])
//! tells whether the client's Redis takes writes now, for readiness checks.
//!
//! # Keys
//!
//! With the client's prefix `p` (which may be empty) and a lock named `n`:
//!
//! - [`Lock`]: `p` + `lock:{n}`, the hash of holds (and of each holder's
//!   last request id, `req:<owner>`), with the lease; `…:fence`, the last
//!   fencing token (kept 7 days after each new holder);
//!   `…:release:<request id>`, the answer of a last release, kept for a
//!   resend (60 s); channel `…:released`.
//! - [`FairLock`]: `p` + `fairlock:{n}`, with the same keys and
//!   channel, plus `…:queue` and `…:deadlines`, the waiters.
//! - [`ReadWriteLock`]: `p` + `rwlock:{n}`, the hash; `…:timeout:<owner>:<i>`,
//!   one lease key per read hold; channel `…:released`.
//! - [`LockClient::check_writable`]: `p` + `lock-client:<process UUID>:writable`
//!   (10 s).
//!
//! Every key has a time to live, so nothing is left behind for ever.
//!
//! # Limits
//!
//! - **Leases.** A holder that stalls past its lease (or whose watchdog
//!   cannot reach Redis for a whole lease) loses the lock while it may still
//!   be working: [`LockGuard::lost`] tells it, fencing tokens let a store
//!   refuse its late writes, and nothing else can.
//! - **Clocks.** Redis expires leases by its own clock; fixed leases are
//!   judged locally by this process's monotonic clock. Both are assumed to
//!   run at about the same rate, with no jumps. RedLock's validity assumes
//!   the nodes' clocks and this process's drift apart by less than 1 % of
//!   the lease plus 2 ms over a lease.
//! - **Failover.** Redis replication is asynchronous: a lock acknowledged by
//!   a master may be missing on the replica that replaces it, and then
//!   be granted twice. (This library does not wait for replicas.) RedLock
//!   over independent servers avoids the replica, not every risk: a node
//!   that restarts without having persisted its keys can grant a held lock
//!   again.
//! - **Redis.** The scripts write after reading `TIME`, which needs Redis 5
//!   or later.
//!
//! # Example
//!
//! A reentrant lock: the same owner may take it twice, another owner is
//! refused until the last hold is given back.
//!
//! ```rust
//! use std::time::Duration;
//!
//! use redis_locks::{Acquired, LockClient, Released};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! // Keys under a prefix of this run's own: runs never share a key.
//! let prefix = format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple());
//! let locks = LockClient::new(client.clone(), prefix);
//! let lock = locks.lock("order:42");
//! let (alice, bob) = (locks.owner("alice"), locks.owner("bob"));
//! let lease = Duration::from_secs(10);
//!
//! // Alice takes the lock, then takes it again: her hold count goes up.
//! let Acquired::Yes(first) = lock.try_acquire(&alice, lease).await? else {
//!     panic!("a new lock is free");
//! };
//! let Acquired::Yes(second) = lock.try_acquire(&alice, lease).await? else {
//!     panic!("the holder may take the lock again");
//! };
//! assert_eq!(lock.hold_count(&alice).await?, 2);
//!
//! // Bob is refused, and told how much of the lease is left.
//! match lock.try_acquire(&bob, lease).await? {
//!     Acquired::HeldByOther { lease_left } => assert!(lease_left.is_some()),
//!     Acquired::Yes(_) => panic!("two owners held the lock"),
//! }
//!
//! // Each unlock gives back one hold; the last one frees the lock.
//! assert_eq!(second.unlock().await?, Released::StillHeld(1));
//! assert_eq!(first.unlock().await?, Released::Free);
//!
//! // Now Bob gets it (`acquire` would wait up to a second for it).
//! let guard = lock
//!     .acquire(&bob, Duration::from_secs(1), lease)
//!     .await?
//!     .expect("the lock is free");
//! assert!(lock.is_held_by(&bob).await?);
//! guard.unlock().await?;
//! assert!(!lock.is_locked().await?);
//! # // This example's keys: the lock and its fencing token (the answer kept
//! # // for a resend of the last release expires by itself).
//! # let mut conn = client.get_multiplexed_async_connection().await?;
//! # redis::cmd("DEL")
//! #     .arg(lock.key())
//! #     .arg(format!("{}:fence", lock.key()))
//! #     .query_async::<()>(&mut conn)
//! #     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! A hold renewed by the watchdog, with the work raced against its loss:
//!
//! ```rust
//! use std::time::Duration;
//!
//! use redis_locks::{Acquired, Lease, LockClient, LockOptions};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! // Keys under a prefix of this run's own: runs never share a key.
//! let prefix = format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple());
//! let options = LockOptions {
//!     watchdog_lease: Duration::from_secs(10),
//!     ..LockOptions::default()
//! };
//! let locks = LockClient::with_options(client.clone(), prefix, options);
//! let lock = locks.lock("nightly-report");
//!
//! let owner = locks.owner("report-job");
//! let Acquired::Yes(guard) = lock.try_acquire(&owner, Lease::Watchdog).await? else {
//!     panic!("a new lock is free");
//! };
//! assert_eq!(locks.watched_locks(), 1);
//!
//! let work = async {
//!     tokio::time::sleep(Duration::from_millis(50)).await;
//!     "report written"
//! };
//! let outcome = tokio::select! {
//!     () = guard.lost() => None, // the lock is gone: stop, write nothing
//!     done = work => Some(done),
//! };
//! assert_eq!(outcome, Some("report written"));
//!
//! guard.unlock().await?;
//! assert_eq!(locks.watched_locks(), 0);
//! # let mut conn = client.get_multiplexed_async_connection().await?;
//! # redis::cmd("DEL")
//! #     .arg(lock.key())
//! #     .arg(format!("{}:fence", lock.key()))
//! #     .query_async::<()>(&mut conn)
//! #     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! More examples: fencing tokens on [`LockGuard::fence`], the read-write
//! lock on [`ReadWriteLock`], RedLock on [`MultiNodeLocks`].

mod conn;
mod endpoint;
mod fairlock;
mod guard;
mod pubsub;
mod redlock;
mod rwlock;
mod watchdog;

pub use conn::SharedConnection;
pub use endpoint::{cluster_client, Endpoint};
pub use fairlock::FairLock;
pub use redlock::{MultiGuard, MultiNodeLocks, Quorum};
pub use rwlock::{Hold, ReadWriteLock, RwGuard};

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guard::{GuardCore, GuardedLock, Term};
use pubsub::{Subscriber, Woken};
use watchdog::{Renewal, Watchdog};

use redis::{Script, ScriptInvocation};
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

impl LockError {
    /// The error of one call that gave back several locks, as each of them
    /// reports it (`RedisError` cannot be cloned; its kind, message and
    /// whether it timed out are kept).
    fn for_each_lock(&self) -> Self {
        match self {
            Self::Redis(e) if e.is_io_error() => Self::Redis(
                std::io::Error::new(
                    if e.is_timeout() {
                        std::io::ErrorKind::TimedOut
                    } else {
                        std::io::ErrorKind::Other
                    },
                    e.to_string(),
                )
                .into(),
            ),
            Self::Redis(e) => Self::Redis((e.kind(), "lock command failed", e.to_string()).into()),
            Self::NodesUnavailable { answered, needed } => Self::NodesUnavailable {
                answered: *answered,
                needed: *needed,
            },
            Self::NotHeld { key, owner } => Self::NotHeld {
                key: key.clone(),
                owner: owner.clone(),
            },
        }
    }
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
    conn: Arc<SharedConnection>,
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
    /// The lease a hold gets, and whether the watchdog renews it, for a
    /// request going out now.
    fn resolve(&self, lease: Lease) -> Term {
        let (lease, watched) = match lease {
            Lease::Fixed(lease) => (lease, false),
            Lease::Watchdog => (self.watchdog.lease, true),
        };
        Term {
            lease,
            watched,
            sent: Instant::now(),
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
        let conn = Arc::new(SharedConnection::new(
            client.clone(),
            options.command_timeout,
        ));
        Self {
            shared: Arc::new(Shared {
                conn: conn.clone(),
                prefix: prefix.into(),
                process: Uuid::new_v4(),
                acquire: Script::new(include_str!("../lua/lock_acquire.lua")),
                release: Script::new(include_str!("../lua/lock_release.lua")),
                force_unlock: Script::new(include_str!("../lua/lock_force_unlock.lua")),
                rw_read: Script::new(include_str!("../lua/rwlock_read.lua")),
                rw_write: Script::new(include_str!("../lua/rwlock_write.lua")),
                rw_unlock: Script::new(include_str!("../lua/rwlock_unlock.lua")),
                fair_acquire: Script::new(include_str!("../lua/fairlock_acquire.lua")),
                fair_leave: Script::new(include_str!("../lua/fairlock_leave.lua")),
                subscriber: Subscriber::new(client),
                watchdog: Watchdog::new(conn, options.watchdog_lease),
                pending_releases: TaskTracker::new(),
            }),
        }
    }

    /// Tries each `(lock, owner, lease)` of `requests` as
    /// [`Lock::try_acquire`] would, in as few calls as Redis allows: one
    /// script call for up to [`LOCKS_PER_CALL`] locks (on a Redis Cluster,
    /// one per slot, the calls at once). For a caller that gathers the
    /// acquisitions of many owners that arrive together. The answers come
    /// in the order of `requests`; a lock of another client is tried on its
    /// own.
    pub async fn try_acquire_all(
        &self,
        requests: &[(&Lock, &Owner, Lease)],
    ) -> Vec<Result<Acquired, LockError>> {
        let (ours, others): (Vec<_>, Vec<_>) = requests
            .iter()
            .enumerate()
            .partition(|(_, (lock, ..))| Arc::ptr_eq(&lock.shared, &self.shared));
        // (place, (lock, owner, term, request id)) of each lock tried here.
        let tries: Vec<_> = ours
            .into_iter()
            .map(|(at, (lock, owner, lease))| {
                let term = self.shared.resolve(*lease);
                (at, (*lock, *owner, term, new_request_id()))
            })
            .collect();
        let acquired = self.shared.per_lock(
            &self.shared.acquire,
            &tries,
            |(lock, ..)| lock,
            |(lock, owner, term, request_id), invocation| {
                lock.add_acquire(invocation, owner, *term, request_id);
            },
            FENCE_KEY_TTL_MS,
            |(lock, owner, term, _), answer: Option<(i64, i64, i64)>| {
                Ok(lock.acquired(owner, *term, answer.unwrap_or((0, -1, 0))))
            },
        );
        let alone = others
            .into_iter()
            .map(|(at, (lock, owner, lease))| async move {
                vec![(at, lock.try_acquire(owner, *lease).await)]
            });
        gathered(acquired, alone).await
    }

    /// Gives back every hold in `guards` as [`LockGuard::unlock`] would, in
    /// as few calls as Redis allows: one script call for up to
    /// [`LOCKS_PER_CALL`] locks (on a Redis Cluster, one per slot, the calls
    /// at once). For a caller that ends many holds together, such as a batch
    /// of work whose locks all end when it commits. The answers come in the
    /// order of `guards`; a guard of another client is given back on its
    /// own.
    pub async fn unlock_all(&self, guards: Vec<LockGuard>) -> Vec<Result<Released, LockError>> {
        let (ours, others): (Vec<_>, Vec<_>) = guards
            .into_iter()
            .enumerate()
            .partition(|(_, guard)| Arc::ptr_eq(&guard.core.lock.shared, &self.shared));
        // (place, (lock, owner, lease, request id)) of each hold given back.
        let holds: Vec<_> = ours
            .into_iter()
            .map(|(at, mut guard)| {
                let (lock, owner, lease) = guard.core.give_back();
                (at, (lock.clone(), owner.clone(), lease, new_request_id()))
            })
            .collect();
        let released = self.shared.per_lock(
            &self.shared.release,
            &holds,
            |(lock, ..)| lock,
            |(lock, owner, lease, request_id), invocation| {
                lock.add_release(invocation, owner, *lease, request_id);
            },
            RELEASE_MEMORY_MS,
            |(lock, owner, ..), left: Option<i64>| lock.released(owner, left.unwrap_or(-1)),
        );
        let alone = others
            .into_iter()
            .map(|(at, guard)| async move { vec![(at, guard.unlock().await)] });
        gathered(released, alone).await
    }

    /// The deadline of each call to Redis (`LockOptions::command_timeout`).
    pub fn command_timeout(&self) -> Duration {
        self.shared.conn.timeout()
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
        let key = format!(
            "{}lock-client:{}:writable",
            self.shared.prefix, self.shared.process
        );
        self.shared
            .conn
            .query::<()>(redis::cmd("SET").arg(key).arg(1).arg("PX").arg(10_000))
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

    /// Where the answer of the last release sent under `request_id` is
    /// kept for a resend (the lock's hash is gone by then).
    fn released_key(&self, request_id: &str) -> String {
        format!("{}:release:{request_id}", self.key)
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
        let term = self.shared.resolve(lease.into());
        let mut invocation = self.shared.acquire.prepare_invoke();
        self.add_acquire(&mut invocation, owner, term, request_id);
        invocation.arg(FENCE_KEY_TTL_MS);
        let answers: Vec<(i64, i64, i64)> =
            self.shared.send_idempotent(&self.key, &invocation).await?;
        let answer = answers.first().copied().unwrap_or((0, -1, 0));
        Ok(self.acquired(owner, term, answer))
    }

    /// Adds `owner`'s acquisition to a call of the acquire script
    /// (`lua/lock_acquire.lua`, which takes each lock it is given as if
    /// alone).
    fn add_acquire(
        &self,
        invocation: &mut ScriptInvocation<'_>,
        owner: &Owner,
        term: Term,
        request_id: &str,
    ) {
        invocation
            .key(&*self.key)
            .key(self.fence_key())
            .arg(lease_ms(term.lease))
            .arg(owner.as_str())
            .arg(request_id);
    }

    /// What the acquire script answered for this lock: `(1, holds, token)`
    /// or `(0, pttl, 0)`.
    fn acquired(
        &self,
        owner: &Owner,
        term: Term,
        (acquired, value, fence): (i64, i64, i64),
    ) -> Acquired {
        if acquired == 1 {
            Acquired::Yes(LockGuard::granted(self.clone(), owner, term, fence))
        } else {
            Acquired::HeldByOther {
                lease_left: lease_left(value),
            }
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
        let mut invocation = self.shared.release.prepare_invoke();
        self.add_release(&mut invocation, owner, lease, request_id);
        invocation.arg(RELEASE_MEMORY_MS);
        let left: Vec<i64> = self.shared.send_idempotent(&self.key, &invocation).await?;
        self.released(owner, left.first().copied().unwrap_or(-1))
    }

    /// Adds the release of `owner`'s hold to a call of the release script
    /// (`lua/lock_release.lua`, which gives back one hold of each lock it
    /// is given).
    fn add_release(
        &self,
        invocation: &mut ScriptInvocation<'_>,
        owner: &Owner,
        lease: Duration,
        request_id: &str,
    ) {
        invocation
            .key(&*self.key)
            .key(self.channel())
            .key(self.released_key(request_id))
            .arg(lease_ms(lease))
            .arg(owner.as_str())
            .arg(request_id);
    }

    /// What the release script answered for this lock.
    fn released(&self, owner: &Owner, left: i64) -> Result<Released, LockError> {
        match left {
            0 => Ok(Released::Free),
            n if n > 0 => Ok(Released::StillHeld(u32::try_from(n).unwrap_or(u32::MAX))),
            _ => Err(LockError::NotHeld {
                key: self.key.to_string(),
                owner: owner.to_string(),
            }),
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

/// One hold of a lock. `unlock` gives it back and reports what happened;
/// dropping the guard (an early return, a panic, a cancelled request) gives
/// it back in the background instead.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    core: GuardCore<Lock>,
    fence: i64,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.debug(f, "LockGuard").finish()
    }
}

impl LockGuard {
    /// A hold just granted by Redis, with its fencing token.
    fn granted(lock: Lock, owner: &Owner, term: Term, fence: i64) -> Self {
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

    /// This hold's fencing token: larger than the token of every earlier
    /// holder of the lock. Send it with every write the lock protects, and
    /// have the store refuse a write whose token is smaller than the last
    /// one it accepted: a holder that stalled past its lease then cannot
    /// write after the next holder did.
    ///
    /// # Example
    ///
    /// A holder stalls past its lease; the next holder gets a larger token,
    /// and a store that checks tokens refuses the stalled holder's late
    /// write:
    ///
    /// ```rust
    /// use std::time::Duration;
    ///
    /// use redis_locks::{Acquired, LockClient, LockError};
    ///
    /// /// Accepts a write only with a token at least as large as the
    /// /// largest it has accepted.
    /// struct Store {
    ///     last_token: i64,
    ///     value: &'static str,
    /// }
    ///
    /// impl Store {
    ///     fn write(&mut self, token: i64, value: &'static str) -> bool {
    ///         if token < self.last_token {
    ///             return false;
    ///         }
    ///         self.last_token = token;
    ///         self.value = value;
    ///         true
    ///     }
    /// }
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// // Keys under a prefix of this run's own: runs never share a key.
    /// let prefix = format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple());
    /// let locks = LockClient::new(client.clone(), prefix);
    /// let lock = locks.lock("account:7");
    /// let mut store = Store { last_token: 0, value: "" };
    ///
    /// // Job 1 takes the lock with a short lease, then stalls past it.
    /// let job1 = locks.owner("job-1");
    /// let Acquired::Yes(stalled) = lock.try_acquire(&job1, Duration::from_millis(100)).await? else {
    ///     panic!("a new lock is free");
    /// };
    /// tokio::time::sleep(Duration::from_millis(250)).await;
    /// assert!(stalled.is_lost());
    ///
    /// // Job 2 takes the lock, with a larger token, and writes.
    /// let job2 = locks.owner("job-2");
    /// let Acquired::Yes(next) = lock.try_acquire(&job2, Duration::from_secs(10)).await? else {
    ///     panic!("the first lease has run out");
    /// };
    /// assert!(next.fence() > stalled.fence());
    /// assert!(store.write(next.fence(), "written by job 2"));
    ///
    /// // Job 1 wakes up: the store refuses its write, and the lock its unlock.
    /// assert!(!store.write(stalled.fence(), "written by job 1"));
    /// assert!(matches!(stalled.unlock().await, Err(LockError::NotHeld { .. })));
    /// assert_eq!(store.value, "written by job 2");
    /// next.unlock().await?;
    /// # // This example's keys: the lock and its fencing token (the answer kept
    /// # // for a resend of the last release expires by itself).
    /// # let mut conn = client.get_multiplexed_async_connection().await?;
    /// # redis::cmd("DEL")
    /// #     .arg(lock.key())
    /// #     .arg(format!("{}:fence", lock.key()))
    /// #     .query_async::<()>(&mut conn)
    /// #     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// Whether this hold can no longer be trusted: the watchdog found the
    /// lock gone, or a fixed lease has run out.
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Resolves when the hold is lost (see [`LockGuard::is_lost`]): race it
    /// against the work done under the lock and abort the work if it wins.
    pub async fn lost(&self) {
        self.core.lost().await;
    }

    /// Gives the hold back now. `Err(NotHeld)` means the lease ran out
    /// while the work was being done: someone else may have held the lock.
    pub async fn unlock(mut self) -> Result<Released, LockError> {
        let (lock, owner, lease) = self.core.give_back();
        lock.release(owner, lease).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.core.release_on_drop(|lock, owner, lease| async move {
            lock.release(&owner, lease).await.map(drop)
        });
    }
}

impl Shared {
    /// Runs one of the scripts that remember their request ids (acquire,
    /// release) within one command deadline, resending it (same request
    /// ids, so at most once in effect) when the connection failed or timed
    /// out. `key` names the lock in the logs.
    async fn send_idempotent<T: redis::FromRedisValue>(
        &self,
        key: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        // Every attempt within one deadline: resending never makes a call
        // outlast the command timeout.
        let deadline = tokio::time::Instant::now() + self.conn.timeout();
        let mut attempt = 1;
        loop {
            let result = self
                .conn
                .invoke_by(deadline, invocation)
                .await
                .map_err(LockError::from);
            match result {
                Err(error) if attempt < SEND_ATTEMPTS && is_transient(&error) => {
                    tracing::debug!(%key, %error, attempt, "resending a lock command");
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                other => return other,
            }
        }
    }

    /// Runs `script` for many locks: one call per [`LOCKS_PER_CALL`] of
    /// `items` (on a cluster, per slot; the calls at once), each item
    /// adding its keys and arguments (`add`), `last` the call's final
    /// argument. Each item's answer is `answer` of its part of the script's
    /// answer, or the call's error; `at` (the item's place) goes with it.
    async fn per_lock<I, A, R>(
        &self,
        script: &Script,
        items: &[(usize, I)],
        lock_of: impl Fn(&I) -> &Lock,
        add: impl Fn(&I, &mut ScriptInvocation<'_>),
        last: u64,
        answer: impl Fn(&I, Option<A>) -> Result<R, LockError>,
    ) -> Vec<(usize, Result<R, LockError>)>
    where
        A: redis::FromRedisValue + Clone,
    {
        let batches = endpoint::script_batches(
            self.conn.is_cluster(),
            items,
            |(_, item)| &lock_of(item).key,
            LOCKS_PER_CALL,
        );
        let (add, answer, lock_of) = (&add, &answer, &lock_of);
        let calls = batches.into_iter().map(|batch| async move {
            let mut invocation = script.prepare_invoke();
            for (_, item) in &batch {
                add(item, &mut invocation);
            }
            invocation.arg(last);
            let answers: Result<Vec<A>, LockError> = self
                .send_idempotent(&lock_of(&batch[0].1).key, &invocation)
                .await;
            batch
                .iter()
                .enumerate()
                .map(|(i, (at, item))| {
                    let mine = match &answers {
                        Ok(answers) => answer(item, answers.get(i).cloned()),
                        Err(error) => Err(error.for_each_lock()),
                    };
                    (*at, mine)
                })
                .collect::<Vec<_>>()
        });
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

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

/// Most locks one call of the acquire or the release script takes or gives
/// back.
pub const LOCKS_PER_CALL: usize = 64;

/// The answers of a call on many locks, back in the caller's order: those
/// of the script calls (`batched`) and those of the locks tried on their
/// own.
async fn gathered<T>(
    batched: impl std::future::Future<Output = Vec<(usize, Result<T, LockError>)>>,
    alone: impl IntoIterator<
        Item = impl std::future::Future<Output = Vec<(usize, Result<T, LockError>)>>,
    >,
) -> Vec<Result<T, LockError>> {
    let (batched, alone) =
        futures_util::future::join(batched, futures_util::future::join_all(alone)).await;
    let mut answers: Vec<_> = batched
        .into_iter()
        .chain(alone.into_iter().flatten())
        .collect();
    answers.sort_by_key(|(at, _)| *at);
    answers.into_iter().map(|(_, answer)| answer).collect()
}

/// How many times a lock command is sent before its error is returned.
const SEND_ATTEMPTS: u64 = 3;
/// How long the answer of a last release is kept for a resend: longer
/// than any resend (they all go out within one command deadline).
const RELEASE_MEMORY_MS: u64 = 60_000;

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

/// The lease left on a lock, from Redis's milliseconds (negative: none).
fn lease_left(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

fn lease_ms(lease: Duration) -> u64 {
    // PEXPIRE 0 would delete the key at once; a lease is at least 1 ms.
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}
