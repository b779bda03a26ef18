//! The pause between a read and the write that trusts it: where a real
//! system waits (a call to the payment provider, a GC pause), the lab's
//! actors wait until every actor of the race has read, so that the race
//! happens on every run, however busy the machine.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio::time::Instant;

/// How long a pause lasts at most, from its making: past it, every wait at
/// it returns at once. Only a design that keeps the others from reading (a
/// lock held across its pause) makes it last that long; its actors then go
/// on alone, the race does not happen, and the row says so.
const PATIENCE: Duration = Duration::from_secs(10);

/// Where `actors` racing actors pause after their read, until the lab (the
/// other side of the race, or its clock) has done what it does meanwhile
/// and lets them go on.
#[derive(Clone)]
pub(super) struct Pause {
    read: Arc<Barrier>,
    go: Arc<Barrier>,
    until: Instant,
}

impl Pause {
    pub(super) fn new(actors: usize) -> Self {
        Self {
            read: Arc::new(Barrier::new(actors + 1)),
            go: Arc::new(Barrier::new(actors + 1)),
            until: Instant::now() + PATIENCE,
        }
    }

    /// An actor, after its read: until the lab lets every actor go on.
    pub(super) async fn wait(&self) {
        self.patiently(&self.read).await;
        self.patiently(&self.go).await;
    }

    /// The lab: until every actor has read and paused.
    pub(super) async fn reads(&self) {
        self.patiently(&self.read).await;
    }

    /// The lab: lets every paused actor go on to its write.
    pub(super) async fn release(&self) {
        self.patiently(&self.go).await;
    }

    async fn patiently(&self, barrier: &Barrier) {
        let _ = tokio::time::timeout_at(self.until, barrier.wait()).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Every actor's read comes before what the lab does in the pause, and
    /// that before every actor's write, whatever order the tasks run in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_actor_writes_before_every_read_and_the_labs_step() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let pause = Pause::new(8);
        let mut actors = tokio::task::JoinSet::new();
        for i in 0..8u64 {
            let (log, pause) = (log.clone(), pause.clone());
            actors.spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 7 % 5)).await;
                log.lock().unwrap().push("read");
                pause.wait().await;
                log.lock().unwrap().push("write");
            });
        }
        pause.reads().await;
        log.lock().unwrap().push("lab");
        pause.release().await;
        while let Some(done) = actors.join_next().await {
            done.unwrap();
        }
        let log = log.lock().unwrap();
        let expected: Vec<&str> = [["read"; 8].as_slice(), &["lab"], &["write"; 8]].concat();
        assert_eq!(*log, expected);
    }
}
