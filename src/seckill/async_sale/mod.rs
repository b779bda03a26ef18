//! Async (Redis-first) sales: the stock lives in Redis, one Lua script
//! (`lua/async_purchase.lua`, run for the purchases that arrived together:
//! [`accept`]) checks the window, the user's earlier order and the stock,
//! decrements and appends the order to the voucher's stream, and the buyer
//! hears `202 pending` at once; a consumer group in
//! every instance writes the stream to Postgres through group commit's
//! statement ([`writer`]); [`reconcile`] rebuilds Redis's side from
//! Postgres plus the stream's unwritten orders.
//!
//! No per-user lock on this path: the script reads the user's earlier
//! order and records this one in the same atomic step, so two concurrent
//! purchases of one user cannot both pass it; Postgres's unique index is
//! still behind it.

mod accept;
mod lookup;
mod reconcile;
mod writer;

pub use writer::UNSTORED_REASONS;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use redis::{self, Script};
use tokio_util::sync::CancellationToken;

use super::clock::SaleClock;
use super::error::{PurchaseError, Refusal, Result, SeckillError};
use super::workers::{InstanceTasks, Queue, Workers};
use super::SeckillSettings;
use crate::domain::{Order, OrderId, Quantity, UserId, Voucher, VoucherId};
use crate::id::IdGenerator;
use crate::kv::{AsyncSaleKeys as SaleKeys, Keys, Kv};
use crate::seckill::metric;
use crate::store::{StockReturn, Store};
use crate::telemetry::Chain;

use accept::Verdict;
use lookup::PendingLookup;
pub use reconcile::{Pause, Reconciled, Reconciliation};

/// How long the lookups of pending orders by id are kept after the last
/// one of their hour was written: far longer than any writer lag.
const PENDING_TTL_SECS: u64 = 2 * 86_400;
/// The lookups of one hour's orders are spread over this many hashes on a
/// Redis Cluster, so that no one node takes every acceptance's lookup; on
/// a single Redis they are one hash, which a script call writes once for
/// all its purchases.
const PENDING_SHARDS_ON_CLUSTER: i64 = 16;
/// How often each instance looks for async vouchers to write.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// An order Redis accepted, as its stream entry holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Accepted {
    pub(super) order_id: OrderId,
    pub(super) user_id: UserId,
    pub(super) quantity: Quantity,
}

/// The units of an accepted order's stream entry: its `units` field, or
/// one for an entry written before orders had units; `None` when the field
/// is there and not a quantity.
fn entry_units(entry: &redis::streams::StreamId) -> Option<Quantity> {
    match entry.map.get("units") {
        None => Some(Quantity::ONE),
        Some(_) => Quantity::within(entry.get("units")?, Quantity::MAX),
    }
}

/// The consumer group that writes every voucher's stream.
const GROUP: &str = "writers";

/// The async sales of this instance. Cheap to clone.
#[derive(Clone)]
pub(super) struct AsyncSales {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    redis: Kv,
    ids: IdGenerator,
    clock: SaleClock,
    keys: Keys,
    /// This process's consumer name in every group: its pid, so that
    /// `XINFO CONSUMERS` tells an operator which process holds what, and a
    /// random part, unique across hosts and restarts.
    consumer: String,
    purchase: Script,
    give_back: Script,
    /// A pending order's lookup, written by the purchase on a cluster.
    remember: Script,
    batch_max: usize,
    /// How long an entry may stay unacknowledged with another consumer
    /// before this one claims it (that one died or hangs).
    claim_idle: Duration,
    /// The writers this instance runs, by voucher.
    writers: Workers<Arc<WriterSignals>>,
    /// The acceptors this instance runs, by voucher (see [`accept`]).
    acceptors: Workers<Queue<accept::Request>>,
    /// Where reconciliations run: shutdown waits for one under way rather
    /// than leave its sale paused.
    background: InstanceTasks,
}

