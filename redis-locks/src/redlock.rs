//! Locks over several independent Redis nodes: RedLock (a majority) and
//! MultiLock (every node), each hold trusted for its validity time only:
//! lease − time spent acquiring − clock drift (1 % of the lease + 2 ms).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::{Acquired, LockClient, LockError, LockGuard, Owner};

/// How many nodes must grant the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quorum {
    /// N/2 + 1 of N nodes (RedLock).
    Majority,
    /// Every node (MultiLock).
    All,
}

/// RedLock or MultiLock over independent Redis nodes, one [`LockClient`]
/// each (never replicas of one another: a replica that misses a write would
/// grant the lock twice). Holds have fixed leases, renewed by nobody.
///
/// ```rust
/// use std::time::Duration;
///
/// use redis_locks::{LockClient, MultiNodeLocks, Quorum};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// # let node = LockClient::new(client.clone(), format!("redis-locks-doc:{}:", uuid::Uuid::new_v4().simple()));
/// # let key = node.lock("payout").key().to_owned();
/// let redlock = MultiNodeLocks::new(vec![node], Quorum::Majority); // in production, 3 or 5 nodes
/// let (lease, node_timeout) = (Duration::from_secs(10), Duration::from_millis(500));
/// let guard = redlock.try_acquire("payout", "worker-1", lease, node_timeout).await?.expect("free");
/// assert!(redlock.try_acquire("payout", "worker-2", lease, node_timeout).await?.is_none());
/// assert!(!guard.is_expired()); // trust the hold only until guard.valid_until()
/// assert_eq!(guard.unlock().await, 1);
/// # let mut conn = client.get_multiplexed_async_connection().await?;
/// # redis::cmd("DEL").arg(&key).arg(format!("{key}:fence")).query_async::<()>(&mut conn).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiNodeLocks {
    nodes: Vec<LockClient>,
    quorum: Quorum,
    /// Per node, until when (ms since `epoch`) attempts skip it as down.
    down_until: Arc<Vec<AtomicU64>>,
    epoch: Instant,
}

/// How long a node that failed to answer is skipped.
const SKIP_DOWN_NODE: Duration = Duration::from_secs(1);

enum Vote {
    Granted(LockGuard),
    Held,
    Silent,
}

/// A hold granted by enough nodes.
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
    /// Grants that came after the quorum's; `None` once the hold is given
    /// back, so that a later grant is released at once.
    late: Arc<Mutex<Option<Vec<LockGuard>>>>,
    valid_until: Instant,
}

impl MultiNodeLocks {
    /// `nodes` are clients of independent Redis servers.
    pub fn new(nodes: Vec<LockClient>, quorum: Quorum) -> Self {
        assert!(
            !nodes.is_empty(),
            "a multi-node lock needs at least one node"
        );
        let down_until = Arc::new(nodes.iter().map(|_| AtomicU64::new(0)).collect());
        Self {
            nodes,
            quorum,
            down_until,
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn known_down(&self, node: usize) -> bool {
        self.down_until[node].load(Ordering::Relaxed) > self.now_ms()
    }

    fn mark(&self, node: usize, answered: bool) {
        let until = if answered {
            0
        } else {
            self.now_ms() + u64::try_from(SKIP_DOWN_NODE.as_millis()).unwrap_or(1_000)
        };
        self.down_until[node].store(until, Ordering::Relaxed);
    }

    fn needed(&self) -> usize {
        match self.quorum {
            Quorum::Majority => self.nodes.len() / 2 + 1,
            Quorum::All => self.nodes.len(),
        }
    }

    /// Each node's owner for `id`, under that client's process UUID.
    fn owners(&self, id: &str) -> Vec<Owner> {
        self.nodes.iter().map(|n| n.owner(id)).collect()
    }

    /// Tries once to take lock `name` for owner `id`, asking every node at
    /// once within `node_timeout`, and returns as soon as a quorum granted
    /// it. `Ok(None)`: too few granted in time (what was granted is given
    /// back); `Err(NodesUnavailable)`: too few answered to tell. A node that
    /// failed to answer is skipped, as a refusal, for a second.
    pub async fn try_acquire(
        &self,
        name: &str,
        id: &str,
        lease: Duration,
        node_timeout: Duration,
    ) -> Result<Option<MultiGuard>, LockError> {
        let started = Instant::now();
        let owners = self.owners(id);
        let mut asking: FuturesUnordered<_> = self
            .nodes
            .iter()
            .zip(owners)
            .enumerate()
            .filter(|(i, _)| !self.known_down(*i))
            .map(|(i, (node, owner))| {
                let lock = node.lock(name);
                async move {
                    let vote =
                        match tokio::time::timeout(node_timeout, lock.try_acquire(&owner, lease))
                            .await
                        {
                            Ok(Ok(Acquired::Yes(guard))) => Vote::Granted(guard),
                            Ok(Ok(Acquired::HeldByOther { .. })) => Vote::Held,
                            Ok(Err(error)) => {
                                tracing::debug!(%error, "a lock node failed; counted as a refusal");
                                Vote::Silent
                            }
                            Err(_) => Vote::Silent,
                        };
                    (i, vote)
                }
            })
            .collect();
        let mut votes = Vec::new();
        let mut granted = 0;
        // A refusal waits for every answer, to tell a lock held elsewhere
        // from nodes that are down.
        while let Some((node, vote)) = asking.next().await {
            self.mark(node, !matches!(vote, Vote::Silent));
            granted += usize::from(matches!(vote, Vote::Granted(_)));
            votes.push(vote);
            if granted >= self.needed() {
                break;
            }
        }
        let answered = votes.iter().filter(|v| !matches!(v, Vote::Silent)).count();
        let guards: Vec<LockGuard> = votes
            .into_iter()
            .filter_map(|v| match v {
                Vote::Granted(guard) => Some(guard),
                _ => None,
            })
            .collect();
        let elapsed = started.elapsed();
        let drift = lease / 100 + Duration::from_millis(2);
        let validity = lease.saturating_sub(elapsed).saturating_sub(drift);
        if guards.len() >= self.needed() && !validity.is_zero() {
            let late = Arc::new(Mutex::new(Some(Vec::new())));
            self.hear_out(asking, Arc::downgrade(&late));
            return Ok(Some(MultiGuard {
                guards,
                late,
                valid_until: super::lock::later(started, validity),
            }));
        }
        self.hear_out(asking, Weak::new());
        // Too few, or too late: give back what was granted (a node that
        // timed out may have applied it; its lease frees it).
        release_all(guards).await;
        if answered < self.needed() {
            return Err(LockError::NodesUnavailable {
                answered,
                needed: self.needed(),
            });
        }
        Ok(None)
    }

    /// Hears the nodes still out, in the background: a late grant joins the
    /// hold while it lasts and is given back otherwise.
    fn hear_out(
        &self,
        mut asking: FuturesUnordered<impl Future<Output = (usize, Vote)> + Send + 'static>,
        hold: Weak<Mutex<Option<Vec<LockGuard>>>>,
    ) {
        if asking.is_empty() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            while let Some((node, vote)) = asking.next().await {
                this.mark(node, !matches!(vote, Vote::Silent));
                let Vote::Granted(guard) = vote else { continue };
                let unjoined = match hold.upgrade() {
                    Some(late) => match &mut *late.lock().unwrap_or_else(|e| e.into_inner()) {
                        Some(grants) => {
                            grants.push(guard);
                            None
                        }
                        None => Some(guard),
                    },
                    None => Some(guard),
                };
                if let Some(guard) = unjoined {
                    let _ = guard.unlock().await;
                }
            }
        });
    }

