//! Distributed locks on Redis for tokio, on the model of Redisson: a
//! reentrant [`Lock`], a [`FairLock`], a [`ReadWriteLock`], and RedLock /
//! MultiLock over independent servers ([`MultiNodeLocks`]). The crate owns
//! its Lua scripts, connections, lease watchdog and pub/sub waiting; a
//! [`LockClient`] (one per process and Redis, cheap to clone) makes the
//! locks, and [`Endpoint`] says where Redis is: one server, the master that
//! Sentinel names, or a Cluster.
//!
//! # Guarantees
//!
//! While a hold's lease lasts and Redis keeps its data:
//!
//! - [`Lock`]: one owner at a time. The holder may take it again; each
//!   unlock gives back one hold. Each new holder gets a larger fencing token.
//! - [`FairLock`]: the same, granted in the order owners asked.
//! - [`ReadWriteLock`]: many readers or one writer (who may also read).
//! - [`MultiNodeLocks`]: granted by a majority ([`Quorum::Majority`]) or by
//!   every node ([`Quorum::All`]), trusted until [`MultiGuard::valid_until`].
//!
//! An owner ([`LockClient::owner`]) is the client's process UUID plus an id
//! of the caller's, never a thread: tokio tasks move between threads. Every
//! hold has a [`Lease`], fixed or renewed by the client's watchdog; a guard
//! dropped without `unlock` is released in the background. The async
//! methods must run inside a tokio runtime.
//!
//! # Example
//!
//! ```rust
//! use std::time::Duration;
//!
//! use redis_locks::{Acquired, Lease, LockClient};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let prefix = format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple());
//! let locks = LockClient::new(client.clone(), prefix);
//! let lock = locks.lock("order:42");
//! let (alice, bob) = (locks.owner("alice"), locks.owner("bob"));
//!
//! let Acquired::Yes(guard) = lock.try_acquire(&alice, Lease::Watchdog).await? else {
//!     panic!("a new lock is free");
//! };
//! let refused = lock.try_acquire(&bob, Lease::Watchdog).await?;
//! assert!(matches!(refused, Acquired::HeldByOther { .. }));
//! let token = guard.fence(); // send it with every write the lock protects
//! let work = tokio::time::sleep(Duration::from_millis(10)); // the work
//! tokio::select! {
//!     () = guard.lost() => panic!("the lock is gone: stop, write nothing"),
//!     () = work => println!("written under token {token}"),
//! }
//! guard.unlock().await?;
//! # let mut conn = client.get_multiplexed_async_connection().await?;
//! # let fence = format!("{}:fence", lock.key());
//! # redis::cmd("DEL").arg(lock.key()).arg(fence).query_async::<()>(&mut conn).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Failure modes and limits
//!
//! - **Lease expiry.** A holder that stalls past its lease (or whose
//!   watchdog cannot reach Redis for a whole lease) loses the lock while it
//!   may still be working. [`LockGuard::lost`] tells it; a store that checks
//!   [`LockGuard::fence`] refuses its late writes; nothing else can.
//! - **Clocks.** Redis expires leases by its clock, fixed leases are judged
//!   by this process's monotonic clock; both are assumed to run at about the
//!   same rate. RedLock assumes drift under 1 % of the lease plus 2 ms.
//! - **Failover.** Replication is asynchronous: a lock acknowledged by a
//!   master may be missing on the replica promoted in its place, and be
//!   granted twice. This crate does not wait for replicas.
//! - **RedLock.** A node that restarts without having persisted its keys can
//!   grant a held lock again. When too few nodes answer, the answer is
//!   [`LockError::NodesUnavailable`]: unknown, not "held".
//! - **Redis 6.2** or later (the acquire's `SET ... GET` of the fencing
//!   token).
//!
//! The key layout and a comparison with Redisson and rslock are in the
//! crate's README.

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
pub use fairlock::{FairLock, WAITER_HEARTBEAT};
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
    #[error("Redis failed a lock command")]
    Redis(#[from] redis::RedisError),
    /// Too few nodes answered for a quorum: the lock's state is unknown.
    #[error("only {answered} of the {needed} lock nodes needed answered")]
    NodesUnavailable { answered: usize, needed: usize },
    /// The owner does not hold the lock: it never took it, or its lease ran
    /// out (someone else may hold it now).
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

    /// The error of a call on several locks, for each of them (`RedisError`
    /// is not `Clone`; its kind, message and timeout are kept).
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

/// Who holds a lock: a process UUID and an id chosen by the caller; made
/// by [`LockClient::owner`].
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
    /// This long, then the lock frees itself (any `Duration` converts).
    Fixed(Duration),
    /// [`LockOptions::watchdog_lease`], renewed every third of it while the
    /// guard lives; a renewal that finds the hold gone, or renewals failing
    /// for a whole lease, make the guard's `lost()` resolve.
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
    /// The lease of [`Lease::Watchdog`] holds (30 s by default).
    pub watchdog_lease: Duration,
    /// The deadline of each call to Redis, connecting included.
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
