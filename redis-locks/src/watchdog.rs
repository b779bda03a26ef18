//! The watchdog: one task per lock client that renews the leases of watched
//! holds every third of a lease, in batches (per slot on a cluster), and
//! tells a holder when its hold is found gone, or as soon as its lease can
//! have run out unrenewed (a lease past its last renewal's sending), even
//! while a renewal is still on its way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use std::future::Future;

use redis::{RedisError, Script};
use tokio::sync::watch;

use super::lock::lease_ms;
use super::{Hold, Owner};

/// Most locks renewed by one script call.
const BATCH: usize = 256;

pub(super) struct Watchdog {
    pub(super) lease: Duration,
    conn: Arc<super::SharedConnection>,
    renew: Script,
    renew_rw: Script,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    watched: HashMap<u64, Watched>,
    /// Whether the renewal task runs; it stops when nothing is watched.
    running: bool,
    /// Which renewal task is the running one: a task that ends (its
    /// runtime shut down) clears `running` only if it is still this one.
    task: u64,
}

/// What renewing a hold takes.
#[derive(Clone)]
pub(super) enum Renewal {
    /// A reentrant (or fair) lock's hash: renewed in batches.
    Plain,
    /// A read-write lock's hold: the write hold, or the read hold `id` of
    /// the lock's read holds (`holds`).
    ReadWrite {
        holds: Arc<str>,
        hold: Hold,
        id: Arc<str>,
    },
}

struct Watched {
    key: Arc<str>,
    owner: Owner,
    renewal: Renewal,
    lost: watch::Sender<bool>,
    /// When the last request that set the lease went out: the lease runs
    /// from a moment no earlier, so it can have ended a lease after this.
    renewed: Instant,
}

/// A guard's registration: what it hears, and how it deregisters.
pub(super) struct Registration {
    pub(super) id: u64,
    pub(super) lost: watch::Receiver<bool>,
}

impl Watchdog {
    pub(super) fn new(conn: Arc<super::SharedConnection>, lease: Duration) -> Arc<Self> {
        Arc::new(Self {
            lease,
            conn,
            renew: Script::new(include_str!("../lua/lock_renew.lua")),
            renew_rw: Script::new(include_str!("../lua/rwlock_renew.lua")),
            state: Mutex::new(State::default()),
        })
    }

    /// Starts renewing `key` for `owner`, just acquired by a request sent
    /// at `sent`.
    pub(super) fn watch(
        self: &Arc<Self>,
        key: Arc<str>,
        owner: Owner,
        renewal: Renewal,
        sent: Instant,
    ) -> Registration {
        let (lost, heard) = watch::channel(false);
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (id, start) = {
            let mut state = self.state.lock().expect("watchdog state poisoned");
            let id = state.next_id;
            state.next_id += 1;
            state.watched.insert(
                id,
                Watched {
                    key,
                    owner,
                    renewal,
                    lost,
                    renewed: sent,
                },
            );
            let start = !state.running && runtime.is_some();
            if start {
                state.running = true;
                state.task += 1;
            }
            (id, start.then_some(state.task))
        };
        // Spawned without the state's lock: a runtime shutting down drops
        // the task at once, and its marker takes the lock.
        if let (Some(runtime), Some(task)) = (runtime, start) {
            // The marker goes in with the future, so that it is dropped
            // even if the task is never polled.
            let running = Running {
                watchdog: Arc::downgrade(self),
                task,
            };
            runtime.spawn(run(Arc::downgrade(self), running));
        }
        Registration { id, lost: heard }
    }

    /// Stops renewing a lock (it is being released).
    pub(super) fn unwatch(&self, id: u64) {
        self.state
            .lock()
            .expect("watchdog state poisoned")
            .watched
            .remove(&id);
    }

    /// Locks being renewed now (for tests and metrics).
    pub(super) fn watched(&self) -> usize {
        self.state
            .lock()
            .expect("watchdog state poisoned")
            .watched
            .len()
    }

    /// Renews every watched lock once; false when none is left to watch.
    async fn renew_all(&self) -> bool {
        let (plain, rw): (Vec<Entry>, Vec<Entry>) = {
            let mut state = self.state.lock().expect("watchdog state poisoned");
            if state.watched.is_empty() {
                state.running = false;
                return false;
            }
            state
                .watched
                .iter()
                .map(|(id, w)| (*id, w.key.clone(), w.owner.clone(), w.renewal.clone()))
                .partition(|(_, _, _, renewal)| matches!(renewal, Renewal::Plain))
        };
        for chunk in self.batches(&plain) {
            let sent = Instant::now();
            let mut invocation = self.renew.prepare_invoke();
            invocation.arg(lease_ms(self.lease));
            for (_, key, owner, _) in &chunk {
                invocation.key(&**key).arg(owner.as_str());
            }
            let result: Result<Vec<i64>, Arc<RedisError>> =
                self.conn.invoke(&invocation).await.map_err(Arc::new);
            let renewed = |i: usize| {
                result
                    .as_ref()
                    .map(|r| r.get(i) != Some(&0))
                    .map_err(Clone::clone)
            };
            self.settle(
                sent,
                chunk
                    .iter()
                    .enumerate()
                    .map(|(i, entry)| (*entry, renewed(i))),
            );
        }
        for entry in &rw {
            let (_, key, owner, Renewal::ReadWrite { holds, hold, id }) = entry else {
                continue;
            };
            let sent = Instant::now();
            let mut invocation = self.renew_rw.key(&**key);
            invocation
                .key(&**holds)
                .arg(lease_ms(self.lease))
                .arg(owner.as_str())
                .arg(hold.as_arg())
                .arg(&**id);
            let result: Result<bool, Arc<RedisError>> = self
                .conn
                .invoke::<i64>(&invocation)
                .await
                .map(|renewed| renewed == 1)
                .map_err(Arc::new);
            self.settle(sent, std::iter::once((entry, result)));
        }
        true
    }

