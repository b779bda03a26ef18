//! The per-user purchase lock: on the service's Redis (the default), or
//! RedLock over independent Redis nodes when `SECKILL_LOCK_REDIS_URLS` names
//! them, so that losing one Redis does not stop (or split) purchases; and
//! [`LockBatcher`], which takes the locks of a voucher's purchases that arrive
//! together in one call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_locks::{Acquired, Lease, LockClient, LockError, LockGuard, MultiGuard, MultiNodeLocks};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::error::SeckillError;
use super::metric;
use super::workers::{InstanceTasks, Queue, Unanswered, Workers};
use crate::domain::{FencingToken, UserId, VoucherId};
use crate::kv::Keys;

/// Most locks one gathered call takes.
const GATHER_MAX: usize = redis_locks::LOCKS_PER_CALL;
/// A voucher's locker with nothing to do for this long stops.
const GATHER_IDLE: Duration = Duration::from_secs(30);

/// Where users' purchase locks live.
#[derive(Clone)]
pub enum LockBackend {
    /// One Redis.
    Single(LockClient),
    /// A majority of independent Redis nodes; each is given at most
    /// `node_timeout` to answer.
    RedLock {
        locks: MultiNodeLocks,
        node_timeout: Duration,
    },
    /// None: one order per user rests on the sale statement and its unique
    /// index alone (`SECKILL_USER_LOCKS=off`, to measure what the lock
    /// buys; see the guide's "Why the lock").
    Off,
}

/// A user's lock, held.
pub enum UserGuard {
    Single(LockGuard),
    RedLock(MultiGuard),
    /// With [`LockBackend::Off`]: nothing held, nothing fenced.
    Unlocked,
}

impl LockBackend {
    /// Takes `user_id`'s lock for one purchase of `voucher_id`, without
    /// waiting: `None` when another purchase of the user holds it.
    pub async fn try_lock(
        &self,
        voucher_id: VoucherId,
        user_id: UserId,
        purchase: u64,
        lease: Duration,
    ) -> Result<Option<UserGuard>, LockError> {
        let (name, owner_id) = lock_of(voucher_id, user_id, purchase);
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
            Self::Off => Ok(Some(UserGuard::Unlocked)),
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
            Self::Off => Ok(()),
        }
    }

    /// Releases many held locks together (a batch that just committed): in
    /// one Redis call per [`redis_locks::LOCKS_PER_CALL`] locks on one Redis;
    /// with RedLock, each on its own, all at once. One answer per guard, in
    /// order, as [`UserGuard::unlock`] gives it.
    pub async fn unlock_all(&self, guards: Vec<UserGuard>) -> Vec<Result<(), ReleaseError>> {
        match self {
            Self::Single(locks) => {
                let mut answers = Vec::with_capacity(guards.len());
                let (mut at, mut single) = (Vec::new(), Vec::new());
                for (i, guard) in guards.into_iter().enumerate() {
                    match guard {
                        UserGuard::Single(guard) => {
                            at.push(i);
                            single.push(guard);
                            answers.push(Ok(()));
                        }
                        // Not made by an instance with one Redis; released
                        // all the same.
                        other => answers.push(other.unlock().await),
                    }
                }
                for (i, released) in at.into_iter().zip(locks.unlock_all(single).await) {
                    answers[i] = released.map(drop).map_err(ReleaseError::from);
                }
                answers
            }
            Self::RedLock { .. } | Self::Off => {
                futures_util::future::join_all(guards.into_iter().map(UserGuard::unlock)).await
            }
        }
    }

    /// Waits (at most `timeout`) for releases started by dropped guards.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        match self {
            Self::Single(locks) => locks.shutdown(timeout).await,
            Self::RedLock { locks, .. } => locks.shutdown(timeout).await,
            Self::Off => true,
        }
    }
}

