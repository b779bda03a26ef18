//! The watchdog: one task per lock client that renews the leases of watched
//! holds every third of a lease, in batches (per slot on a cluster), and
//! tells a holder when its hold is found gone or could not be renewed for a
//! whole lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

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
}

/// What renewing a hold takes.
#[derive(Clone)]
pub(super) enum Renewal {
    /// A reentrant (or fair) lock's hash: renewed in batches.
    Plain,
    /// A read-write lock's hold; read holds' lease keys are under `timeouts`.
    ReadWrite { timeouts: Arc<str>, hold: Hold },
}

struct Watched {
    key: Arc<str>,
    owner: Owner,
    renewal: Renewal,
    lost: watch::Sender<bool>,
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

    /// Starts renewing `key` for `owner`, just acquired.
    pub(super) fn watch(
        self: &Arc<Self>,
        key: Arc<str>,
        owner: Owner,
        renewal: Renewal,
    ) -> Registration {
        let (lost, heard) = watch::channel(false);
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
                renewed: Instant::now(),
            },
        );
        if !state.running {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                state.running = true;
                runtime.spawn(run(Arc::downgrade(self)));
            }
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
                chunk
                    .iter()
                    .enumerate()
                    .map(|(i, entry)| (*entry, renewed(i))),
            );
        }
        for entry in &rw {
            let (_, key, owner, Renewal::ReadWrite { timeouts, hold }) = entry else {
                continue;
            };
            let mut invocation = self.renew_rw.key(&**key);
            invocation
                .key(&**timeouts)
                .arg(lease_ms(self.lease))
                .arg(owner.as_str())
                .arg(hold.as_arg());
            let result: Result<bool, Arc<RedisError>> = self
                .conn
                .invoke::<i64>(&invocation)
                .await
                .map(|renewed| renewed == 1)
                .map_err(Arc::new);
            self.settle(std::iter::once((entry, result)));
        }
        true
    }

    /// The plain holds in script calls of at most [`BATCH`] keys.
    fn batches<'a>(&self, plain: &'a [Entry]) -> Vec<Vec<&'a Entry>> {
        super::endpoint::script_batches(self.conn.is_cluster(), plain, |entry| &entry.1, BATCH)
    }

    /// Records renewal results: `Ok(false)` means the hold is gone; an error
    /// counts as gone once renewals have failed for a whole lease.
    fn settle<'a>(
        &self,
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
                watched.renewed = now;
            }
        }
    }
}

type Entry = (u64, Arc<str>, Owner, Renewal);

async fn run(watchdog: Weak<Watchdog>) {
    loop {
        let Some(period) = watchdog.upgrade().map(|w| w.lease / 3) else {
            return;
        };
        tokio::time::sleep(period).await;
        let Some(dog) = watchdog.upgrade() else {
            return;
        };
        if !dog.renew_all().await {
            return;
        }
    }
}
