//! The lab: thirteen purchase strategies, from the naive one that oversells
//! to the fenced one that holds in every case and the row lock of
//! `SELECT ... FOR UPDATE`, then the Redis-stock designs ([`redis_stock`]),
//! run side by side on the lab's own tables so that each one's failure
//! lands in real rows (LAB.md).
//!
//! Each strategy is a small, honest implementation of one design; the only
//! artificial thing is the [`Stall`] a request may ask for, which pauses it
//! at a fixed point while it holds its lock (the GC pause or slow disk of
//! the stories), so that lease-expiry races happen on demand. Off unless
//! `SECKILL_LAB=1`; the production purchase never comes here.
//!
//! Every strategy that guards the user does the same work under its guard:
//! "already bought?", then the `stock > 0` sale; the strategies differ only
//! in the guard (and `fenced` in the sale's fence). `lock_before_commit`
//! does that work in one transaction and gives its guard back before the
//! commit; `for_update` needs no guard outside the transaction.
//!
//! The lab is its own crate, built on the service's public API: [`mount`]
//! puts its routes ([`routes`]) and tables ([`store`]) on a built
//! [`Application`], and the `seckill-lab` binary is the service's command
//! line with [`LabArgs`] added.

pub mod lifecycle;
mod redis_stock;
pub mod routes;
pub mod store;
mod strategy;

pub use strategy::{Attempt, Stall, StallAt, Strategy};

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_locks::{Acquired, LockClient, LockError};
use seckill::domain::Outcome;
use seckill::kv::Kv;
use seckill::seckill::workers::{InstanceTasks, Workers};
use seckill::seckill::{stock_units, PurchaseError, Refusal, Result, SeckillError};
use seckill::startup::{Application, Mount, StartupError};
use sqlx::PgConnection;
use store::{has_order_on, lock_stock_on, sell_on, Decrement, LabSale, LabStats, LabStore};

/// Longest stall a request may ask for.
pub const MAX_STALL: Duration = Duration::from_secs(60);

/// `lock_before_commit`'s window: how long after giving its lock back its
/// transaction commits. In the course's code it is the way back from the
/// method to the `@Transactional` proxy, then the `COMMIT`'s round trip
/// and flush: well under a millisecond to a few, or as long as a GC pause
/// or a slow disk makes it. The lab holds it open for this long every
/// time, so that the race it allows happens on every run rather than on a
/// lucky one; the interleaving is the same at any length.
pub const COMMIT_WINDOW: Duration = Duration::from_millis(5);

/// The lab's options, beside the service's (`seckill-lab serve --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Serve the lab (LAB.md): `/lab/{strategy}/seckill/{id}` and its
    /// admin routes, which run deliberately flawed strategies on the lab's
    /// own tables. Never on in production.
    #[arg(
        long,
        env = "SECKILL_LAB",
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub lab: bool,

    /// Lease of the lab's locks, in milliseconds: short, so that a stall
    /// past it is quick to show.
    #[arg(
        long = "lab-lease-ms",
        env = "SECKILL_LAB_LEASE_MS",
        default_value_t = 1000,
        value_name = "MS",
        value_parser = clap::value_parser!(u64).range(1..=86_400_000)
    )]
    pub lab_lease_ms: u64,
}

impl seckill::cli::Extension for LabArgs {
    async fn mount(self, app: &Application) -> Result<Option<Mount>, Box<dyn Error>> {
        if !self.lab {
            return Ok(None);
        }
        Ok(Some(
            mount(app, Duration::from_millis(self.lab_lease_ms)).await?,
        ))
    }
}

/// The lab on `app`, its locks' lease `lease`: its tables created now on
/// the service's Postgres, its keys under the service's prefix and `lab:`,
/// its lock client its own.
pub async fn mount(app: &Application, lease: Duration) -> Result<Mount, StartupError> {
    let locks = app.lock_client("lab:")?;
    let store = LabStore::new(app.store().db().clone());
    store.migrate().await?;
    tracing::warn!("the lab is on: /lab/* runs deliberately flawed purchase strategies");
    let lab = Lab::new(
        store,
        app.kv().clone(),
        locks,
        LabSettings {
            redis_prefix: format!("{}lab:", app.redis_prefix()),
            lease,
        },
    );
    Ok(Mount {
        routes: routes::routes(lab.clone()),
        classes: routes::classes(),
        stop: Box::new(move |within| Box::pin(async move { lab.shutdown_locks(within).await })),
    })
}

