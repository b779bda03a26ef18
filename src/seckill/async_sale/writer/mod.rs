//! The stream writer: one task per async voucher in every instance, all of
//! them consumers of the voucher's group. Each reads up to a batch of
//! accepted orders, commits them in one statement (group commit's, via
//! `batch::sell_batch`), and only then acknowledges and deletes them.
//!
//! Idempotent by order id: a batch written twice (a consumer that died
//! after the commit and before the acknowledgement, its entries claimed by
//! another) finds each order held already under the same id and stores
//! nothing twice. Entries of a consumer that died or hangs are claimed by
//! the others (`XAUTOCLAIM`) once idle for `claim_idle`; a consumer that
//! holds nothing and has been idle as long is removed from the group. While
//! Postgres is away the writer keeps its entries and tries them again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{self, streams::StreamId};
use tokio_util::sync::CancellationToken;

use super::reconcile::Pause;
use super::{AsyncSales, SaleKeys, WriterSignals, GROUP};
use crate::domain::VoucherId;
use crate::kv::{Consumer, Delivery, KvError};
use crate::seckill::metric;
use crate::telemetry::Chain;
use commit::{commit, parse, Books, Parsed};

mod commit;

pub use commit::UNSTORED_REASONS;

/// First pause when the stream had nothing new; doubled while it stays
/// empty, up to `IDLE_MAX`. A purchase accepted in this instance wakes its
/// writer at once; the polls find those accepted by other instances (whose
/// own writers take them first, unless they died).
const POLL: Duration = Duration::from_millis(10);
/// Longest pause of an idle writer: an instance with many idle sales
/// polls each once a second, not a hundred times.
const IDLE_MAX: Duration = Duration::from_secs(1);
/// Pause after a failed commit or Redis call before trying again.
const BACKOFF: Duration = Duration::from_millis(200);
/// How often a writer looks for entries idle with other consumers.
const CLAIM_EVERY: Duration = Duration::from_secs(1);
/// How often a writer removes consumers that hold nothing and have been
/// idle for the claim's time: every instance that ever ran leaves one per
/// voucher, and the group would keep them all.
const PRUNE_EVERY: Duration = Duration::from_secs(10);
/// Least time between two rebuilds of a sale whose books differ from
/// Postgres's, started by one writer.
const REBUILD_EVERY: Duration = Duration::from_secs(5);

/// What to read next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Entries delivered to this consumer and not acknowledged (a commit
    /// that failed): they go first.
    Own,
    /// Entries idle too long with another consumer.
    Claim,
    /// New entries.
    New,
}

/// A writer's memory between rounds.
struct Rounds {
    /// The pause before the next poll of an empty stream.
    idle: Duration,
    /// The consumer group is known to exist.
    group_ready: bool,
    /// This consumer holds entries it failed to write (or, after writing
    /// its own, may hold more): read those first.
    retry_own: bool,
    last_claim: Instant,
    last_prune: Instant,
    /// Entries read at most, next time: halved after a failed commit (a
    /// batch too big to commit within the deadline would otherwise fail
    /// for ever), doubled back after each success, up to `batch_max`.
    batch: usize,
    batch_max: usize,
}

impl Rounds {
    fn new(now: Instant, batch_max: usize) -> Self {
        Self {
            idle: POLL,
            group_ready: false,
            retry_own: false,
            last_claim: now,
            last_prune: now,
            batch: batch_max,
            batch_max,
        }
    }

    /// What to read at `now`: this consumer's own pending entries first,
    /// then, once a `CLAIM_EVERY`, entries idle with others, else new ones.
    fn next_read(&mut self, now: Instant) -> Read {
        if self.retry_own {
            Read::Own
        } else if now.duration_since(self.last_claim) >= CLAIM_EVERY {
            self.last_claim = now;
            Read::Claim
        } else {
            Read::New
        }
    }

    /// Whether idle consumers are due to be pruned at `now` (and, if so,
    /// counts from now).
    fn prune_due(&mut self, now: Instant) -> bool {
        let due = now.duration_since(self.last_prune) >= PRUNE_EVERY;
        if due {
            self.last_prune = now;
        }
        due
    }

    /// After a read of `read` that found nothing.
    fn found_nothing(&mut self) {
        self.retry_own = false;
    }

