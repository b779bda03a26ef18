//! The watchdog: one task per lock client that keeps alive every lock taken
//! without an explicit lease, renewing them in batches every third of the
//! lease, and tells a holder at once when its lock is found gone.
//!
//! Redisson's watchdog notices a lost lock too, but only stops renewing: the
//! holder learns it at unlock, after it has done its work unprotected. Here
//! the guard's `lost()` fires at the first renewal that finds the lock gone,
//! or when renewals have failed for a whole lease (Redis unreachable: the
//! lock has expired by then whatever happened).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use deadpool_redis::redis::Script;
use deadpool_redis::Pool;
use tokio::sync::watch;

use super::Owner;

/// Most locks renewed by one script call.
const BATCH: usize = 256;

pub(super) struct Watchdog {
    pub(super) lease: Duration,
    pool: Pool,
    renew: Script,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    watched: HashMap<u64, Watched>,
    /// Whether the renewal task is running; it stops when nothing is
    /// watched and starts again with the next lock.
    running: bool,
}

struct Watched {
    key: Arc<str>,
    owner: Owner,
    lost: watch::Sender<bool>,
    renewed: Instant,
}

/// A guard's registration: what it hears, and how it deregisters.
pub(super) struct Registration {
    pub(super) id: u64,
    pub(super) lost: watch::Receiver<bool>,
}

impl Watchdog {
    pub(super) fn new(pool: Pool, lease: Duration) -> Arc<Self> {
        Arc::new(Self {
            lease,
            pool,
            renew: Script::new(include_str!("../../lua/lock_renew.lua")),
            state: Mutex::new(State::default()),
        })
    }

    /// Starts renewing `key` for `owner`, just acquired.
    pub(super) fn watch(self: &Arc<Self>, key: Arc<str>, owner: Owner) -> Registration {
        let (lost, heard) = watch::channel(false);
        let mut state = self.state.lock().expect("watchdog state poisoned");
        let id = state.next_id;
        state.next_id += 1;
        state.watched.insert(
            id,
            Watched {
                key,
                owner,
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

    /// One round: renews every watched lock, and reports the lost ones.
    /// Returns false when there is nothing left to watch.
    async fn renew_all(&self) -> bool {
        let batch: Vec<(u64, Arc<str>, Owner)> = {
            let mut state = self.state.lock().expect("watchdog state poisoned");
            if state.watched.is_empty() {
                state.running = false;
                return false;
            }
            state
                .watched
                .iter()
                .map(|(id, w)| (*id, w.key.clone(), w.owner.clone()))
                .collect()
        };
        for chunk in batch.chunks(BATCH) {
            let mut invocation = self.renew.prepare_invoke();
            invocation.arg(lease_ms(self.lease));
            for (_, key, owner) in chunk {
                invocation.key(&**key).arg(owner.as_str());
            }
            let result: Result<Vec<i64>, String> = async {
                let mut conn = self.pool.get().await.map_err(|e| e.to_string())?;
                invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())
            }
            .await;
            let now = Instant::now();
            let mut state = self.state.lock().expect("watchdog state poisoned");
            for (i, (id, key, owner)) in chunk.iter().enumerate() {
                let Some(watched) = state.watched.get_mut(id) else {
                    continue;
                };
                let gone = match &result {
                    Ok(renewed) => renewed.get(i) == Some(&0),
                    // Unreachable for a whole lease: expired by now.
                    Err(_) => now.duration_since(watched.renewed) >= self.lease,
                };
                if gone {
                    tracing::warn!(%key, %owner, "lock lost: its lease could not be renewed");
                    let _ = watched.lost.send(true);
                    state.watched.remove(id);
                } else if result.is_ok() {
                    watched.renewed = now;
                }
            }
            if let Err(error) = &result {
                tracing::warn!(%error, "renewing lock leases failed; retrying");
            }
        }
        true
    }
}

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

fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}