/// Tuning for the [`Lab`].
#[derive(Debug, Clone)]
pub struct LabSettings {
    /// Prefix of the lab's Redis keys (the service's prefix + `lab:`).
    pub redis_prefix: String,
    /// Lease of every lab lock that has one: short, so that stalls past it
    /// are quick to show.
    pub lease: Duration,
}

/// The lab service. Cheap to clone.
#[derive(Clone)]
pub struct Lab {
    inner: Arc<Inner>,
}

struct Inner {
    store: LabStore,
    redis: Kv,
    /// The service's own lock library, for `reentrant` and `fenced`.
    locks: LockClient,
    /// `process_mutex`'s per-user mutexes (and `lock_before_commit`'s): in
    /// this process only, which is their flaw. Entries idle for ten
    /// minutes go (no hold lasts that long).
    mutexes: moka::sync::Cache<(i64, i64), Arc<tokio::sync::Mutex<()>>>,
    settings: LabSettings,
    /// Ids of this process's `SET NX` lock owners.
    owners: AtomicU64,
    /// Lab vouchers whose stream this process runs a writer for.
    stream_writers: Workers<()>,
    /// The lab's background tasks (its stream writers), stopped and
    /// awaited with its locks at shutdown.
    background: InstanceTasks,
}

/// A lab purchase's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabOrder {
    /// The lab order, in Postgres: its id.
    Stored(i64),
    /// `redis_stream`: accepted into the stream; a writer stores it.
    Pending,
}

impl Lab {
    pub fn new(store: LabStore, redis: Kv, locks: LockClient, settings: LabSettings) -> Self {
        let background = InstanceTasks::default();
        Self {
            inner: Arc::new(Inner {
                store,
                redis,
                locks,
                mutexes: moka::sync::Cache::builder()
                    .time_to_idle(Duration::from_secs(600))
                    .build(),
                settings,
                owners: AtomicU64::new(0),
                stream_writers: Workers::new(background.clone()),
                background,
            }),
        }
    }

    /// Waits (at most `timeout`) for lab lock releases still under way.
    /// Stops the lab's stream writers and releases its locks, within
    /// `timeout`; `false` when something was still under way.
    pub async fn shutdown_locks(&self, timeout: Duration) -> bool {
        let stopped = self.inner.background.stop(timeout).await;
        self.inner.locks.shutdown(timeout).await && stopped
    }

    pub fn lease(&self) -> Duration {
        self.inner.settings.lease
    }

    pub async fn create_voucher(&self, stock: i64) -> Result<i64> {
        let units = stock_units(stock)?;
        let id = self.inner.store.create_voucher(units).await?;
        self.load_redis_stock(id, units).await?;
        Ok(id)
    }

    pub async fn stats(&self, voucher_id: i64) -> Result<LabStats> {
        self.inner
            .store
            .stats(voucher_id)
            .await?
            .ok_or(SeckillError::NotFound("lab voucher"))
    }

    /// Buys one unit of lab voucher `voucher_id` for `user_id` the way
    /// `strategy` does.
    pub async fn purchase(&self, attempt: Attempt) -> Result<LabOrder, PurchaseError> {
        let result = self.try_purchase(attempt).await;
        let outcome = result
            .as_ref()
            .map_or_else(PurchaseError::outcome, |_| Outcome::Ordered)
            .label();
        metrics::counter!(
            "seckill_lab_purchases_total",
            "strategy" => attempt.strategy.name(),
            "outcome" => outcome
        )
        .increment(1);
        result
    }

    async fn try_purchase(&self, attempt: Attempt) -> Result<LabOrder, PurchaseError> {
        let (strategy, _, voucher_id, _) = attempt.parts();
        let result = match strategy {
            Strategy::Naive | Strategy::Version | Strategy::StockGtZero => {
                self.unguarded(attempt).await.map(LabOrder::Stored)
            }
            Strategy::ProcessMutex => self.process_mutex(attempt).await.map(LabOrder::Stored),
            Strategy::LockBeforeCommit => {
                self.lock_before_commit(attempt).await.map(LabOrder::Stored)
            }
            Strategy::ForUpdate => self.for_update(attempt).await.map(LabOrder::Stored),
            Strategy::Setnx | Strategy::SetnxOwner => {
                self.setnx(attempt).await.map(LabOrder::Stored)
            }
            Strategy::Reentrant | Strategy::Fenced => {
                self.reentrant(attempt).await.map(LabOrder::Stored)
            }
            Strategy::RedisDecr | Strategy::RedisLua | Strategy::RedisStream => {
                self.redis_stock_purchase(attempt).await
            }
        };
        // A refused sale on an unknown voucher is "not found", not "sold out".
        match result {
            Err(PurchaseError::Refused(Refusal::SoldOut))
                if self.inner.store.stock(voucher_id).await?.is_none() =>
            {
                Err(SeckillError::NotFound("lab voucher").into())
            }
            other => other,
        }
    }

