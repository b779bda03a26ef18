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

use deadpool_redis::redis::{self, streams::StreamId};

use super::{AsyncSales, SaleKeys, WriterSignals, GROUP};
use crate::kv::{Consumer, Delivery};
use crate::seckill::batch::{raise_id_counter, sell_batch};
use crate::store::{Sale, SaleRequest};

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

/// An accepted order as the stream holds it.
struct Entry {
    stream_id: String,
    order_id: i64,
    user_id: i64,
    at_ms: i64,
}

/// What to read next.
enum Read {
    /// Entries delivered to this consumer and not acknowledged (a commit
    /// that failed): they go first.
    Own,
    /// Entries idle too long with another consumer.
    Claim,
    /// New entries.
    New,
}

pub(super) async fn write(sales: AsyncSales, voucher_id: i64, signals: Arc<WriterSignals>) {
    let keys = sales.keys(voucher_id);
    let mut idle = POLL;
    let mut group_ready = false;
    let mut retry_own = false;
    let mut last_claim = Instant::now();
    let mut last_prune = Instant::now();
    loop {
        if !group_ready {
            group_ready = ensure_group(&sales, &keys).await;
            if !group_ready {
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = Instant::now();
            prune(&sales, &keys).await;
        }
        let read = if retry_own {
            Read::Own
        } else if last_claim.elapsed() >= CLAIM_EVERY {
            last_claim = Instant::now();
            Read::Claim
        } else {
            Read::New
        };
        let entries = match next_entries(&sales, &keys, &read).await {
            Ok(entries) => entries,
            Err(error) => {
                if error.code() == Some("NOGROUP") {
                    group_ready = false;
                } else {
                    tracing::warn!(voucher_id, %error, "reading an async sale's stream failed");
                }
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        };
        if entries.is_empty() {
            retry_own = false;
            if matches!(read, Read::New) {
                // Entries are deleted once written: an empty stream holds
                // nothing unwritten (an error counts as not empty).
                if signals.retire.load(Ordering::Relaxed)
                    && matches!(sales.inner.redis.stream_len(&keys.orders).await, Ok(0))
                {
                    tracing::info!(voucher_id, "the sale is over and written: writer retired");
                    return;
                }
                tokio::select! {
                    () = signals.wake.notified() => idle = POLL,
                    () = tokio::time::sleep(idle) => idle = (idle * 2).min(IDLE_MAX),
                }
            }
            continue;
        }
        idle = POLL;
        // Read and not yet acknowledged by this instance: what its death
        // would leave for the others to claim.
        let held = entries.len() as f64;
        metrics::gauge!("seckill_async_in_flight").increment(held);
        let committed = commit(&sales, voucher_id, &keys, entries).await;
        metrics::gauge!("seckill_async_in_flight").decrement(held);
        match committed {
            Ok(()) => retry_own = matches!(read, Read::Own),
            Err(error) => {
                tracing::warn!(voucher_id, %error, "writing accepted orders failed; retrying");
                metrics::counter!("seckill_async_write_failures_total").increment(1);
                retry_own = true;
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
            tracing::warn!(%error, "cannot create an async sale's consumer group");
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
                tracing::warn!(%error, "removing an idle consumer failed");
                return;
            }
        }
    }
}

async fn next_entries(
    sales: &AsyncSales,
    keys: &SaleKeys,
    read: &Read,
) -> Result<Vec<Entry>, crate::kv::KvError> {
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
                .claim_idle(consumer, inner.claim_idle, inner.batch_max)
                .await?;
            if !claimed.is_empty() {
                tracing::info!(
                    claimed = claimed.len(),
                    "claimed accepted orders left by another writer"
                );
                metrics::counter!("seckill_async_claimed_total").increment(claimed.len() as u64);
            }
            claimed
        }
        Read::Own => {
            inner
                .redis
                .read_group(consumer, Delivery::Own, inner.batch_max)
                .await?
        }
        Read::New => {
            inner
                .redis
                .read_group(consumer, Delivery::New, inner.batch_max)
                .await?
        }
    };
    Ok(ids.iter().map(parse).collect())
}

/// An entry's fields; a malformed one (never written by our script) gets
/// order id 0 and is reported, not written.
fn parse(id: &StreamId) -> Entry {
    let field = |name: &str| id.get::<i64>(name).unwrap_or(0);
    Entry {
        stream_id: id.id.clone(),
        order_id: field("order"),
        user_id: field("user"),
        at_ms: field("at"),
    }
}