    /// After a commit of what `read` found: on success, own entries may
    /// remain (a read takes a batch at most); on failure they all remain.
    fn committed(&mut self, read: Read, ok: bool) {
        self.idle = POLL;
        self.retry_own = !ok || read == Read::Own;
        self.batch = if ok {
            (self.batch * 2).min(self.batch_max)
        } else {
            (self.batch / 2).max(1)
        };
    }

    /// An empty stream was polled: the next pause doubles, up to IDLE_MAX
    /// (`woken`: a purchase here, read at once and poll fast again).
    fn polled(&mut self, woken: bool) {
        self.idle = if woken {
            POLL
        } else {
            (self.idle * 2).min(IDLE_MAX)
        };
    }
}

/// Runs `voucher_id`'s writer until it retires (the sale over a day and
/// its stream empty) or, after `stop`, until it finds nothing new to write
/// (what another instance accepted and holds is that one's to write).
pub(super) async fn write(
    sales: AsyncSales,
    voucher_id: VoucherId,
    signals: Arc<WriterSignals>,
    stop: CancellationToken,
) {
    let keys = sales.keys(voucher_id);
    let mut rounds = Rounds::new(Instant::now(), sales.inner.batch_max);
    let mut rebuilt_at: Option<Instant> = None;
    loop {
        if !rounds.group_ready {
            rounds.group_ready = ensure_group(&sales, &keys).await;
            if !rounds.group_ready {
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        }
        if rounds.prune_due(Instant::now()) {
            prune(&sales, &keys).await;
        }
        let read = rounds.next_read(Instant::now());
        let entries = match next_entries(&sales, &keys, read, rounds.batch).await {
            Ok(entries) => entries,
            Err(error) => {
                if error.code() == Some("NOGROUP") {
                    rounds.group_ready = false;
                } else {
                    tracing::warn!(%voucher_id, error = %Chain(&error), "reading an async sale's stream failed");
                }
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        };
        if entries.is_empty() {
            rounds.found_nothing();
            if read == Read::New {
                if stop.is_cancelled() {
                    return;
                }
                // Entries are removed once written: an empty stream holds
                // nothing unwritten (an error counts as not empty).
                if signals.retire.load(Ordering::Relaxed)
                    && matches!(sales.inner.redis.stream_len(&keys.orders).await, Ok(0))
                {
                    tracing::info!(%voucher_id, "the sale is over and written: writer retired");
                    return;
                }
                let woken = tokio::select! {
                    () = signals.wake.notified() => true,
                    () = tokio::time::sleep(rounds.idle) => false,
                    () = stop.cancelled() => true,
                };
                rounds.polled(woken);
            }
            continue;
        }
        // Read and not yet acknowledged by this instance: what its death
        // would leave for the others to claim.
        let held = entries.len() as f64;
        metrics::gauge!(metric::ASYNC_IN_FLIGHT).increment(held);
        let committed = commit(&sales, voucher_id, &keys, entries).await;
        metrics::gauge!(metric::ASYNC_IN_FLIGHT).decrement(held);
        rounds.committed(read, committed.is_ok());
        match committed {
            Ok(Books::Agree) => {}
            Ok(Books::Differ) => {
                // Redis sold what Postgres's books refuse (a Redis that
                // came back from an older copy: AOF everysec, a replica
                // promoted behind): rebuilt from Postgres, at most once per
                // REBUILD_EVERY, or every buyer Redis forgot buys again
                // into orders that are refused and lost.
                if rebuilt_at.is_none_or(|at| at.elapsed() >= REBUILD_EVERY) {
                    rebuilt_at = Some(Instant::now());
                    tracing::warn!(%voucher_id, "Redis's sale differs from Postgres's books: rebuilding it");
                    let sales = sales.clone();
                    sales.inner.background.tasks.clone().spawn(async move {
                        if let Err(error) = sales.reconcile(voucher_id, Pause::Always).await {
                            tracing::warn!(%voucher_id, error = %Chain(&error), "rebuilding a sale whose books differ failed");
                        }
                    });
                }
            }
            Err(error) => {
                tracing::warn!(%voucher_id, %error, "writing accepted orders failed; retrying");
                metrics::counter!(metric::ASYNC_WRITE_FAILURES).increment(1);
                tokio::time::sleep(BACKOFF).await;
            }
        }
    }
}

/// Creates the voucher's consumer group (from the stream's start) unless
/// it exists.
pub(super) async fn ensure_group(sales: &AsyncSales, keys: &SaleKeys) -> bool {
    match sales.inner.redis.create_group(&keys.orders, GROUP).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(error = %Chain(&error), "cannot create an async sale's consumer group");
            false
        }
    }
}

