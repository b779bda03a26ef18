//! The flash sale itself: who may buy what and when, in the order that
//! keeps stock and orders right. Knows nothing of HTTP.
//!
//! A purchase runs: one in flight per user and voucher ([`inflight`]) →
//! voucher (short-lived cache) → an admitted ticket where the voucher has a
//! waiting room ([`room`]) → time window (by Redis's clock) → sold-out flag
//! in Redis → the gate (no more units asked for at once
//! than are left) → the user's reentrant lock → the voucher's next batch,
//! where one statement checks "already bought?", decrements `stock > 0` by
//! what it can grant and inserts the orders, under ids drawn for the whole
//! batch → release. Each step is cheaper than the
//! next, so the crowd that cannot buy is turned away before it reaches the
//! voucher's row lock, and those who reach it share one commit.
//!
//! Stages in their own files: [`clock`] (the shared clock of the window),
//! [`soldout`] (the flags), [`gate`] (a crowd waits for the units'
//! outcome before it takes locks), [`user_lock`] (the per-user lock),
//! [`batch`] (group commit), [`error`]; [`draft`] parses a voucher to
//! create, [`reads`] answers what is asked without selling. A voucher created with `sale_mode: async`
//! is sold by [`async_sale`] instead: stock in Redis, orders through a
//! stream that a consumer group writes with group commit's statement.
//! After the grab, [`lifecycle`]: pay, cancel, expire, and the unit back
//! on sale once. [`workers`]: the one registry of per-voucher background
//! workers, all of them stopped and awaited at shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod async_sale;
mod batch;
mod clock;
mod draft;
mod error;
mod gate;
mod holders;
mod inflight;
mod lifecycle;
pub mod metric;
mod reads;
mod room;
mod soldout;
mod user_lock;
mod vouchers;
pub mod workers;

pub use async_sale::Reconciled;
use async_sale::{Pause, Reconciliation};
pub use clock::SaleClock;
pub use draft::{stock_units, VoucherDraft, WaitingRoom, MAX_PRICE_CENTS};
pub use error::{OrderError, OrderRefusal, PurchaseError, Refusal, Result, SeckillError};
pub use lifecycle::PaymentAnswer;
pub use reads::{PoolUsage, Stats};
use room::Rooms;
pub use room::{
    challenge, proof_holds, ticket_key, QueueState, QueueStatus, RoomCounter, TicketKey,
    ADMISSION_WINDOW,
};
use user_lock::LockBatcher;
pub use user_lock::{lock_of, LockBackend, UserGuard};

use crate::domain::{OrderId, Outcome, Quantity, SaleMode, UserId, Voucher, VoucherId};
use crate::id::IdGenerator;
use crate::kv::Kv;
use crate::store::Store;
use crate::telemetry::Chain;
use async_sale::AsyncSales;
use batch::{Batcher, Outcome as Batched};
use gate::{Admission, Gates};
use holders::Holders;
use inflight::InFlight;
use soldout::SoldOutFlags;
use vouchers::Caches;
use workers::InstanceTasks;

pub use crate::domain::Payment;

/// The units a purchase asks for: `asked`, or one when it says nothing;
/// refused when outside 1 to `allowed` (`bound` names where that comes
/// from, for the message).
fn units_asked(asked: Option<i64>, allowed: i32, bound: &str) -> Result<Quantity> {
    match asked {
        None => Ok(Quantity::ONE),
        Some(units) => Quantity::within(units, allowed).ok_or_else(|| {
            SeckillError::Invalid(format!(
                "quantity must be 1 to {allowed}{bound}, not {units}"
            ))
        }),
    }
}

/// How old the stock `GET /vouchers/{id}` shows may be, at most.
pub const STOCK_REFRESH: Duration = Duration::from_millis(100);
/// How old the list of vouchers on offer (`GET /vouchers`) may be, at most.
pub const LIST_REFRESH: Duration = Duration::from_millis(500);
/// Most vouchers that list holds (a list anyone may ask for stays small):
/// past it, the sales that began last, then the first to start.
pub const LISTED_VOUCHERS: i64 = 200;
/// Readiness is probed at most this often; callers in between share it.
pub const READY_EVERY: Duration = Duration::from_millis(500);
/// The payment window when none is given: 15 minutes.
pub const DEFAULT_PAY_WITHIN_SECONDS: i64 = 900;
/// Most orders one user may have of a voucher when none is given: room to
/// cancel twice, not to hold a unit away from the crowd for ever.
pub const DEFAULT_MAX_ORDERS_PER_USER: i64 = 3;
/// Most units one order may take when none is given: one per customer.
pub const DEFAULT_MAX_UNITS_PER_USER: i64 = 1;