    /// `naive`, `version`, `stock_gt_zero`: "already bought?" with no guard,
    /// and the sale under the strategy's condition. `naive` and `version`
    /// read the stock first and check it themselves.
    async fn unguarded(&self, attempt: Attempt) -> Result<i64, PurchaseError> {
        let (strategy, user_id, voucher_id, stall) = attempt.parts();
        let store = &self.inner.store;
        let decrement = match strategy {
            Strategy::StockGtZero => Decrement::IfLeft,
            _ => {
                let stock = store
                    .stock(voucher_id)
                    .await?
                    .ok_or(SeckillError::NotFound("lab voucher"))?;
                if stock <= 0 {
                    return Err(Refusal::SoldOut.into());
                }
                if strategy == Strategy::Naive {
                    Decrement::Always
                } else {
                    Decrement::IfUnchanged(stock)
                }
            }
        };
        if store.has_order(user_id, voucher_id).await? {
            return Err(Refusal::AlreadyPurchased { order_id: None }.into());
        }
        pause(stall, StallAt::Sale).await;
        // `version`: a changed stock is refused although units may be left.
        store
            .sell(strategy.name(), user_id, voucher_id, decrement)
            .await?
            .ok_or(PurchaseError::from(Refusal::SoldOut))
    }

    /// What every guarded strategy does while it holds its guard: "already
    /// bought?", then the `stock > 0` sale. With a fencing token, the token
    /// is presented before the check and again by the sale, so that a
    /// holder whose lease ran out can write neither after its successor
    /// entered (the successor's check would have missed that write) nor
    /// after its successor wrote.
    async fn guarded_sale(
        &self,
        attempt: Attempt,
        fence: Option<i64>,
    ) -> Result<i64, PurchaseError> {
        let (strategy, user_id, voucher_id, stall) = attempt.parts();
        let store = &self.inner.store;
        if let Some(token) = fence {
            if !store.claim_fence(user_id, voucher_id, token).await? {
                return Err(Refusal::InProgress.into());
            }
        }
        if store.has_order(user_id, voucher_id).await? {
            return Err(Refusal::AlreadyPurchased { order_id: None }.into());
        }
        pause(stall, StallAt::Sale).await;
        let name = strategy.name();
        match fence {
            None => store
                .sell(name, user_id, voucher_id, Decrement::IfLeft)
                .await?
                .ok_or(PurchaseError::from(Refusal::SoldOut)),
            Some(token) => match store.sell_fenced(name, user_id, voucher_id, token).await? {
                LabSale::Sold(id) => Ok(id),
                LabSale::SoldOut => Err(Refusal::SoldOut.into()),
                LabSale::Fenced => Err(Refusal::InProgress.into()),
            },
        }
    }

    /// The mutex of this user and voucher in this process.
    fn mutex(&self, user_id: i64, voucher_id: i64) -> Arc<tokio::sync::Mutex<()>> {
        self.inner
            .mutexes
            .get_with((voucher_id, user_id), Default::default)
    }

    /// `process_mutex`: a mutex per user and voucher in this process. Sound
    /// on one instance; a second instance has mutexes of its own.
    async fn process_mutex(&self, attempt: Attempt) -> Result<i64, PurchaseError> {
        let (_, user_id, voucher_id, stall) = attempt.parts();
        let mutex = self.mutex(user_id, voucher_id);
        let Ok(held) = mutex.try_lock() else {
            return Err(Refusal::InProgress.into());
        };
        let result = self.guarded_sale(attempt, None).await;
        pause(stall, StallAt::Release).await;
        drop(held);
        result
    }