/// What a writer is told by the rest of its instance.
#[derive(Default)]
struct WriterSignals {
    /// A purchase here appended to the stream: read now.
    wake: tokio::sync::Notify,
    /// The voucher's sale ended over a day ago: stop once the stream is
    /// empty.
    retire: AtomicBool,
}

impl AsyncSales {
    /// Async sales under `settings`' prefix, batch and claim time; their
    /// writers among `background`'s tasks.
    pub(super) fn new(
        store: Store,
        redis: Kv,
        ids: IdGenerator,
        clock: SaleClock,
        settings: &SeckillSettings,
        background: InstanceTasks,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                redis,
                ids,
                clock,
                keys: Keys::new(settings.redis_prefix.clone()),
                consumer: format!(
                    "pid{}-{}",
                    std::process::id(),
                    uuid::Uuid::new_v4().simple()
                ),
                purchase: Script::new(include_str!("../../../lua/async_purchase.lua")),
                give_back: Script::new(include_str!("../../../lua/async_return.lua")),
                remember: Script::new(include_str!("../../../lua/async_lookup.lua")),
                batch_max: settings.async_batch_max.max(1),
                claim_idle: settings.async_claim_idle,
                writers: Workers::new(background.clone()),
                acceptors: Workers::new(background.clone()),
                background,
            }),
        }
    }

    /// The hash of an async sale's stock in Redis (the waiting room reads
    /// it to know the sale sold out).
    pub(super) fn sale_key(&self, voucher_id: VoucherId) -> String {
        self.keys(voucher_id).sale
    }

    fn keys(&self, voucher_id: VoucherId) -> SaleKeys {
        self.inner.keys.async_sale(voucher_id)
    }

    /// The hash that holds the lookup of a pending order, under the order
    /// id: one per hour in which ids were drawn (per shard on a cluster).
    fn pending_key(&self, order_id: OrderId) -> String {
        let shards = if self.inner.redis.is_cluster() {
            PENDING_SHARDS_ON_CLUSTER
        } else {
            1
        };
        self.inner.keys.async_pending(
            order_id.seconds_since_epoch() / 3_600,
            order_id.get() % shards,
        )
    }

    /// Accepts one unit of `voucher` for `user_id` in Redis: once this
    /// returns, the order is in the voucher's stream and will be written.
    pub(super) async fn purchase(
        &self,
        voucher: &Voucher,
        user_id: UserId,
        quantity: Quantity,
    ) -> Result<OrderId, PurchaseError> {
        let inner = &self.inner;
        let order_id = inner.ids.next_id().await?;
        let max_orders = voucher.terms.max_orders_per_user;
        let at_ms = match self
            .accept(voucher.id, max_orders, user_id, order_id, quantity)
            .await?
        {
            Verdict::Accepted { at_ms } => at_ms,
            Verdict::NotStarted => return Err(Refusal::NotStarted.into()),
            Verdict::Ended => return Err(Refusal::Ended.into()),
            Verdict::SoldOut => return Err(Refusal::SoldOut.into()),
            Verdict::Short(stock) => return Err(Refusal::NotEnoughStock { stock }.into()),
            Verdict::Held(order_id) => return Err(Refusal::AlreadyPurchased { order_id }.into()),
            Verdict::TooMany => return Err(Refusal::TooManyOrders(max_orders).into()),
            Verdict::Paused => {
                return Err(SeckillError::redis_unavailable(
                    "the sale is paused until Redis's side of it is reconciled",
                )
                .into())
            }
        };
        if inner.redis.is_cluster() {
            // The script wrote the lookup by id on a single Redis; on a
            // cluster that key lives in another slot. The order is accepted
            // whatever happens here: a lost lookup only means 404 until the
            // writer has stored it.
            let mut remember = inner.remember.prepare_invoke();
            remember
                .key(self.pending_key(order_id))
                .arg(order_id)
                .arg(PendingLookup::new(voucher.id, user_id, at_ms, quantity).encode())
                .arg(PENDING_TTL_SECS);
            if let Err(error) = inner.redis.invoke::<i64>(&remember).await {
                tracing::warn!(%order_id, error = %Chain(&error), "could not record a pending order's lookup");
            }
        }
        metrics::counter!(metric::ASYNC_ACCEPTED).increment(1);
        self.wake_writer(voucher.id);
        Ok(order_id)
    }

    /// The units Redis still sells of `voucher_id`'s sale: Postgres's
    /// stock less the orders accepted and not yet written. `None` while the
    /// sale is not loaded (paused, or lost with Redis).
    pub(super) async fn stock(&self, voucher_id: VoucherId) -> Result<Option<i64>> {
        let keys = self.keys(voucher_id);
        Ok(self
            .inner
            .redis
            .query(redis::cmd("HGET").arg(&keys.sale).arg("stock"))
            .await?)
    }

    /// An order Redis accepted and Postgres does not hold yet.
    pub(super) async fn pending(&self, order_id: OrderId) -> Result<Option<Order>> {
        let value: Option<String> = self
            .inner
            .redis
            .query(
                redis::cmd("HGET")
                    .arg(self.pending_key(order_id))
                    .arg(order_id),
            )
            .await?;
        Ok(value
            .as_deref()
            .and_then(PendingLookup::decode)
            .map(|lookup| lookup.order(order_id)))
    }

    /// The orders Redis accepted for `voucher_id` that its stream still
    /// holds (written ones are deleted from it), in stream order.
    pub(super) async fn accepted(&self, voucher_id: VoucherId) -> Result<Vec<Accepted>> {
        let keys = self.keys(voucher_id);
        let stream: redis::streams::StreamRangeReply = self
            .inner
            .redis
            .query(redis::cmd("XRANGE").arg(&keys.orders).arg("-").arg("+"))
            .await?;
        Ok(stream
            .ids
            .iter()
            .filter_map(|entry| {
                Some(Accepted {
                    order_id: OrderId::from_stored(entry.get("order")?)?,
                    user_id: UserId::new(entry.get("user")?)?,
                    quantity: entry_units(entry)?,
                })
            })
            .collect())
    }

    /// Gives the units of closed orders of `voucher_id` back to Redis's
    /// stock and buyers, exactly once per order (`lua/async_return.lua`);
    /// `false` while the sale is paused (nothing changed: try again after
    /// the reconciliation).
    pub(super) async fn give_back(
        &self,
        voucher_id: VoucherId,
        returns: &[StockReturn],
    ) -> Result<bool> {
        let keys = self.keys(voucher_id);
        let mut give = self.inner.give_back.prepare_invoke();
        give.key(&keys.sale).key(&keys.buyers).key(&keys.returned);
        for r in returns {
            give.arg(r.order_id).arg(r.user_id).arg(r.quantity);
        }
        let given: i64 = self.inner.redis.invoke(&give).await?;
        if given < 0 {
            return Ok(false);
        }
        metrics::counter!(metric::ASYNC_UNITS_RETURNED)
            .increment(u64::try_from(given).unwrap_or(0));
        Ok(true)
    }

    /// Runs for the life of the process: every second, starts a writer for
    /// each async voucher still in sale (or ended within a day) that has
    /// none here, retires those of the vouchers no longer listed, and
    /// rebuilds from Postgres the Redis side of a sale that is missing (just
    /// created; lost by a Redis restarted empty; left paused by a
    /// reconciliation that failed) or behind Postgres's initial stock (a
    /// restock whose rebuild failed): one `HMGET` per sale to see that it
    /// is not, and on every instance at once, one rebuild (the others find
    /// it under way). Stops when `stop` is cancelled.
    pub(super) async fn supervise(self, stop: CancellationToken) {
        loop {
            let since = Utc::now() - TimeDelta::days(1);
            match self.inner.store.async_vouchers(since).await {
                Ok(vouchers) => {
                    for &(voucher_id, initial_stock) in &vouchers {
                        if self.behind(voucher_id, initial_stock).await {
                            self.load(voucher_id, initial_stock).await;
                        }
                        self.ensure_writer(voucher_id);
                    }
                    let listed: Vec<VoucherId> = vouchers.iter().map(|(id, _)| *id).collect();
                    self.retire_writers(&listed);
                }
                Err(error) => {
                    tracing::warn!(error = %Chain(&error), "cannot list the async vouchers")
                }
            }
            tokio::select! {
                () = stop.cancelled() => {
                    // The writers stop too (the same signal), once they
                    // find nothing new to write.
                    self.retire_writers(&[]);
                    return;
                }
                () = tokio::time::sleep(SUPERVISE_EVERY) => {}
            }
        }
    }

    /// Whether the sale's Redis side is missing or was built from an
    /// initial stock below `initial_stock`, at a glance (no lock, no
    /// Postgres; the pause decides again atomically). `false` when Redis
    /// cannot say: the next look asks again.
    async fn behind(&self, voucher_id: VoucherId, initial_stock: i64) -> bool {
        let keys = self.keys(voucher_id);
        let read = redis::cmd("HMGET")
            .arg(&keys.sale)
            .arg("stock")
            .arg("initial")
            .clone();
        match self
            .inner
            .redis
            .query::<(Option<i64>, Option<i64>)>(&read)
            .await
        {
            Ok((None, _)) => true,
            Ok((Some(_), built)) => built.is_some_and(|built| built < initial_stock),
            Err(_) => false,
        }
    }

    /// Rebuilds a sale that is missing or behind (see [`Self::behind`]),
    /// unless another rebuild is under way.
    async fn load(&self, voucher_id: VoucherId, initial_stock: i64) {
        match self
            .reconcile(voucher_id, Pause::IfBehind(initial_stock))
            .await
        {
            Ok(Reconciliation::Done(done)) => {
                tracing::info!(%voucher_id, ?done, "loaded an async sale into Redis");
            }
            // Another one reopens it, or fails and lets the next look load it.
            Ok(Reconciliation::Loaded | Reconciliation::UnderWay | Reconciliation::Superseded) => {}
            Err(error) => {
                tracing::warn!(%voucher_id, error = %Chain(&error), "loading an async sale failed; retrying");
            }
        }
    }

    /// Loads the sale of `voucher_id`, just created, into Redis. A
    /// supervisor that saw the voucher first may be loading it already
    /// (the sale is paused meanwhile): then this waits for that load to
    /// end, at most the Redis deadline, so that the creation is answered
    /// with the sale open. `Ok(false)`: still not loaded (the supervisors
    /// go on trying).
    pub(super) async fn load_new(&self, voucher_id: VoucherId) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + self.inner.redis.timeout();
        loop {
            match self.reconcile(voucher_id, Pause::IfBehind(0)).await? {
                Reconciliation::Done(_) | Reconciliation::Loaded => return Ok(true),
                Reconciliation::UnderWay | Reconciliation::Superseded => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn ensure_writer(&self, voucher_id: VoucherId) {
        self.inner.writers.get_or_start(
            voucher_id,
            |_| true,
            |stop| {
                let signals = Arc::new(WriterSignals::default());
                let task = writer::write(self.clone(), voucher_id, signals.clone(), stop);
                (signals, task)
            },
        );
    }

    /// Tells the writers of vouchers not in `listed` (in id order) to stop
    /// once their stream is empty.
    fn retire_writers(&self, listed: &[VoucherId]) {
        self.inner.writers.retain(|voucher_id, signals| {
            let keep = listed.binary_search(&voucher_id).is_ok();
            if !keep {
                signals.retire.store(true, Ordering::Relaxed);
                signals.wake.notify_one();
            }
            keep
        });
    }

    /// Wakes this instance's writer of `voucher_id`, if it runs one: an
    /// order accepted here is read at once rather than at the next poll.
    fn wake_writer(&self, voucher_id: VoucherId) {
        if let Some(signals) = self.inner.writers.get(voucher_id) {
            signals.wake.notify_one();
        }
    }
}
