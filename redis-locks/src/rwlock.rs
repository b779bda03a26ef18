//! Read-write locks on the model of Redisson's RReadWriteLock. Every read
//! hold has its own lease (an entry of the lock's read holds, named by the
//! guard), so a reader that dies does not keep a writer out past its own
//! lease once the other readers leave, and giving one hold back ends that
//! hold's lease and no other.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{FromRedisValue, ScriptInvocation};

use super::client::Shared;
use super::guard::{GuardCore, GuardedLock};
use super::lock::{lease_left, lease_ms, wait_turn};
use super::watchdog::Renewal;
use super::{Lease, LockError, Owner};

/// A named read-write lock: many readers or one writer, each reentrant. The
/// writer may also read, and by giving back its write hold while it reads,
/// downgrades to a reader; a reader cannot upgrade (it waits out its wait).
/// Holds carry no fencing token. Cheap to clone.
///
/// ```rust
/// use std::time::Duration;
///
/// use redis_locks::{Hold, LockClient};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// # let locks = LockClient::new(client.clone(), format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple()));
/// let catalog = locks.read_write_lock("catalog");
/// let (reader, writer, lease) = (locks.owner("reader"), locks.owner("writer"), Duration::from_secs(10));
/// let reading = catalog.try_read(&reader, lease).await?.expect("a new lock is free");
/// assert!(catalog.try_write(&writer, lease).await?.is_none());
/// reading.unlock().await?;
/// let writing = catalog.write(&writer, Duration::from_secs(1), lease).await?.expect("free again");
/// let downgraded = catalog.try_read(&writer, lease).await?.expect("a writer may read");
/// writing.unlock().await?;
/// assert_eq!(catalog.mode().await?, Some(Hold::Read));
/// downgraded.unlock().await?;
/// # redis::cmd("DEL").arg(catalog.key()).query_async::<()>(&mut client.get_multiplexed_async_connection().await?).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    pub(super) shared: Arc<Shared>,
    pub(super) key: Arc<str>,
}

impl GuardedLock for ReadWriteLock {
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn hash_key(&self) -> &Arc<str> {
        &self.key
    }
}

/// Which hold a guard has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A shared hold: other readers may hold the lock too.
    Read,
    /// The exclusive hold (its owner may also read).
    Write,
}

/// One read or write hold; dropped without `unlock`, it is given back in
/// the background.
#[must_use = "dropping the guard releases the hold at once"]
pub struct RwGuard {
    core: GuardCore<ReadWriteLock>,
    hold: Hold,
    /// The read hold's id in the lock's read holds ('' for the write hold).
    id: Arc<str>,
}

impl fmt::Debug for RwGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core
            .debug(f, "RwGuard")
            .field("hold", &self.hold)
            .finish()
    }
}