    /// The plain holds in script calls of at most [`BATCH`] keys.
    fn batches<'a>(&self, plain: &'a [Entry]) -> Vec<Vec<&'a Entry>> {
        super::endpoint::script_batches(self.conn.is_cluster(), plain, |entry| &entry.1, BATCH)
    }

    /// Records the results of renewals sent at `sent`: `Ok(false)` means
    /// the hold is gone; an error counts as gone once a whole lease has
    /// passed since the last renewal's sending.
    fn settle<'a>(
        &self,
        sent: Instant,
        results: impl Iterator<Item = (&'a Entry, Result<bool, Arc<RedisError>>)>,
    ) {
        let now = Instant::now();
        let mut state = self.state.lock().expect("watchdog state poisoned");
        for ((id, key, owner, _), result) in results {
            let Some(watched) = state.watched.get_mut(id) else {
                continue;
            };
            let gone = match &result {
                Ok(renewed) => !renewed,
                // Unreachable for a whole lease: expired by now.
                Err(_) => now.duration_since(watched.renewed) >= self.lease,
            };
            if let Err(error) = &result {
                tracing::warn!(%key, %error, "renewing a lock lease failed; retrying");
            }
            if gone {
                tracing::warn!(%key, %owner, "lock lost: its lease could not be renewed");
                let _ = watched.lost.send(true);
                state.watched.remove(id);
            } else if result.is_ok() {
                watched.renewed = sent;
            }
        }
    }

    /// When the first watched lease can run out unrenewed (a lease from now
    /// when none is watched: a hold watched meanwhile has at least that).
    fn next_expiry(&self) -> Instant {
        let state = self.state.lock().expect("watchdog state poisoned");
        state
            .watched
            .values()
            .map(|w| w.renewed + self.lease)
            .min()
            .unwrap_or_else(|| Instant::now() + self.lease)
    }

    /// Tells every holder whose lease can have run out unrenewed by now
    /// that its hold is lost, and stops renewing it.
    fn expire_overdue(&self) {
        let now = Instant::now();
        let mut state = self.state.lock().expect("watchdog state poisoned");
        state.watched.retain(|_, watched| {
            if now < watched.renewed + self.lease {
                return true;
            }
            tracing::warn!(key = %watched.key, owner = %watched.owner,
                "lock lost: its lease ran out before a renewal was confirmed");
            let _ = watched.lost.send(true);
            false
        });
    }
}

type Entry = (u64, Arc<str>, Owner, Renewal);

async fn run(watchdog: Weak<Watchdog>, _running: Running) {
    loop {
        let Some(period) = watchdog.upgrade().map(|w| w.lease / 3) else {
            return;
        };
        if expiring(&watchdog, tokio::time::sleep(period))
            .await
            .is_none()
        {
            return;
        }
        let Some(dog) = watchdog.upgrade() else {
            return;
        };
        if expiring(&watchdog, dog.renew_all()).await != Some(true) {
            return;
        }
    }
}

/// Runs `work` to its end, telling the holders meanwhile whose leases run
/// out unrenewed (a renewal on its way may take the command's whole
/// deadline, longer than what is left of a lease); `None` when the
/// watchdog is gone.
async fn expiring<T>(watchdog: &Weak<Watchdog>, work: impl Future<Output = T>) -> Option<T> {
    tokio::pin!(work);
    loop {
        let deadline = watchdog.upgrade()?.next_expiry();
        tokio::select! {
            done = &mut work => return Some(done),
            _ = tokio::time::sleep_until(deadline.into()) => watchdog.upgrade()?.expire_overdue(),
        }
    }
}

/// Held by the renewal task: when the task ends, however (its runtime shut
/// down with it), the next watched hold starts another.
struct Running {
    watchdog: Weak<Watchdog>,
    task: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(dog) = self.watchdog.upgrade() {
            if let Ok(mut state) = dog.state.lock() {
                if state.task == self.task {
                    state.running = false;
                }
            }
        }
    }
}
