//! The client that makes locks and owners, and owns what they share: the
//! command connection, the scripts and how they are sent, the subscriber,
//! the watchdog.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Script, ScriptInvocation};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::endpoint::{self, Endpoint};
use super::guard::Term;
use super::lock::{ChangeKind, GiveBack, HoldChange, Lock, LockGuard, Take};
use super::pubsub::Subscriber;
use super::watchdog::Watchdog;
use super::{
    Acquired, FairLock, Lease, LockError, LockOptions, Owner, ReadWriteLock, Released,
    SharedConnection,
};

/// What every lock of one client shares.
pub(super) struct Shared {
    pub(super) conn: Arc<SharedConnection>,
    pub(super) prefix: String,
    pub(super) process: Uuid,
    pub(super) acquire: Script,
    pub(super) release: Script,
    pub(super) force_unlock: Script,
    pub(super) rw_read: Script,
    pub(super) rw_write: Script,
    pub(super) rw_unlock: Script,
    pub(super) fair_acquire: Script,
    pub(super) fair_leave: Script,
    pub(super) subscriber: Arc<Subscriber>,
    pub(super) watchdog: Arc<Watchdog>,
    /// Releases of guards dropped without `unlock`, for `shutdown` to await.
    pub(super) pending_releases: TaskTracker,
}