    /// `lock_before_commit`: the course's own code, where the lock sits
    /// inside the transaction,
    ///
    /// ```text
    /// @Transactional createVoucherOrder(..) {
    ///     synchronized (userId.toString().intern()) { check; decrement; insert }
    /// }   // the proxy commits here, after the lock is given back
    /// ```
    ///
    /// with `process_mutex`'s mutex, waited for as `synchronized` waits.
    /// The transaction begins before the lock, as the proxy's does (so a
    /// holder of the mutex always has its connection, and waiters cannot
    /// starve it of one); the lock is given back, then, [`COMMIT_WINDOW`]
    /// later, the transaction commits. The user's next request, woken by
    /// the unlock, checks in between: READ COMMITTED shows it no order, and
    /// its sale waits only for the stock row's lock, then sells again.
    async fn lock_before_commit(&self, attempt: Attempt) -> Result<i64, PurchaseError> {
        let (_, user_id, voucher_id, stall) = attempt.parts();
        let mutex = self.mutex(user_id, voucher_id);
        let answer = self
            .inner
            .store
            .db()
            .run(move |c, persistent| {
                Box::pin(async move {
                    let mut tx = sqlx::Connection::begin(c).await?;
                    let held = mutex.lock().await;
                    let answer =
                        check_and_sell(&mut tx, persistent, attempt, Decrement::IfLeft).await?;
                    pause(stall, StallAt::Release).await;
                    // `synchronized` ends here: the lock is given back ...
                    drop(held);
                    if answer.is_ok() {
                        // ... and the order is committed only now.
                        tokio::time::sleep(COMMIT_WINDOW).await;
                    }
                    settle(tx, answer).await
                })
            })
            .await?;
        answer
    }

    /// `for_update`: one transaction, and no lock but the voucher's row:
    /// `SELECT stock ... FOR UPDATE` locks it, then the stock and "already
    /// bought?" are checked, the stock decremented and the order inserted,
    /// and the commit lets the next buyer of the voucher in. Under READ
    /// COMMITTED each statement after the lock sees every order committed
    /// before it, and every earlier buyer of the voucher has committed or
    /// rolled back by then: correct on any number of instances, and every
    /// purchase of the voucher waits in one line, its round trips and its
    /// commit included.
    async fn for_update(&self, attempt: Attempt) -> Result<i64, PurchaseError> {
        let (_, _, voucher_id, stall) = attempt.parts();
        let answer = self
            .inner
            .store
            .db()
            .run(move |c, persistent| {
                Box::pin(async move {
                    let mut tx = sqlx::Connection::begin(c).await?;
                    let answer = match lock_stock_on(&mut tx, persistent, voucher_id).await? {
                        None => Err(SeckillError::NotFound("lab voucher").into()),
                        Some(stock) if stock <= 0 => Err(Refusal::SoldOut.into()),
                        // The row is ours and its stock positive: a plain
                        // decrement.
                        Some(_) => {
                            check_and_sell(&mut tx, persistent, attempt, Decrement::Always).await?
                        }
                    };
                    if answer.is_ok() {
                        pause(stall, StallAt::Release).await;
                    }
                    settle(tx, answer).await
                })
            })
            .await?;
        answer
    }

    /// `setnx` and `setnx_owner`: `SET key owner NX PX lease`, and a release
    /// by a plain delete (`setnx`) or by a delete after a `GET` that found
    /// our own value (`setnx_owner`). The delete is `GETDEL`, which deletes
    /// exactly as `DEL` does and also says whose lock it was, so the lab
    /// can count releases that freed another request's lock.
    async fn setnx(&self, attempt: Attempt) -> Result<i64, PurchaseError> {
        let (strategy, user_id, voucher_id, stall) = attempt.parts();
        let inner = &self.inner;
        let key = format!(
            "{}setnx:{voucher_id}:{user_id}",
            inner.settings.redis_prefix
        );
        let owner = format!(
            "{}:{}",
            inner.locks.process_id(),
            inner.owners.fetch_add(1, Ordering::Relaxed)
        );
        let lease_ms = u64::try_from(inner.settings.lease.as_millis()).unwrap_or(u64::MAX);
        // A pooled connection is not held across the sale (and its stall).
        let taken: Option<String> = inner
            .redis
            .query(
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(lease_ms),
            )
            .await?;
        if taken.is_none() {
            return Err(Refusal::InProgress.into());
        }
        let result = self.guarded_sale(attempt, None).await;

        if let Err(error) = self
            .setnx_release(strategy, &key, &owner, voucher_id, stall)
            .await
        {
            tracing::warn!(strategy = strategy.name(), %error, "releasing the lab lock failed");
        }
        result
    }