impl UserGuard {
    /// The hold's fencing token (see `lock::LockGuard::fence`), wrapped as
    /// the service's own; none without a lock.
    pub fn fence(&self) -> Option<FencingToken> {
        match self {
            Self::Single(guard) => Some(FencingToken::new(guard.fence())),
            Self::RedLock(guard) => Some(FencingToken::new(guard.fence())),
            Self::Unlocked => None,
        }
    }

    /// Releases the lock; an error says the hold was lost before (or the
    /// nodes could not be reached), which the caller logs.
    pub async fn unlock(self) -> Result<(), ReleaseError> {
        match self {
            Self::Single(guard) => Ok(guard.unlock().await.map(drop)?),
            Self::RedLock(guard) => {
                let expired = guard.is_expired();
                match guard.unlock().await {
                    0 => Err(ReleaseError::NoNode),
                    _ if expired => Err(ReleaseError::Expired),
                    _ => Ok(()),
                }
            }
            Self::Unlocked => Ok(()),
        }
    }
}

/// Why a release did not go as planned (the caller logs it; the lease
/// frees what was not released).
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("no lock node released the lock")]
    NoNode,
    #[error("the RedLock validity time ran out before the release")]
    Expired,
}

/// The lock of `user_id`'s purchases of `voucher_id` (one live order per
/// user and voucher: a user may buy two vouchers at once), and the owner
/// id of one of them.
pub fn lock_of(voucher_id: VoucherId, user_id: UserId, purchase: u64) -> (String, String) {
    (
        Keys::user_lock(voucher_id, user_id),
        format!("purchase-{purchase}"),
    )
}

/// Takes users' locks for purchases, without waiting: on one Redis, those
/// of a voucher's purchases that reach this instance while its previous
/// call is under way go together in the next call
/// (`LockClient::try_acquire_all`, one run of the acquire script for up to
/// `redis_locks::LOCKS_PER_CALL` locks), as group commit gathers a batch; a
/// lone purchase goes at once. With RedLock, each purchase on its own;
/// with the locks off, none.
pub struct LockBatcher {
    locks: LockBackend,
    lease: Duration,
    /// Longest a purchase waits for its lock's answer: the call ahead of it,
    /// then its own.
    wait: Duration,
    workers: Workers<Queue<LockRequest>>,
}

struct LockRequest {
    user_id: UserId,
    purchase: u64,
    reply: oneshot::Sender<Result<Option<UserGuard>, LockError>>,
}

impl LockBatcher {
    /// LockBatcher of `locks` giving holds of `lease`, their workers among
    /// `background`'s tasks.
    pub fn new(locks: LockBackend, lease: Duration, background: InstanceTasks) -> Arc<Self> {
        let wait = match &locks {
            LockBackend::Single(client) => client.command_timeout() * 2,
            LockBackend::RedLock { node_timeout, .. } => *node_timeout * 2,
            LockBackend::Off => Duration::ZERO,
        };
        Arc::new(Self {
            locks,
            lease,
            wait,
            workers: Workers::new(background),
        })
    }

    /// Takes `user_id`'s lock for one purchase of `voucher_id`, without
    /// waiting for its holder: `None` when another purchase of the user
    /// holds it. A lock taken after its purchase stopped waiting is given
    /// back (its guard drops). The time each answer took is recorded; with
    /// the locks off there is nothing to take or time.
    pub async fn try_lock(
        self: &Arc<Self>,
        voucher_id: VoucherId,
        user_id: UserId,
        purchase: u64,
    ) -> Result<Option<UserGuard>, SeckillError> {
        if matches!(self.locks, LockBackend::Off) {
            return Ok(Some(UserGuard::Unlocked));
        }
        let asked = Instant::now();
        let acquired = self.take(voucher_id, user_id, purchase).await?;
        metrics::histogram!(metric::LOCK_ACQUIRE_SECONDS).record(asked.elapsed().as_secs_f64());
        Ok(acquired)
    }

