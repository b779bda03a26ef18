//! One registry of per-voucher background workers (group commit's batch
//! writers, the async sales' stream writers, the lab's stream writers):
//! at most one per voucher in an
//! instance, the race between starting one and retiring one closed in one
//! place, and every task spawned on the instance's tracker, so that
//! shutdown tells them all to stop and waits for them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// An instance's background tasks: where they are spawned, and the
/// signal that tells them to stop. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Background {
    pub(crate) tasks: TaskTracker,
    pub(crate) stop: CancellationToken,
}

impl Background {
    /// Tells every task to stop and waits for them, at most `limit`;
    /// `false` when some were still running.
    pub(crate) async fn stop(&self, limit: std::time::Duration) -> bool {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }
}

/// The workers of one kind, by voucher; `H` is what the rest of the
/// instance holds to talk to one (a queue, a set of signals).
pub(crate) struct Workers<H> {
    running: Mutex<HashMap<i64, H>>,
    background: Background,
}

impl<H: Clone> Workers<H> {
    /// Workers spawned among `background`'s tasks, told to stop by its
    /// signal.
    pub(crate) fn new(background: Background) -> Self {
        Self {
            running: Mutex::new(HashMap::new()),
            background,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<i64, H>> {
        // A worker that panicked while holding the lock left the map whole
        // (every change is one insert or remove).
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The handle of `voucher_id`'s worker: the registered one while
    /// `alive` says so, else a new one that `start` makes now (given the
    /// stop signal; its task is spawned on the tracker).
    pub(crate) fn get_or_start<F>(
        &self,
        voucher_id: i64,
        alive: impl FnOnce(&H) -> bool,
        start: impl FnOnce(CancellationToken) -> (H, F),
    ) -> H
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut running = self.running();
        if let Some(handle) = running.get(&voucher_id) {
            if alive(handle) {
                return handle.clone();
            }
        }
        let (handle, task) = start(self.background.stop.clone());
        running.insert(voucher_id, handle.clone());
        self.background.tasks.spawn(task);
        handle
    }

    /// The handle of `voucher_id`'s worker, if one is registered.
    pub(crate) fn get(&self, voucher_id: i64) -> Option<H> {
        self.running().get(&voucher_id).cloned()
    }

    /// Unregisters `voucher_id`'s worker if `retire` agrees. It decides
    /// under the registry's lock, so nobody looks the worker up between
    /// the decision and the removal: a worker checks that nothing new came
    /// for it and leaves in one step. `false` when it stays (or none runs).
    pub(crate) fn retire_if(&self, voucher_id: i64, retire: impl FnOnce(&H) -> bool) -> bool {
        let mut running = self.running();
        match running.get(&voucher_id) {
            Some(handle) if retire(handle) => {
                running.remove(&voucher_id);
                true
            }
            _ => false,
        }
    }

    /// Keeps the workers `keep` says yes to (it may signal the others).
    pub(crate) fn retain(&self, mut keep: impl FnMut(i64, &H) -> bool) {
        self.running()
            .retain(|voucher_id, handle| keep(*voucher_id, handle));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn workers() -> (Workers<Arc<AtomicUsize>>, Background) {
        let background = Background::default();
        (Workers::new(background.clone()), background)
    }

    #[tokio::test]
    async fn one_worker_per_voucher_until_it_retires_and_shutdown_waits_for_all() {
        let (workers, background) = workers();
        let tasks = &background.tasks;
        let started = Arc::new(AtomicUsize::new(0));
        let start = |stop: CancellationToken| {
            started.fetch_add(1, Ordering::SeqCst);
            let handle = Arc::new(AtomicUsize::new(0));
            (handle, async move { stop.cancelled().await })
        };
        let a = workers.get_or_start(1, |_| true, start);
        let again = workers.get_or_start(1, |_| true, start);
        assert!(Arc::ptr_eq(&a, &again), "one worker per voucher");
        workers.get_or_start(2, |_| true, start);
        assert_eq!(started.load(Ordering::SeqCst), 2);
        // A worker that is not alive any more is replaced.
        let replaced = workers.get_or_start(1, |_| false, start);
        assert!(!Arc::ptr_eq(&a, &replaced));
        assert_eq!(tasks.len(), 3);

        // Retiring decides under the lock: refused, then accepted.
        assert!(!workers.retire_if(2, |_| false));
        assert!(workers.get(2).is_some());
        assert!(workers.retire_if(2, |_| true));
        assert!(workers.get(2).is_none());
        assert!(!workers.retire_if(2, |_| true), "nothing left to retire");

        assert!(
            background.stop(Duration::from_secs(1)).await,
            "every worker stopped when told"
        );
        assert_eq!(tasks.len(), 0);
    }

    #[test]
    fn retain_keeps_what_it_is_told_and_signals_the_rest() {
        let (workers, _) = workers();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let handles: Vec<_> = (1..=4)
            .map(|v| {
                workers.get_or_start(v, |_| true, |_| (Arc::new(AtomicUsize::new(0)), async {}))
            })
            .collect();
        workers.retain(|voucher_id, handle| {
            let keep = voucher_id % 2 == 0;
            if !keep {
                handle.store(1, Ordering::SeqCst);
            }
            keep
        });
        let told: Vec<usize> = handles.iter().map(|h| h.load(Ordering::SeqCst)).collect();
        assert_eq!(told, vec![1, 0, 1, 0]);
        assert!(workers.get(1).is_none() && workers.get(2).is_some());
    }
}