/// Tuning for [`Seckill`].
#[derive(Debug, Clone)]
pub struct SeckillSettings {
    /// Prefix of every Redis key this service writes: the configured
    /// prefix, then the database's namespace (see `startup`).
    pub redis_prefix: String,
    /// Lease of the per-user purchase lock: the longest a crashed instance
    /// can keep a user waiting. Far longer than a purchase takes.
    pub lock_lease: Duration,
    /// How long a voucher's time window may be served from memory: also
    /// how late a restock made elsewhere reaches this instance.
    pub voucher_cache_ttl: Duration,
    /// Most purchases of one voucher committed together (1: one order per
    /// transaction).
    pub sale_batch_max: usize,
    /// Most stream entries an async writer takes and commits together.
    pub async_batch_max: usize,
    /// How long an async sale's entry may stay unacknowledged with one
    /// writer before another claims it.
    pub async_claim_idle: Duration,
    /// Longest a purchase waits at the gate for the purchases ahead of it
    /// (see `gate`); then it goes on to its lock as if there were none.
    pub gate_wait: Duration,
    /// The key that signs waiting-room tickets.
    pub ticket_key: TicketKey,
    /// Longest a purchase may take, whatever it waits for: a request meets
    /// one dependency deadline at most, not one per step.
    pub request_deadline: Duration,
}

/// A purchase that went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purchase {
    /// The order is committed (`unpaid`).
    Stored(OrderId),
    /// Redis accepted the order; the writers will commit it.
    Pending(OrderId),
}

/// The flash-sale service. Cheap to clone.
#[derive(Clone)]
pub struct Seckill {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    redis: Kv,
    locks: LockBackend,
    /// Takes the locks of a voucher's purchases that arrive together.
    lockers: Arc<LockBatcher>,
    batcher: Batcher,
    async_sales: AsyncSales,
    clock: SaleClock,
    /// The vouchers as last read.
    vouchers: Caches,
    /// The last readiness probe and when it began: a flood of `/readyz`
    /// is answered from it, one probe at a time at most.
    readiness: tokio::sync::Mutex<Option<(Instant, Result<()>)>>,
    /// Purchases under way here, by user and voucher.
    in_flight: InFlight,
    /// The live orders known here, by voucher and user: a buyer who holds
    /// one is refused before any other check.
    holders: Arc<Holders>,
    /// The vouchers' waiting rooms.
    rooms: Rooms,
    flags: Arc<SoldOutFlags>,
    gates: Arc<Gates>,
    settings: SeckillSettings,
    /// Per-purchase lock owner ids, unique within this process.
    purchases: AtomicU64,
    /// An async sale's unit came back here: the relay gives it to Redis.
    returns_queued: tokio::sync::Notify,
    /// `seckill_purchases_total`, by outcome, registered when the workers
    /// start (the recorder is installed by then): a crowd's request then
    /// counts without building and looking up a labelled key.
    outcomes: std::sync::OnceLock<Vec<metrics::Counter>>,
    /// Every background task of this instance (expiry, relay, the async
    /// writers' supervisor, the per-voucher writers), and what stops them:
    /// shutdown waits for them.
    background: InstanceTasks,
}

impl Seckill {
    /// `redis` serves ids, the sold-out flags and the clock; `locks` the
    /// users' locks.
    pub fn new(
        store: Store,
        redis: Kv,
        locks: LockBackend,
        clock: SaleClock,
        settings: SeckillSettings,
    ) -> Self {
        let flags = Arc::new(SoldOutFlags::new(
            redis.clone(),
            settings.redis_prefix.clone(),
        ));
        let ids = IdGenerator::new(redis.clone(), settings.redis_prefix.clone());
        let background = InstanceTasks::default();
        let gates = Arc::new(Gates::new(settings.gate_wait));
        let batcher = Batcher::new(
            batch::Deps {
                store: store.clone(),
                ids: ids.clone(),
                flags: flags.clone(),
                gates: gates.clone(),
                locks: locks.clone(),
                clock: clock.clone(),
            },
            settings.sale_batch_max,
            background.clone(),
        );
        let async_sales = AsyncSales::new(
            store.clone(),
            redis.clone(),
            ids,
            clock.clone(),
            &settings,
            background.clone(),
        );
        let lockers = LockBatcher::new(locks.clone(), settings.lock_lease, background.clone());
        let rooms = Rooms::new(
            redis.clone(),
            settings.redis_prefix.clone(),
            &settings.ticket_key,
        );
        Self {
            inner: Arc::new(Inner {
                locks,
                lockers,
                batcher,
                async_sales,
                flags,
                gates,
                store,
                redis,
                clock,
                vouchers: Caches::new(settings.voucher_cache_ttl),
                readiness: tokio::sync::Mutex::new(None),
                in_flight: InFlight::default(),
                holders: Arc::new(Holders::new()),
                rooms,
                settings,
                purchases: AtomicU64::new(0),
                returns_queued: tokio::sync::Notify::new(),
                outcomes: std::sync::OnceLock::new(),
                background,
            }),
        }
    }