    /// Whether enough nodes take writes now for a quorum (for readiness
    /// checks); `Err(NodesUnavailable)` if not.
    pub async fn check_writable(&self, node_timeout: Duration) -> Result<(), LockError> {
        let checks = self
            .nodes
            .iter()
            .map(|node| tokio::time::timeout(node_timeout, node.check_writable()));
        let answered = join_all(checks)
            .await
            .into_iter()
            .filter(|answer| matches!(answer, Ok(Ok(()))))
            .count();
        if answered < self.needed() {
            return Err(LockError::NodesUnavailable {
                answered,
                needed: self.needed(),
            });
        }
        Ok(())
    }

    /// [`LockClient::shutdown`] on every node.
    pub async fn shutdown(&self, timeout: Duration) -> bool {
        let all = join_all(self.nodes.iter().map(|n| n.shutdown(timeout))).await;
        all.into_iter().all(|done| done)
    }

    /// [`MultiNodeLocks::try_acquire`], retried after a random pause (so
    /// that competitors stop splitting the votes) until `wait` is spent.
    pub async fn acquire(
        &self,
        name: &str,
        id: &str,
        wait: Duration,
        lease: Duration,
        node_timeout: Duration,
    ) -> Result<Option<MultiGuard>, LockError> {
        let deadline = super::lock::deadline_after(wait);
        loop {
            // The last round's answer, if it could not tell: when the wait
            // runs out on it, the lock's state is unknown, not "held".
            let unknown = match self.try_acquire(name, id, lease, node_timeout).await {
                Ok(Some(guard)) => return Ok(Some(guard)),
                Ok(None) => None,
                Err(unavailable @ LockError::NodesUnavailable { .. }) => Some(unavailable),
                Err(other) => return Err(other),
            };
            let pause = Duration::from_millis(rand::random_range(5..50));
            if Instant::now() + pause >= deadline {
                return unknown.map_or(Ok(None), Err);
            }
            tokio::time::sleep(pause).await;
        }
    }
}

impl MultiGuard {
    /// How many nodes granted the lock so far, late grants included.
    pub fn nodes(&self) -> usize {
        self.guards.len() + self.late_grants().as_ref().map_or(0, Vec::len)
    }

    fn late_grants(&self) -> std::sync::MutexGuard<'_, Option<Vec<LockGuard>>> {
        self.late.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the validity time has run out: the hold is not to be trusted.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.valid_until
    }

    /// When the validity time runs out.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// The largest of the quorum's fencing tokens; it grows across holders
    /// only as far as the nodes' clocks agree (not guaranteed).
    pub fn fence(&self) -> i64 {
        self.guards.iter().map(LockGuard::fence).max().unwrap_or(0)
    }

    /// Releases the lock on every node that granted it, and returns how
    /// many did; the others are left to their leases.
    pub async fn unlock(self) -> usize {
        // Closed first: a grant that comes now is given back by its listener.
        let late = self.late_grants().take().unwrap_or_default();
        let mut guards = self.guards;
        guards.extend(late);
        release_all(guards).await
    }
}

async fn release_all(guards: Vec<LockGuard>) -> usize {
    join_all(guards.into_iter().map(LockGuard::unlock))
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count()
}
