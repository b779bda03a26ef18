//! One registry of per-voucher background workers (group commit's batch
//! writers, the user-lock gatherers, the async sales' acceptors and stream
//! writers; public for crates built on the service, like the lab's stream
//! writers): at most one per voucher in an instance, the race between
//! starting one and retiring one closed in one place, and every task
//! spawned on the instance's tracker, so that shutdown tells them all to
//! stop and waits for them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use crate::domain::VoucherId;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Every background task of an instance (the `Workers` of each kind, the
/// lifecycle's sweepers): where they are spawned, and the signal that
/// tells them to stop. Cheap to clone.
#[derive(Clone, Default)]
pub struct InstanceTasks {
    pub(crate) tasks: TaskTracker,
    pub(crate) stop: CancellationToken,
}

impl InstanceTasks {
    /// Tells every task to stop and waits for them, at most `limit`;
    /// `false` when some were still running.
    pub async fn stop(&self, limit: std::time::Duration) -> bool {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }

    /// Runs `work` for at most `wait`; what it has not done by then goes on
    /// among these tasks (shutdown waits for it), and the caller goes on.
    pub(crate) async fn wait_then_leave(
        &self,
        wait: std::time::Duration,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        let mut work = Box::pin(work);
        if tokio::time::timeout(wait, &mut work).await.is_err() {
            self.tasks.spawn(work);
        }
    }
}

/// The workers of one kind, by voucher; `H` is what the rest of the
/// instance holds to talk to one (a queue, a set of signals).
pub struct Workers<H> {
    running: Mutex<HashMap<VoucherId, H>>,
    background: InstanceTasks,
}

impl<H: Clone> Workers<H> {
    /// Workers spawned among `background`'s tasks, told to stop by its
    /// signal.
    pub fn new(background: InstanceTasks) -> Self {
        Self {
            running: Mutex::new(HashMap::new()),
            background,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<VoucherId, H>> {
        // A worker that panicked while holding the lock left the map whole
        // (every change is one insert or remove).
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The handle of `voucher_id`'s worker: the registered one while
    /// `alive` says so, else a new one that `start` makes now (given the
    /// stop signal; its task is spawned on the tracker).
    pub fn get_or_start<F>(
        &self,
        voucher_id: VoucherId,
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
    pub(crate) fn get(&self, voucher_id: VoucherId) -> Option<H> {
        self.running().get(&voucher_id).cloned()
    }

    /// Unregisters `voucher_id`'s worker if `retire` agrees. It decides
    /// under the registry's lock, so nobody looks the worker up between
    /// the decision and the removal: a worker checks that nothing new came
    /// for it and leaves in one step. `false` when it stays (or none runs).
    pub fn retire_if(&self, voucher_id: VoucherId, retire: impl FnOnce(&H) -> bool) -> bool {
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
    pub(crate) fn retain(&self, mut keep: impl FnMut(VoucherId, &H) -> bool) {
        self.running()
            .retain(|voucher_id, handle| keep(*voucher_id, handle));
    }
}

/// Workers fed by a queue each (group commit's batch writers, the
/// user-lock gatherers, the async sales' acceptors): sending starts one
/// when needed, and one retires only with its queue empty.
pub(crate) type Queue<T> = mpsc::UnboundedSender<T>;

impl<T: Send + 'static> Workers<Queue<T>> {
    /// Sends `item` to `voucher_id`'s worker, starting one by `start` (given
    /// the queue's receiving end and the stop signal) when none runs or the
    /// running one retired between the lookup and the send.
    pub(crate) fn send<F>(
        &self,
        voucher_id: VoucherId,
        mut item: T,
        start: impl Fn(mpsc::UnboundedReceiver<T>, CancellationToken) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        loop {
            let queue = self.get_or_start(
                voucher_id,
                |queue| !queue.is_closed(),
                |stop| {
                    let (queue, arrivals) = mpsc::unbounded_channel();
                    (queue, start(arrivals, stop))
                },
            );
            match queue.send(item) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => {
                    item = back;
                    self.retire_if(voucher_id, |running| running.same_channel(&queue));
                }
            }
        }
    }

    /// Sends `voucher_id`'s worker the request `make` builds around a reply
    /// channel (as [`Self::send`] does, starting one by `start` when none
    /// runs) and waits for the reply, at most `within` when given.
    pub(crate) async fn ask<R, F>(
        &self,
        voucher_id: VoucherId,
        make: impl FnOnce(oneshot::Sender<R>) -> T,
        within: Option<std::time::Duration>,
        start: impl Fn(mpsc::UnboundedReceiver<T>, CancellationToken) -> F,
    ) -> Result<R, Unanswered>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.send(voucher_id, make(reply), start);
        let answer = match within {
            Some(limit) => tokio::time::timeout(limit, answer)
                .await
                .map_err(|_| Unanswered::Late)?,
            None => answer.await,
        };
        answer.map_err(|_| Unanswered::Dropped)
    }

    /// The loop of a gathering worker: takes what has arrived (up to
    /// `max`, dropping what `wanted` says nobody waits for any more), hands
    /// it to `serve` as one batch, and again, until idle for `idle` (at
    /// shutdown, until its queue is empty). A lone item is served at once;
    /// what arrives meanwhile forms the next batch.
    pub(crate) async fn gather<F, Fut>(
        &self,
        voucher_id: VoucherId,
        mut arrivals: mpsc::UnboundedReceiver<T>,
        stop: CancellationToken,
        (max, idle): (usize, std::time::Duration),
        wanted: impl Fn(&T) -> bool,
        mut serve: F,
    ) where
        F: FnMut(Vec<T>) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let arrived = tokio::select! {
                biased;
                arrived = tokio::time::timeout(idle, arrivals.recv()) => arrived.ok(),
                () = stop.cancelled() => None,
            };
            let first = match arrived {
                Some(Some(item)) => item,
                // Retired (below) and everything served.
                Some(None) => return,
                // Idle, or shutdown: retire once the queue is empty.
                None => {
                    self.retire_idle(voucher_id, &mut arrivals);
                    continue;
                }
            };
            let mut batch = vec![first];
            while batch.len() < max {
                match arrivals.try_recv() {
                    Ok(item) => batch.push(item),
                    Err(_) => break,
                }
            }
            batch.retain(&wanted);
            if !batch.is_empty() {
                serve(batch).await;
            }
        }
    }