    /// Starts the background workers: the async sales' writers (and their
    /// loading at start), the expiry of unpaid orders and the relay of
    /// async returns. They run until [`Seckill::stop_workers`].
    pub fn start_workers(&self) {
        // Every outcome's series on the page from start-up.
        self.outcome_counters();
        let background = &self.inner.background;
        background.tasks.spawn(
            self.inner
                .async_sales
                .clone()
                .supervise(background.stop.clone()),
        );
        self.start_lifecycle(background);
        background.tasks.spawn(holders::follow(
            self.inner.store.clone(),
            self.inner.holders.clone(),
            background.stop.clone(),
        ));
    }

    /// Stops every background worker and waits for them, at most `limit`:
    /// a round under way finishes its statement (nothing is left half-done
    /// in Postgres), a batch writer answers what is queued, a stream
    /// writer writes what is new. `false` when some were still running.
    pub async fn stop_workers(&self, limit: Duration) -> bool {
        self.inner.background.stop(limit).await
    }

    /// Runs the tasks `make` builds (given the stop signal) among this
    /// instance's background tasks: told to stop at shutdown, and waited
    /// for.
    pub fn spawn_background(
        &self,
        make: impl FnOnce(
            &tokio_util::sync::CancellationToken,
        ) -> Vec<futures_util::future::BoxFuture<'static, ()>>,
    ) {
        let background = &self.inner.background;
        for task in make(&background.stop) {
            background.tasks.spawn(task);
        }
    }

    /// Background tasks of this instance still running.
    pub fn workers_running(&self) -> usize {
        self.inner.background.tasks.len()
    }

    /// The clock that judges every sale's window.
    pub fn clock(&self) -> &SaleClock {
        &self.inner.clock
    }

    /// Waits (at most `timeout`) for lock releases still under way.
    pub async fn shutdown_locks(&self, timeout: Duration) -> bool {
        self.inner.locks.shutdown(timeout).await
    }