impl Hold {
    /// The hold as the scripts name it.
    pub(super) fn as_arg(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

impl ReadWriteLock {
    /// The Redis key of this lock's hash.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key of the lock's read holds: a sorted set of `<id>:<owner>` by
    /// when each hold's lease ends.
    fn holds_key(&self) -> String {
        format!("{}:holds", self.key)
    }

    fn channel(&self) -> String {
        format!("{}:released", self.key)
    }

    async fn run<T: FromRedisValue>(
        &self,
        invocation: ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        Ok(self.shared.conn.invoke(&invocation).await?)
    }

    /// Takes a hold without waiting; `Err(lease_left)` inside: another
    /// owner's hold is in the way.
    async fn attempt(
        &self,
        owner: &Owner,
        hold: Hold,
        lease: Lease,
    ) -> Result<Result<RwGuard, Option<Duration>>, LockError> {
        let term = self.shared.resolve(lease);
        let id: Arc<str> = match hold {
            Hold::Read => uuid::Uuid::new_v4().simple().to_string().into(),
            Hold::Write => "".into(),
        };
        let (granted, value): (i64, i64) = match hold {
            Hold::Read => {
                let mut invocation = self.shared.rw_read.key(&*self.key);
                invocation
                    .key(self.holds_key())
                    .arg(lease_ms(term.lease))
                    .arg(owner.as_str())
                    .arg(&*id);
                self.run(invocation).await?
            }
            Hold::Write => {
                let mut invocation = self.shared.rw_write.key(&*self.key);
                invocation.arg(lease_ms(term.lease)).arg(owner.as_str());
                self.run(invocation).await?
            }
        };
        if granted == 1 {
            let renewal = || Renewal::ReadWrite {
                holds: self.holds_key().into(),
                hold,
                id: id.clone(),
            };
            Ok(Ok(RwGuard {
                core: GuardCore::granted(self.clone(), owner, term, renewal),
                hold,
                id,
            }))
        } else {
            Ok(Err(lease_left(value)))
        }
    }

    /// Takes a hold, waiting at most `wait`.
    async fn wait_for(
        &self,
        owner: &Owner,
        hold: Hold,
        wait: Duration,
        lease: Lease,
    ) -> Result<Option<RwGuard>, LockError> {
        wait_turn(&self.shared.subscriber, &self.channel(), wait, || {
            self.attempt(owner, hold, lease)
        })
        .await
    }

    /// A read hold now, or `None` if a writer has the lock.
    pub async fn try_read(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
    ) -> Result<Option<RwGuard>, LockError> {
        Ok(self.attempt(owner, Hold::Read, lease.into()).await?.ok())
    }

    /// The write hold now, or `None` if readers or another writer have it.
    pub async fn try_write(
        &self,
        owner: &Owner,
        lease: impl Into<Lease>,
    ) -> Result<Option<RwGuard>, LockError> {
        Ok(self.attempt(owner, Hold::Write, lease.into()).await?.ok())
    }

    /// A read hold, waiting at most `wait` for a writer to leave.
    pub async fn read(
        &self,
        owner: &Owner,
        wait: Duration,
        lease: impl Into<Lease>,
    ) -> Result<Option<RwGuard>, LockError> {
        self.wait_for(owner, Hold::Read, wait, lease.into()).await
    }

    /// The write hold, waiting at most `wait` for the others to leave.
    pub async fn write(
        &self,
        owner: &Owner,
        wait: Duration,
        lease: impl Into<Lease>,
    ) -> Result<Option<RwGuard>, LockError> {
        self.wait_for(owner, Hold::Write, wait, lease.into()).await
    }

    /// The lock's mode: `None` when free.
    pub async fn mode(&self) -> Result<Option<Hold>, LockError> {
        let mode: Option<String> = self
            .shared
            .conn
            .query(redis::cmd("HGET").arg(&*self.key).arg("mode"))
            .await?;
        Ok(match mode.as_deref() {
            Some("read") => Some(Hold::Read),
            Some("write") => Some(Hold::Write),
            _ => None,
        })
    }

    async fn release(
        &self,
        owner: &Owner,
        hold: Hold,
        id: &str,
        lease: Duration,
    ) -> Result<u32, LockError> {
        let mut invocation = self.shared.rw_unlock.key(&*self.key);
        invocation
            .key(self.holds_key())
            .key(self.channel())
            .arg(hold.as_arg())
            .arg(owner.as_str())
            .arg(lease_ms(lease))
            .arg(id);
        let left: i64 = self.run(invocation).await?;
        u32::try_from(left).map_err(|_| LockError::not_held(&self.key, owner))
    }
}

impl RwGuard {
    /// Which hold this guard has.
    pub fn hold(&self) -> Hold {
        self.hold
    }

    /// Whether the hold is lost (see [`LockGuard::is_lost`](super::LockGuard::is_lost)).
    pub fn is_lost(&self) -> bool {
        self.core.is_lost()
    }

    /// Resolves when the hold is lost.
    pub async fn lost(&self) {
        self.core.lost().await;
    }

    /// Gives the hold back; returns the owner's holds of this kind left, or
    /// `Err(NotHeld)` if the lease ran out first.
    pub async fn unlock(mut self) -> Result<u32, LockError> {
        let (lock, owner, lease) = self.core.give_back();
        lock.release(owner, self.hold, &self.id, lease).await
    }
}

impl Drop for RwGuard {
    fn drop(&mut self) {
        let (hold, id) = (self.hold, self.id.clone());
        self.core
            .release_on_drop(move |lock, owner, lease| async move {
                lock.release(&owner, hold, &id, lease).await.map(drop)
            });
    }
}