    async fn take(
        self: &Arc<Self>,
        voucher_id: VoucherId,
        user_id: UserId,
        purchase: u64,
    ) -> Result<Option<UserGuard>, SeckillError> {
        if matches!(self.locks, LockBackend::RedLock { .. }) {
            return Ok(self
                .locks
                .try_lock(voucher_id, user_id, purchase, self.lease)
                .await?);
        }
        let answer = self
            .workers
            .ask(
                voucher_id,
                |reply| LockRequest {
                    user_id,
                    purchase,
                    reply,
                },
                Some(self.wait),
                |arrivals, stop| self.clone().lock_arrivals(voucher_id, arrivals, stop),
            )
            .await;
        match answer {
            Ok(answer) => Ok(answer?),
            Err(Unanswered::Dropped) => Err(SeckillError::redis_unavailable(
                "the lock's call to Redis was dropped",
            )),
            Err(Unanswered::Late) => Err(SeckillError::redis_unavailable(
                "Redis did not answer the lock in time",
            )),
        }
    }

    /// One voucher's locker: takes the locks of what has arrived in one
    /// call, answers each, and again (see `Workers::gather`).
    async fn lock_arrivals(
        self: Arc<Self>,
        voucher_id: VoucherId,
        arrivals: mpsc::UnboundedReceiver<LockRequest>,
        stop: CancellationToken,
    ) {
        let LockBackend::Single(client) = &self.locks else {
            return;
        };
        let lease = Lease::Fixed(self.lease);
        self.workers
            .gather(
                voucher_id,
                arrivals,
                stop,
                (GATHER_MAX, GATHER_IDLE),
                |request| !request.reply.is_closed(),
                |batch| async move {
                    let names: Vec<(redis_locks::Lock, redis_locks::Owner)> = batch
                        .iter()
                        .map(|request| {
                            let (name, owner) =
                                lock_of(voucher_id, request.user_id, request.purchase);
                            (client.lock(&name), client.owner(owner))
                        })
                        .collect();
                    let tries: Vec<_> = names
                        .iter()
                        .map(|(lock, owner)| (lock, owner, lease))
                        .collect();
                    let answers = client.try_acquire_all(&tries).await;
                    for (request, answer) in batch.into_iter().zip(answers) {
                        let answer = answer.map(|acquired| match acquired {
                            Acquired::Yes(guard) => Some(UserGuard::Single(guard)),
                            Acquired::HeldByOther { .. } => None,
                        });
                        // A purchase that stopped waiting: its guard, if
                        // any, drops here and is given back.
                        let _ = request.reply.send(answer);
                    }
                },
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_purchase_of_a_user_and_voucher_takes_one_lock_under_its_own_owner() {
        let (voucher, user) = (VoucherId::new(7).unwrap(), UserId::new(9).unwrap());
        let (lock, first) = lock_of(voucher, user, 1);
        let (same_lock, second) = lock_of(voucher, user, 2);
        // One lock, so one fencing counter: a newer hold of it has the
        // larger token, whichever purchase took it.
        assert_eq!(lock, same_lock);
        assert_ne!(first, second);
        // Another voucher of the user, or another user: another lock.
        assert_ne!(lock_of(VoucherId::new(8).unwrap(), user, 1).0, lock);
        assert_ne!(lock_of(voucher, UserId::new(10).unwrap(), 1).0, lock);
    }

    #[tokio::test]
    async fn with_the_locks_off_every_purchase_goes_on_unfenced() {
        let locks = LockBackend::Off;
        let (voucher, user) = (VoucherId::new(7).unwrap(), UserId::new(9).unwrap());
        let lease = Duration::from_secs(5);
        let mut guards = Vec::new();
        for purchase in [1, 2] {
            let guard = locks
                .try_lock(voucher, user, purchase, lease)
                .await
                .unwrap();
            let guard = guard.expect("no lock to be held by another purchase");
            assert_eq!(guard.fence(), None, "purchase {purchase}");
            guards.push(guard);
        }
        let released = locks.unlock_all(guards).await;
        assert_eq!(released.len(), 2);
        assert!(released.iter().all(Result::is_ok));
    }
}