    /// Buys `quantity` units (none given: one) of `voucher` for `user`,
    /// all or none; a voucher with a waiting room needs `ticket`, admitted.
    /// A quantity outside 1 to the voucher's `max_units_per_user` is
    /// refused as invalid.
    pub async fn purchase(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        quantity: Option<i64>,
        ticket: Option<&str>,
    ) -> Result<Purchase, PurchaseError> {
        // A quantity no voucher allows is bad input whoever asks; one this
        // voucher does not allow is known once the voucher is read, and is
        // bad input too, before the buyer's order or a purchase under way
        // is looked at: its answer must not hang on which instance is
        // asked. One unit is within every voucher's limit, so the usual
        // purchase (and a holder's repeat) reads no voucher for it.
        units_asked(quantity, Quantity::MAX, "")?;
        let limit = " (this voucher's max_units_per_user)";
        let several = quantity.is_some_and(|units| units > 1);
        let holders = &self.inner.holders;
        let purchase = async {
            let read = match several {
                true => Some(self.selling(voucher_id).await?),
                false => None,
            };
            if let Some(voucher) = &read {
                units_asked(quantity, voucher.terms.max_units_per_user, limit)?;
            }
            // A buyer known to hold an order is refused before any other
            // work.
            if let Some(order_id) = holders.holder(voucher_id, user_id) {
                return Err(Refusal::AlreadyPurchased {
                    order_id: Some(order_id),
                }
                .into());
            }
            // Held until this purchase ends: the user's duplicates are
            // refused here, before any Redis or Postgres work.
            let Some(_mark) = self.inner.in_flight.enter(user_id, voucher_id) else {
                return Err(Refusal::InProgress.into());
            };
            let voucher = match read {
                Some(voucher) => voucher,
                None => self.selling(voucher_id).await?,
            };
            let quantity = units_asked(quantity, voucher.terms.max_units_per_user, limit)?;
            let roomed = voucher.terms.admit_per_second.is_some();
            if roomed {
                let now = self.inner.clock.now();
                self.inner
                    .rooms
                    .check_admitted(voucher_id, user_id, ticket, now)?;
            }
            let bought = match voucher.terms.sale_mode {
                SaleMode::Sync => self
                    .try_purchase(user_id, voucher, quantity)
                    .await
                    .map(Purchase::Stored),
                SaleMode::Async => self
                    .inner
                    .async_sales
                    .purchase(&voucher, user_id, quantity)
                    .await
                    .map(Purchase::Pending),
            };
            if bought.is_ok() {
                let units = u64::try_from(quantity.get()).unwrap_or(0);
                metrics::counter!(metric::UNITS_SOLD).increment(units);
                if roomed {
                    metrics::counter!(metric::QUEUE_ADMISSIONS_USED).increment(1);
                }
            }
            bought
        };
        // Past the deadline the purchase is dropped, which is safe at any
        // step (a batch it joined still commits and releases), and its
        // outcome is unknown to the buyer: 503, whose retry finds the
        // order if there is one.
        let result = tokio::time::timeout(self.inner.settings.request_deadline, purchase)
            .await
            .unwrap_or_else(|_| {
                Err(SeckillError::unavailable(
                    "Postgres or Redis",
                    format!(
                        "the purchase did not finish within {:?}",
                        self.inner.settings.request_deadline
                    ),
                )
                .into())
            });
        let outcome = match &result {
            Ok(Purchase::Stored(_)) => Outcome::Ordered,
            Ok(Purchase::Pending(_)) => Outcome::Accepted,
            Err(error) => error.outcome(),
        };
        // A stored order only: an async sale's pending order is learned
        // from the order events once stored (one that is never stored,
        // after Redis lost it, must not keep its buyer out).
        if let Ok(Purchase::Stored(order_id)) = &result {
            holders.hold(voucher_id, user_id, *order_id);
        }
        self.outcome_counters()[outcome.index()].increment(1);
        result
    }

    /// `seckill_purchases_total`, by outcome (in [`Outcome::ALL`]'s
    /// order), each at 0 once registered.
    fn outcome_counters(&self) -> &[metrics::Counter] {
        self.inner.outcomes.get_or_init(|| {
            Outcome::ALL
                .iter()
                .map(|outcome| {
                    let counter =
                        metrics::counter!(metric::PURCHASES, "outcome" => outcome.label());
                    counter.increment(0);
                    counter
                })
                .collect()
        })
    }

    async fn try_purchase(
        &self,
        user_id: UserId,
        voucher: Arc<Voucher>,
        quantity: Quantity,
    ) -> Result<OrderId, PurchaseError> {
        let now = self.inner.clock.now();
        if now < voucher.terms.begin_time {
            return Err(Refusal::NotStarted.into());
        }
        if now >= voucher.terms.end_time {
            return Err(Refusal::Ended.into());
        }
        if self.inner.flags.is_sold_out(&voucher).await? {
            return Err(Refusal::SoldOut.into());
        }
        let inner = &self.inner;
        let place = match inner.gates.admit(&voucher, quantity).await {
            Admission::Go(place) => place,
            Admission::SoldOut => return Err(Refusal::SoldOut.into()),
        };

        let purchase = inner.purchases.fetch_add(1, Ordering::Relaxed);
        let acquired = inner
            .lockers
            .try_lock(voucher.id, user_id, purchase)
            .await?;
        let Some(guard) = acquired else {
            metrics::counter!(metric::LOCK_CONTENDED).increment(1);
            return Err(Refusal::InProgress.into());
        };

        self.buy_locked(user_id, voucher, quantity, guard, place)
            .await
    }

