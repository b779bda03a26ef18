//! The per-user purchase lock: on the service's Redis (the default), or
//! RedLock over independent Redis nodes when `SECKILL_LOCK_REDIS_URLS` names
//! them, so that losing one Redis does not stop (or split) purchases.

use std::time::Duration;

use redis_locks::{Acquired, LockClient, LockError, LockGuard, MultiGuard, MultiNodeLocks};

/// Where users' purchase locks live.
#[derive(Clone)]
pub enum UserLocks {
    /// One Redis.
    Single(LockClient),
    /// A majority of independent Redis nodes; each is given at most
    /// `node_timeout` to answer.
    RedLock {
        locks: MultiNodeLocks,
        node_timeout: Duration,
    },
}

/// A user's lock, held.
pub enum UserGuard {
    Single(LockGuard),
    RedLock(MultiGuard),
}

impl UserLocks {
    /// Takes `user_id`'s lock for one purchase, without waiting: `None`
    /// when another purchase of the user holds it.
    pub async fn try_lock(
        &self,
        user_id: i64,
        purchase: u64,
        lease: Duration,
    ) -> Result<Option<UserGuard>, LockError> {
        let name = format!("order:{user_id}");
        let owner_id = format!("purchase-{purchase}");
        match self {
            Self::Single(locks) => match locks
                .lock(&name)
                .try_acquire(&locks.owner(&owner_id), lease)
                .await?
            {
                Acquired::Yes(guard) => Ok(Some(UserGuard::Single(guard))),
                Acquired::HeldByOther { .. } => Ok(None),
            },
            Self::RedLock {
                locks,
                node_timeout,
            } => Ok(locks
                .try_acquire(&name, &owner_id, lease, *node_timeout)
                .await?
                .map(UserGuard::RedLock)),
        }
    }

    /// Whether a lock can be taken now: its Redis takes writes, or, with
    /// RedLock, a majority of the nodes do.
    pub async fn check_writable(&self) -> Result<(), LockError> {
        match self {
            Self::Single(locks) => locks.check_writable().await,
            Self::RedLock {
                locks,
                node_timeout,
            } => locks.check_writable(*node_timeout).await,
        }
    }

    /// Waits (at most `timeout`) for releases started by dropped guards.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        match self {
            Self::Single(locks) => locks.shutdown(timeout).await,
            Self::RedLock { locks, .. } => locks.shutdown(timeout).await,
        }
    }
}

impl UserGuard {
    /// The hold's fencing token (see `lock::LockGuard::fence`).
    pub fn fence(&self) -> i64 {
        match self {
            Self::Single(guard) => guard.fence(),
            Self::RedLock(guard) => guard.fence(),
        }
    }

    /// Releases the lock; an error says the hold was lost before (or the
    /// nodes could not be reached), which the caller logs.
    pub async fn unlock(self) -> Result<(), String> {
        match self {
            Self::Single(guard) => guard.unlock().await.map(drop).map_err(|e| e.to_string()),
            Self::RedLock(guard) => {
                let expired = guard.is_expired();
                match guard.unlock().await {
                    0 => Err("no lock node released the lock".into()),
                    _ if expired => {
                        Err("the RedLock validity time ran out before the release".into())
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}