/// Writes `entries` to Postgres, reports the orders it refused, and then
/// acknowledges and deletes them all. An error leaves them pending with
/// this consumer, to be tried again.
async fn commit(
    sales: &AsyncSales,
    voucher_id: i64,
    keys: &SaleKeys,
    entries: Vec<Entry>,
) -> Result<(), String> {
    let inner = &sales.inner;
    let (valid, malformed): (Vec<Entry>, Vec<Entry>) = entries
        .into_iter()
        .partition(|e| e.order_id > 0 && e.user_id > 0);
    let mut refused: Vec<(i64, &'static str)> = Vec::new();
    for entry in &malformed {
        tracing::error!(stream_id = %entry.stream_id, "a malformed entry in an async sale's stream");
    }
    // The statement takes distinct users: a second order of one user (only
    // possible if Redis lost its buyers) goes in a later round, where it
    // meets the first.
    let mut rounds: Vec<Vec<&Entry>> = Vec::new();
    for entry in &valid {
        match rounds
            .iter_mut()
            .find(|round| round.iter().all(|e| e.user_id != entry.user_id))
        {
            Some(round) => round.push(entry),
            None => rounds.push(vec![entry]),
        }
    }
    for round in rounds {
        let requests: Vec<SaleRequest> = round
            .iter()
            .map(|e| SaleRequest {
                order_id: e.order_id,
                user_id: e.user_id,
                fence: None,
                // Created when Redis accepted it: the deadline counts from
                // the same clock as the sale's window.
                at: chrono::DateTime::from_timestamp_millis(e.at_ms)
                    .unwrap_or_else(|| inner.clock.now()),
            })
            .collect();
        metrics::histogram!("seckill_async_batch_size").record(requests.len() as f64);
        let sold = sell_batch(&inner.store, voucher_id, &requests)
            .await
            .map_err(|e| e.to_string())?;
        // Confirmed when committed: measured from the script's clock.
        let now_ms = inner.clock.now().timestamp_millis();
        for (entry, sale) in round.iter().zip(sold.sales) {
            let reason = match sale {
                Sale::Sold => None,
                Sale::Held(id) if id == entry.order_id => None,
                Sale::Held(_) => Some("already_purchased"),
                Sale::SoldOut => Some("sold_out"),
                Sale::IdTaken => Some("id_taken"),
                Sale::Fenced => Some("fenced"),
            };
            match reason {
                None => {
                    metrics::histogram!("seckill_async_confirm_seconds")
                        .record((now_ms - entry.at_ms).max(0) as f64 / 1000.0);
                }
                Some(reason) => refused.push((entry.order_id, reason)),
            }
        }
    }
    // Ids taken already: the day's counter was lost (a Redis or a cluster
    // node that failed over without it); raised so that the next ids are
    // free. The orders accepted under taken ids are reported.
    if let Some((taken, _)) = refused.iter().find(|(_, reason)| *reason == "id_taken") {
        if let Some(day) = crate::id::OrderId::from_stored(*taken).map(|id| id.drawn_at()) {
            if let Err(error) = raise_id_counter(&inner.store, &inner.ids, day, 0).await {
                tracing::warn!(%error, "raising the order-id counter failed");
            }
        }
    }
    for (order_id, reason) in &refused {
        tracing::error!(order_id, reason, "Postgres refused an order Redis accepted");
        metrics::counter!("seckill_async_unstored_total", "reason" => *reason).increment(1);
    }
    if !refused.is_empty() {
        let mut report = redis::cmd("HSET");
        report.arg(&keys.unstored);
        for (order_id, reason) in &refused {
            report.arg(order_id).arg(*reason);
        }
        inner
            .redis
            .query::<()>(&report)
            .await
            .map_err(|e| e.to_string())?;
        for (order_id, _) in &refused {
            let forget = redis::cmd("DEL").arg(sales.pending_key(*order_id)).clone();
            let _ = inner.redis.query::<()>(&forget).await;
        }
    }
    let stream_ids: Vec<&str> = valid
        .iter()
        .chain(&malformed)
        .map(|e| e.stream_id.as_str())
        .collect();
    inner
        .redis
        .ack_and_delete(&keys.orders, GROUP, &stream_ids)
        .await
        .map_err(|e| e.to_string())?;
    metrics::counter!("seckill_async_written_total").increment(valid.len() as u64);
    Ok(())
}