    /// Retires `voucher_id`'s worker if its queue (`arrivals`) is empty:
    /// removes it and closes the queue (an item that still gets through
    /// before the close is the worker's to finish). `false`: not idle
    /// after all.
    pub(crate) fn retire_idle(
        &self,
        voucher_id: VoucherId,
        arrivals: &mut mpsc::UnboundedReceiver<T>,
    ) -> bool {
        self.retire_if(voucher_id, |_| {
            if !arrivals.is_empty() {
                return false;
            }
            arrivals.close();
            true
        })
    }
}

/// Why a worker asked (`Workers::ask`) gave no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// The request was dropped unanswered (the worker stopped).
    Dropped,
    /// No reply within the time given.
    Late,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn workers() -> (Workers<Arc<AtomicUsize>>, InstanceTasks) {
        let background = InstanceTasks::default();
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
        let a = workers.get_or_start(VoucherId::new(1).unwrap(), |_| true, start);
        let again = workers.get_or_start(VoucherId::new(1).unwrap(), |_| true, start);
        assert!(Arc::ptr_eq(&a, &again), "one worker per voucher");
        workers.get_or_start(VoucherId::new(2).unwrap(), |_| true, start);
        assert_eq!(started.load(Ordering::SeqCst), 2);
        // A worker that is not alive any more is replaced.
        let replaced = workers.get_or_start(VoucherId::new(1).unwrap(), |_| false, start);
        assert!(!Arc::ptr_eq(&a, &replaced));
        assert_eq!(tasks.len(), 3);

        // Retiring decides under the lock: refused, then accepted.
        assert!(!workers.retire_if(VoucherId::new(2).unwrap(), |_| false));
        assert!(workers.get(VoucherId::new(2).unwrap()).is_some());
        assert!(workers.retire_if(VoucherId::new(2).unwrap(), |_| true));
        assert!(workers.get(VoucherId::new(2).unwrap()).is_none());
        assert!(
            !workers.retire_if(VoucherId::new(2).unwrap(), |_| true),
            "nothing left to retire"
        );

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
                workers.get_or_start(
                    VoucherId::new(v).unwrap(),
                    |_| true,
                    |_| (Arc::new(AtomicUsize::new(0)), async {}),
                )
            })
            .collect();
        workers.retain(|voucher_id, handle| {
            let keep = voucher_id.get() % 2 == 0;
            if !keep {
                handle.store(1, Ordering::SeqCst);
            }
            keep
        });
        let told: Vec<usize> = handles.iter().map(|h| h.load(Ordering::SeqCst)).collect();
        assert_eq!(told, vec![1, 0, 1, 0]);
        assert!(
            workers.get(VoucherId::new(1).unwrap()).is_none()
                && workers.get(VoucherId::new(2).unwrap()).is_some()
        );
    }

    #[tokio::test]
    async fn ask_gets_the_workers_reply_or_says_why_there_is_none() {
        let background = InstanceTasks::default();
        let workers: Workers<Queue<(u32, oneshot::Sender<u32>)>> = Workers::new(background);
        // Voucher n's worker: 1 answers double, 2 drops what it gets, 3
        // keeps it unanswered.
        let start = |voucher_id: VoucherId| {
            move |mut arrivals: mpsc::UnboundedReceiver<(u32, oneshot::Sender<u32>)>,
                  _stop: CancellationToken| async move {
                let mut kept = Vec::new();
                while let Some((n, reply)) = arrivals.recv().await {
                    match voucher_id.get() {
                        1 => drop(reply.send(n * 2)),
                        2 => drop(reply),
                        _ => kept.push(reply),
                    }
                }
            }
        };
        let ask = |voucher_id: VoucherId, within: Option<Duration>| {
            workers.ask(voucher_id, |reply| (21, reply), within, start(voucher_id))
        };
        assert_eq!(ask(VoucherId::new(1).unwrap(), None).await, Ok(42));
        assert_eq!(
            ask(VoucherId::new(1).unwrap(), Some(Duration::from_secs(5))).await,
            Ok(42)
        );
        assert_eq!(
            ask(VoucherId::new(2).unwrap(), None).await,
            Err(Unanswered::Dropped)
        );
        assert_eq!(
            ask(VoucherId::new(3).unwrap(), Some(Duration::from_millis(20))).await,
            Err(Unanswered::Late)
        );
    }
}
