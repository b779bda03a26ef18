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

mod client;
mod conn;
mod endpoint;
mod fairlock;
mod guard;
mod lock;
mod pubsub;
mod redlock;
mod rwlock;
mod watchdog;

pub use client::{LockClient, LOCKS_PER_CALL};
pub use conn::SharedConnection;
pub use endpoint::{cluster_client, Endpoint};
pub use fairlock::FairLock;
pub use lock::{Lock, LockGuard};
pub use redlock::{MultiGuard, MultiNodeLocks, Quorum};
pub use rwlock::{Hold, ReadWriteLock, RwGuard};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

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
    /// `owner` does not hold the lock at `key`.
    fn not_held(key: &str, owner: &Owner) -> Self {
        Self::NotHeld {
            key: key.to_owned(),
            owner: owner.to_string(),
        }
    }

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