    /// The part of a purchase that runs under the user's lock: a place in
    /// the voucher's next batch, which keeps its `place` at the gate and
    /// its `guard` until it answers, and gives the lock back (with the
    /// rest of the batch's, in one call) just before. If this future is
    /// dropped instead (client gone), the batch still answers and releases;
    /// a guard dropped before it reached a batch releases on its drop.
    async fn buy_locked(
        &self,
        user_id: UserId,
        voucher: Arc<Voucher>,
        quantity: Quantity,
        guard: UserGuard,
        place: gate::Place,
    ) -> Result<OrderId, PurchaseError> {
        let voucher_id = voucher.id;
        let max_orders = voucher.terms.max_orders_per_user;
        let fence = guard.fence();
        let refusal = match self
            .inner
            .batcher
            .sell(voucher, user_id, quantity, guard, place)
            .await?
        {
            Batched::Sold(order_id) => return Ok(order_id),
            Batched::SoldOut => Refusal::SoldOut,
            Batched::Short(stock) => Refusal::NotEnoughStock { stock },
            Batched::Held(order_id) => {
                if let Some(order_id) = order_id {
                    self.inner.holders.hold(voucher_id, user_id, order_id);
                }
                Refusal::AlreadyPurchased { order_id }
            }
            Batched::TooMany => Refusal::TooManyOrders(max_orders),
            Batched::Fenced => {
                // Our lock's lease ran out and a newer holder has written:
                // that request is the user's purchase in progress.
                tracing::warn!(
                    %user_id,
                    %voucher_id,
                    fence = ?fence,
                    "purchase refused: a newer lock holder wrote first"
                );
                Refusal::InProgress
            }
        };
        Err(refusal.into())
    }

    pub async fn create_voucher(&self, draft: VoucherDraft) -> Result<VoucherId> {
        let new = draft.parse()?;
        let sale_mode = new.terms.sale_mode;
        let id = self.inner.store.create_voucher(&new).await?;
        // Someone may have asked for the next id before it existed.
        self.made(id);
        if sale_mode == SaleMode::Async {
            // Loaded before the creation is answered, so that a purchase
            // right after it finds the sale; if Redis cannot take it now,
            // every instance's writer supervisor loads it, retrying until
            // it sees it loaded.
            match self.inner.async_sales.load_new(id).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    voucher_id = %id,
                    "a new async sale is still being loaded into Redis elsewhere; its purchases answer 503 until it is"
                ),
                Err(error) => {
                    tracing::warn!(voucher_id = %id, error = %Chain(&error), "loading a new async sale into Redis failed")
                }
            }
        }
        Ok(id)
    }

    /// Rebuilds Redis's side of an async sale from Postgres and the
    /// stream's unwritten orders (see `async_sale::reconcile`).
    pub async fn reconcile(&self, voucher_id: VoucherId) -> Result<Reconciled> {
        match self
            .inner
            .async_sales
            .reconcile(voucher_id, Pause::Always)
            .await?
        {
            Reconciliation::Done(done) => Ok(done),
            // Its report is the later one's to give.
            Reconciliation::Superseded | Reconciliation::Loaded | Reconciliation::UnderWay => {
                Err(SeckillError::redis_unavailable(
                    "another reconciliation of this voucher took over; ask again for its result",
                ))
            }
        }
    }

    /// Adds `units` to a voucher's stock. The sale reopens on every
    /// instance without a word to Redis: the restock raises the voucher's
    /// epoch, and a sold-out flag of an older epoch is ignored (see
    /// [`soldout`]); here at once, elsewhere within the voucher cache's
    /// lifetime.
    pub async fn restock(&self, voucher_id: VoucherId, units: i64) -> Result<Voucher> {
        let units = i32::try_from(units)
            .ok()
            .filter(|u| *u > 0)
            .ok_or_else(|| {
                SeckillError::Invalid(format!("add must be between 1 and {}", i32::MAX))
            })?;
        let restocked = self.inner.store.restock(voucher_id, units).await?;
        let voucher = restocked.ok_or(SeckillError::NotFound("voucher"))?;
        let cached = &self.inner.vouchers;
        cached.windows.invalidate(&voucher_id).await;
        cached.stock_seen.invalidate(&voucher_id).await;
        if voucher.terms.sale_mode == SaleMode::Async {
            // Redis sells from its own stock: rebuilt from Postgres's (by
            // this reconciliation, or by a later one that took over). The
            // restock is committed: should the rebuild fail, it is still
            // answered 200 (an error would be retried, and add the units
            // twice), and every instance's supervisor rebuilds the sale,
            // which is missing or behind Postgres's initial stock, within
            // a second of Redis answering.
            if let Err(error) = self
                .inner
                .async_sales
                .reconcile(voucher_id, Pause::Always)
                .await
            {
                tracing::warn!(%voucher_id, error = %crate::telemetry::Chain(&error),
                    "restocked; the sale's rebuild in Redis failed and is left to the supervisors");
            }
        }
        Ok(voucher)
    }
}