    async fn setnx_release(
        &self,
        strategy: Strategy,
        key: &str,
        owner: &str,
        voucher_id: i64,
        stall: Option<Stall>,
    ) -> Result<()> {
        // A connection per command: none is held through the stall.
        let redis = &self.inner.redis;
        if strategy == Strategy::SetnxOwner {
            let holder: Option<String> = redis.query(redis::cmd("GET").arg(key)).await?;
            if holder.as_deref() != Some(owner) {
                return Ok(());
            }
        }
        // `setnx_owner`: between its GET and this delete the lease may run
        // out and another request take the lock.
        pause(stall, StallAt::Release).await;
        let deleted: Option<String> = redis.query(redis::cmd("GETDEL").arg(key)).await?;
        if deleted.is_some_and(|d| d != owner) {
            tracing::warn!(
                strategy = strategy.name(),
                voucher_id,
                "released another request's lock"
            );
            self.inner.store.count_foreign_release(voucher_id).await?;
        }
        Ok(())
    }

    /// `reentrant` and `fenced`: the service's own lock (a hash of owner ->
    /// holds, released by a Lua script that only the owner can run); `fenced`
    /// also hands the lock's fencing token to the sale.
    async fn reentrant(&self, attempt: Attempt) -> Result<i64, PurchaseError> {
        let (strategy, user_id, voucher_id, stall) = attempt.parts();
        let inner = &self.inner;
        let lock = inner.locks.lock(&format!("order:{voucher_id}:{user_id}"));
        let owner = inner
            .locks
            .owner(inner.owners.fetch_add(1, Ordering::Relaxed));
        let guard = match lock.try_acquire(&owner, inner.settings.lease).await? {
            Acquired::Yes(guard) => guard,
            Acquired::HeldByOther { .. } => return Err(Refusal::InProgress.into()),
        };
        let fence = (strategy == Strategy::Fenced).then(|| guard.fence());
        let result = self.guarded_sale(attempt, fence).await;
        pause(stall, StallAt::Release).await;
        match guard.unlock().await {
            Ok(_) => {}
            // The lease ran out: the script saw another owner (or none) and
            // changed nothing. That is this design working.
            Err(LockError::NotHeld { .. }) => {
                tracing::info!(
                    strategy = strategy.name(),
                    user_id,
                    voucher_id,
                    "lock lost before release; nothing deleted"
                );
            }
            // The sale's answer stands either way; the lease frees the lock.
            Err(error) => {
                tracing::warn!(strategy = strategy.name(), %error, "releasing the lab lock failed");
            }
        }
        result
    }
}

/// Ends a purchase's transaction: committed when it sold, rolled back
/// when it was refused; the purchase's answer.
async fn settle(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    answer: Result<i64, PurchaseError>,
) -> sqlx::Result<Result<i64, PurchaseError>> {
    if answer.is_ok() {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(answer)
}

/// The steps `lock_before_commit` and `for_update` share once their lock
/// is held, on their transaction `c`: "already bought?", the
/// [`StallAt::Sale`] stall, then the decrement as `decrement` says and the
/// order's insert. The outer error is the database's; the inner answer is
/// the order's id, `AlreadyPurchased` or `SoldOut`.
async fn check_and_sell(
    c: &mut PgConnection,
    persistent: bool,
    attempt: Attempt,
    decrement: Decrement,
) -> std::result::Result<Result<i64, PurchaseError>, sqlx::Error> {
    let (strategy, user_id, voucher_id, stall) = attempt.parts();
    let strategy = strategy.name();
    if has_order_on(c, persistent, user_id, voucher_id).await? {
        return Ok(Err(Refusal::AlreadyPurchased { order_id: None }.into()));
    }
    pause(stall, StallAt::Sale).await;
    Ok(
        sell_on(c, persistent, strategy, user_id, voucher_id, decrement)
            .await?
            .ok_or(PurchaseError::from(Refusal::SoldOut)),
    )
}

/// Sleeps for the stall if it is asked for at this point.
async fn pause(stall: Option<Stall>, here: StallAt) {
    if let Some(stall) = stall.filter(|s| s.at == here) {
        tokio::time::sleep(stall.duration).await;
    }
}