/// Removes the group's consumers other than this one that hold no entry
/// and have been idle for `claim_idle` (dead instances', mostly; a live one
/// removed is made again by its next read). Failures wait for next time.
async fn prune(sales: &AsyncSales, keys: &SaleKeys) {
    let inner = &sales.inner;
    let Ok(consumers) = inner.redis.consumers(&keys.orders, GROUP).await else {
        return;
    };
    for gone in consumers
        .iter()
        .filter(|c| c.name != inner.consumer && c.pending == 0 && c.idle >= inner.claim_idle)
    {
        match inner
            .redis
            .prune_consumer(&keys.orders, GROUP, &gone.name)
            .await
        {
            Ok(true) => tracing::info!(consumer = %gone.name, "removed an idle consumer"),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(error = %Chain(&error), "removing an idle consumer failed");
                return;
            }
        }
    }
}

async fn next_entries(
    sales: &AsyncSales,
    keys: &SaleKeys,
    read: Read,
    count: usize,
) -> Result<Vec<Parsed>, KvError> {
    let inner = &sales.inner;
    let consumer = Consumer {
        stream: &keys.orders,
        group: GROUP,
        name: &inner.consumer,
    };
    let ids: Vec<StreamId> = match read {
        Read::Claim => {
            let claimed = inner
                .redis
                .claim_idle(consumer, inner.claim_idle, count)
                .await?;
            if !claimed.is_empty() {
                tracing::info!(
                    claimed = claimed.len(),
                    "claimed accepted orders left by another writer"
                );
                metrics::counter!(metric::ASYNC_CLAIMED).increment(claimed.len() as u64);
            }
            claimed
        }
        Read::Own => {
            inner
                .redis
                .read_group(consumer, Delivery::Own, count)
                .await?
        }
        Read::New => {
            inner
                .redis
                .read_group(consumer, Delivery::New, count)
                .await?
        }
    };
    Ok(ids.iter().map(parse).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_entries_go_first_then_claims_once_a_second_then_new_ones() {
        let start = Instant::now();
        let mut rounds = Rounds::new(start, 64);
        assert_eq!(rounds.next_read(start), Read::New);
        assert_eq!(rounds.next_read(start + CLAIM_EVERY), Read::Claim);
        assert_eq!(
            rounds.next_read(start + CLAIM_EVERY),
            Read::New,
            "a claim is once a CLAIM_EVERY"
        );
        rounds.committed(Read::New, false);
        assert_eq!(
            rounds.next_read(start),
            Read::Own,
            "a failed batch is retried"
        );
        rounds.committed(Read::Own, true);
        assert_eq!(
            rounds.next_read(start),
            Read::Own,
            "more own entries may wait"
        );
        rounds.found_nothing();
        assert_eq!(rounds.next_read(start), Read::New);
    }

    #[test]
    fn idle_polls_back_off_to_a_second_and_a_wake_up_resets_them() {
        let mut rounds = Rounds::new(Instant::now(), 64);
        for _ in 0..20 {
            rounds.polled(false);
        }
        assert_eq!(rounds.idle, IDLE_MAX);
        rounds.polled(true);
        assert_eq!(rounds.idle, POLL);
        rounds.polled(false);
        assert_eq!(rounds.idle, POLL * 2);
        rounds.committed(Read::New, true);
        assert_eq!(rounds.idle, POLL);
    }

    #[test]
    fn a_failed_commit_halves_the_next_batch_and_successes_restore_it() {
        let mut rounds = Rounds::new(Instant::now(), 1024);
        assert_eq!(rounds.batch, 1024);
        rounds.committed(Read::New, false);
        rounds.committed(Read::Own, false);
        assert_eq!(rounds.batch, 256);
        for _ in 0..20 {
            rounds.committed(Read::Own, false);
        }
        assert_eq!(rounds.batch, 1, "never below one entry");
        rounds.committed(Read::Own, true);
        assert_eq!(rounds.batch, 2);
        for _ in 0..20 {
            rounds.committed(Read::New, true);
        }
        assert_eq!(rounds.batch, 1024, "never above the configured most");
    }

    #[test]
    fn pruning_is_due_once_every_prune_period() {
        let start = Instant::now();
        let mut rounds = Rounds::new(start, 64);
        assert!(!rounds.prune_due(start));
        assert!(rounds.prune_due(start + PRUNE_EVERY));
        assert!(!rounds.prune_due(start + PRUNE_EVERY));
    }
}