impl Shared {
    /// The term of a hold whose request goes out now.
    pub(super) fn resolve(&self, lease: Lease) -> Term {
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

    /// Runs a script that remembers its request ids, resent with the same
    /// ids after transient errors, all within one command deadline. `key`
    /// names the lock in the logs.
    pub(super) async fn send_idempotent<T: redis::FromRedisValue>(
        &self,
        key: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
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

    /// Runs `change` for one lock.
    pub(super) async fn change_one<K: ChangeKind>(
        &self,
        change: &HoldChange<'_, K>,
    ) -> Result<K::Output, LockError> {
        let answers = self.change_in_one_call(&[change]).await?;
        change.answer(answers.first().cloned())
    }

    /// Runs the changes of `items`, one call per [`LOCKS_PER_CALL`] of them
    /// (per slot on a cluster), the calls at once; answers keep their `at`.
    pub(super) async fn per_lock<K: ChangeKind>(
        &self,
        items: &[(usize, HoldChange<'_, K>)],
    ) -> Vec<(usize, Result<K::Output, LockError>)> {
        let batches = endpoint::script_batches(
            self.conn.is_cluster(),
            items,
            |(_, change)| change.lock.key(),
            LOCKS_PER_CALL,
        );
        let calls = batches.into_iter().map(|batch| async move {
            let changes: Vec<_> = batch.iter().map(|(_, change)| change).collect();
            let answers = self.change_in_one_call(&changes).await;
            batch
                .iter()
                .enumerate()
                .map(|(i, (at, change))| {
                    let mine = match &answers {
                        Ok(answers) => change.answer(answers.get(i).cloned()),
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

    /// One call of `K`'s script for `changes` (not empty).
    async fn change_in_one_call<K: ChangeKind>(
        &self,
        changes: &[&HoldChange<'_, K>],
    ) -> Result<Vec<K::Answer>, LockError> {
        let (script, last) = K::script(self);
        let mut invocation = script.prepare_invoke();
        for change in changes {
            change.add(&mut invocation);
        }
        invocation.arg(last);
        self.send_idempotent(changes[0].lock.key(), &invocation)
            .await
    }

    /// Releases a dropped guard's hold on a tracked task; failing that (it is
    /// logged), the lease frees the lock.
    pub(super) fn release_in_background(
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

/// Makes locks and owners; cheap to clone, one per process and Redis is
/// enough. It connects on first use, so it can be built while Redis is down.
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<Shared>,
}

impl LockClient {
    /// A client whose keys all start with `prefix` (may be empty), with two
    /// connections to `endpoint`: one for commands, one its waiters share.
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
                subscriber: Subscriber::new(client, options.command_timeout),
                watchdog: Watchdog::new(conn, options.watchdog_lease),
                pending_releases: TaskTracker::new(),
            }),
        }
    }

    /// [`Lock::try_acquire`] for each `(lock, owner, lease)`, up to
    /// [`LOCKS_PER_CALL`] locks a script call (per slot on a cluster); the
    /// answers in the order of `requests`. Another client's lock is tried
    /// on its own.
    pub async fn try_acquire_all(
        &self,
        requests: &[(&Lock, &Owner, Lease)],
    ) -> Vec<Result<Acquired, LockError>> {
        let (ours, others): (Vec<_>, Vec<_>) = requests
            .iter()
            .enumerate()
            .partition(|(_, (lock, ..))| self.owns(lock));
        let takes: Vec<_> = ours
            .into_iter()
            .map(|(at, (lock, owner, lease))| {
                let term = self.shared.resolve(*lease);
                (
                    at,
                    HoldChange::new(lock, owner, Take(term), new_request_id()),
                )
            })
            .collect();
        let alone = others
            .into_iter()
            .map(|(at, (lock, owner, lease))| async move {
                vec![(at, lock.try_acquire(owner, *lease).await)]
            });
        gathered(self.shared.per_lock(&takes), alone).await
    }

    /// [`LockGuard::unlock`] for each of `guards`, up to [`LOCKS_PER_CALL`]
    /// locks a script call (per slot on a cluster); the answers in the order
    /// of `guards`. Another client's guard is given back on its own.
    pub async fn unlock_all(&self, guards: Vec<LockGuard>) -> Vec<Result<Released, LockError>> {
        let (mut ours, others): (Vec<_>, Vec<_>) = guards
            .into_iter()
            .enumerate()
            .partition(|(_, guard)| self.owns(&guard.core.lock));
        let give_backs: Vec<_> = ours
            .iter_mut()
            .map(|(at, guard)| {
                let fence = guard.fence();
                let (lock, owner, lease) = guard.core.give_back();
                (
                    *at,
                    HoldChange::new(lock, owner, GiveBack(lease, Some(fence)), new_request_id()),
                )
            })
            .collect();
        let alone = others
            .into_iter()
            .map(|(at, guard)| async move { vec![(at, guard.unlock().await)] });
        gathered(self.shared.per_lock(&give_backs), alone).await
    }

    /// Whether `lock` was made by this client.
    fn owns(&self, lock: &Lock) -> bool {
        Arc::ptr_eq(&lock.shared, &self.shared)
    }

    /// The deadline of each call to Redis (`LockOptions::command_timeout`).
    pub fn command_timeout(&self) -> Duration {
        self.shared.conn.timeout()
    }

    /// This process's part of every owner it makes.
    pub fn process_id(&self) -> Uuid {
        self.shared.process
    }

    /// The owner `id` of this client's process: the same id is the same
    /// owner (reentrancy); under another client it is another owner.
    pub fn owner(&self, id: impl fmt::Display) -> Owner {
        Owner(format!("{}:{id}", self.shared.process).into())
    }

    /// The lock called `name`, key `{prefix}lock:{name}` (a hash tag: every
    /// key of one lock is in one cluster slot).
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

    /// Whether this client's Redis takes writes now, for readiness checks
    /// (a replica left behind by a failover does not).
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

    /// Waits at most `timeout` for the releases of dropped guards; false if
    /// some were still running.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        let tracker = &self.shared.pending_releases;
        tracker.close();
        tokio::time::timeout(timeout, tracker.wait()).await.is_ok()
    }
}

/// Most locks one call of the acquire or the release script handles.
pub const LOCKS_PER_CALL: usize = 64;

/// The answers of the script calls (`batched`) and of the locks tried
/// alone, in the caller's order.
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

pub(super) fn new_request_id() -> String {
    Uuid::new_v4().simple().to_string()
}

/// Errors after which the command may or may not have been applied.
fn is_transient(error: &LockError) -> bool {
    match error {
        LockError::Redis(e) => e.is_io_error() || e.is_timeout() || e.is_connection_dropped(),
        LockError::NotHeld { .. } | LockError::NodesUnavailable { .. } => false,
    }
}
