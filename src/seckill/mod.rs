//! The flash sale itself: who may buy what and when, in the order that
//! keeps stock and orders right. Knows nothing of HTTP.
//!
//! A purchase runs: voucher (short-lived cache) → time window → sold-out
//! flag in Redis → the user's reentrant lock → "already bought?" → order id
//! → one statement that decrements `stock > 0` and inserts the order →
//! release. Each step is cheaper than the next, so the crowd that cannot
//! buy is turned away before it reaches the voucher's row lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_redis::redis::{self, Script};
use deadpool_redis::{Pool, PoolError};

mod user_lock;

pub use user_lock::{UserGuard, UserLocks};

use crate::id::{IdError, IdGenerator, OrderId};
use crate::lock::LockError;
use crate::store::{self, NewVoucher, Sale, StockLevel, Store, StoreError};

pub use crate::store::{Order, Stats, Voucher};

/// Longest life of a sold-out flag whose sale ends later than that; after
/// it a single purchase attempt reads Postgres and sets the flag again.
const MAX_SOLDOUT_FLAG: Duration = Duration::from_secs(86_400);
const TITLE_MAX_CHARS: usize = 200;
/// How long this instance trusts a "sold out" it read from Redis. A flood
/// on a sold-out voucher then costs Redis one read per voucher per period
/// instead of one per request; a restock elsewhere reaches this instance
/// at most this late (a restock here clears it at once).
const SOLDOUT_LOCAL_TTL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum SeckillError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("the sale has not started yet")]
    NotStarted,
    #[error("the sale is over")]
    Ended,
    #[error("no stock left")]
    SoldOut,
    #[error("this user already holds an order for this voucher")]
    AlreadyPurchased,
    #[error("another purchase of this user is in progress")]
    InProgress,
    #[error("{dependency} is unavailable: {detail}")]
    Unavailable {
        dependency: &'static str,
        detail: String,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

impl SeckillError {
    /// The purchase outcome this error stands for, as metrics label it.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::NotStarted => "not_started",
            Self::Ended => "ended",
            Self::SoldOut => "sold_out",
            Self::AlreadyPurchased => "already_purchased",
            Self::InProgress => "purchase_in_progress",
            Self::Unavailable { .. } => "unavailable",
            Self::Invalid(_) | Self::Internal(_) => "error",
        }
    }
}

pub type Result<T, E = SeckillError> = std::result::Result<T, E>;

/// A voucher's stock as asked for, in the range its column holds.
pub fn stock_units(stock: i64) -> Result<i32> {
    i32::try_from(stock)
        .ok()
        .filter(|s| *s >= 0)
        .ok_or_else(|| SeckillError::Invalid(format!("stock must be between 0 and {}", i32::MAX)))
}

impl From<StoreError> for SeckillError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(e) => Self::Unavailable {
                dependency: "Postgres",
                detail: e.to_string(),
            },
            StoreError::DuplicateOrder => Self::AlreadyPurchased,
            e @ StoreError::DuplicateOrderId => Self::Internal(e.to_string()),
            StoreError::OutOfRange(_) => Self::Invalid("the stock would exceed its maximum".into()),
            StoreError::Other(e) => Self::Internal(e.to_string()),
        }
    }
}

impl From<LockError> for SeckillError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Redis(e) => redis_error(e),
            e @ LockError::NodesUnavailable { .. } => Self::Unavailable {
                dependency: "Redis",
                detail: e.to_string(),
            },
            e @ LockError::NotHeld { .. } => Self::Internal(e.to_string()),
        }
    }
}

impl From<IdError> for SeckillError {
    fn from(error: IdError) -> Self {
        match error {
            IdError::Pool(e) => redis_pool_error(e),
            IdError::Redis(e) => redis_error(e),
            e => Self::Internal(e.to_string()),
        }
    }
}

impl From<redis::RedisError> for SeckillError {
    fn from(error: redis::RedisError) -> Self {
        redis_error(error)
    }
}

impl From<PoolError> for SeckillError {
    fn from(error: PoolError) -> Self {
        redis_pool_error(error)
    }
}

fn redis_pool_error(error: PoolError) -> SeckillError {
    match error {
        PoolError::Backend(e) => redis_error(e),
        // No connection within the wait time, or none can be made.
        e => SeckillError::Unavailable {
            dependency: "Redis",
            detail: e.to_string(),
        },
    }
}

fn redis_error(error: redis::RedisError) -> SeckillError {
    use redis::ErrorKind as K;
    let transient = error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || matches!(
            error.kind(),
            K::BusyLoadingError | K::TryAgain | K::ClusterDown | K::MasterDown | K::ReadOnly
        );
    if transient {
        SeckillError::Unavailable {
            dependency: "Redis",
            detail: error.to_string(),
        }
    } else {
        SeckillError::Internal(format!("Redis: {error}"))
    }
}

/// Tuning for [`Seckill`].
#[derive(Debug, Clone)]
pub struct SeckillSettings {
    /// Prefix of every Redis key this service writes (tests use their own).
    pub redis_prefix: String,
    /// Lease of the per-user purchase lock: the longest a crashed instance
    /// can keep a user waiting. Far longer than a purchase takes.
    pub lock_lease: Duration,
    /// How long a voucher's time window may be served from memory.
    pub voucher_cache_ttl: Duration,
}

/// A voucher to create, as an admin sent it.
#[derive(Debug, Clone)]
pub struct VoucherDraft {
    pub title: String,
    pub stock: i64,
    pub begin_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
}

/// Connection counts, for the metrics page.
#[derive(Debug, Clone, Copy)]
pub struct PoolUsage {
    pub postgres_size: u32,
    pub postgres_idle: u32,
    pub redis_size: u32,
    pub redis_available: u32,
}

#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error("voucher not found")]
    Missing,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The flash-sale service. Cheap to clone.
#[derive(Clone)]
pub struct Seckill {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    redis: Pool,
    locks: UserLocks,
    ids: IdGenerator,
    /// Time windows of vouchers, so a crowd on one voucher does not read
    /// its row once per request. Stock is never taken from here.
    windows: moka::future::Cache<i64, Arc<Voucher>>,
    /// Vouchers this instance recently saw flagged sold out in Redis.
    sold_out_here: moka::sync::Cache<i64, ()>,
    soldout_mark: Script,
    settings: SeckillSettings,
    /// Per-purchase lock owner ids, unique within this process.
    purchases: AtomicU64,
}

impl Seckill {
    /// `redis` serves ids and the sold-out flags; `locks` the users' locks.
    pub fn new(store: Store, redis: Pool, locks: UserLocks, settings: SeckillSettings) -> Self {
        let windows = moka::future::Cache::builder()
            .max_capacity(10_000)
            .time_to_live(settings.voucher_cache_ttl)
            .build();
        Self {
            inner: Arc::new(Inner {
                locks,
                ids: IdGenerator::new(redis.clone(), settings.redis_prefix.clone()),
                store,
                redis,
                windows,
                sold_out_here: moka::sync::Cache::builder()
                    .max_capacity(10_000)
                    .time_to_live(SOLDOUT_LOCAL_TTL)
                    .build(),
                soldout_mark: Script::new(include_str!("../../lua/soldout_mark.lua")),
                settings,
                purchases: AtomicU64::new(0),
            }),
        }
    }

    /// Waits (at most `timeout`) for lock releases still under way.
    pub async fn shutdown_locks(&self, timeout: Duration) -> bool {
        self.inner.locks.shutdown(timeout).await
    }

    /// Buys one unit of `voucher_id` for `user_id`.
    pub async fn purchase(&self, user_id: i64, voucher_id: i64) -> Result<OrderId> {
        let result = self.try_purchase(user_id, voucher_id).await;
        let outcome = result
            .as_ref()
            .map_or_else(SeckillError::outcome, |_| "ordered");
        metrics::counter!("seckill_purchases_total", "outcome" => outcome).increment(1);
        result
    }

    async fn try_purchase(&self, user_id: i64, voucher_id: i64) -> Result<OrderId> {
        let voucher = self.sale_window(voucher_id).await?;
        let now = Utc::now();
        if now < voucher.begin_time {
            return Err(SeckillError::NotStarted);
        }
        if now >= voucher.end_time {
            return Err(SeckillError::Ended);
        }
        if self.is_flagged_sold_out(voucher_id).await? {
            return Err(SeckillError::SoldOut);
        }

        let inner = &self.inner;
        let purchase = inner.purchases.fetch_add(1, Ordering::Relaxed);
        let asked = Instant::now();
        let acquired = inner
            .locks
            .try_lock(user_id, purchase, inner.settings.lock_lease)
            .await?;
        metrics::histogram!("seckill_lock_acquire_seconds").record(asked.elapsed().as_secs_f64());
        let Some(guard) = acquired else {
            metrics::counter!("seckill_lock_contended_total").increment(1);
            return Err(SeckillError::InProgress);
        };

        let result = self.buy_locked(user_id, &voucher, guard.fence()).await;
        // Released here on every path that returns; if this future is
        // dropped instead (client gone, panic), the guard's Drop releases.
        if let Err(error) = guard.unlock().await {
            // The order, if any, is committed and the unique index kept it
            // single; a lock that expired mid-purchase is worth a warning.
            tracing::warn!(user_id, voucher_id, %error, "releasing the purchase lock failed");
        }
        result
    }

    /// The part of a purchase that runs under the user's lock.
    async fn buy_locked(&self, user_id: i64, voucher: &Voucher, fence: i64) -> Result<OrderId> {
        let store = &self.inner.store;
        if store.has_order(user_id, voucher.id).await? {
            return Err(SeckillError::AlreadyPurchased);
        }
        let (order_id, sale) = self.sell_with_fresh_id(user_id, voucher.id, fence).await?;
        match sale {
            Sale::Sold(level) => {
                if level.stock == 0 {
                    self.flag_stock(voucher, level).await;
                }
                Ok(order_id)
            }
            Sale::SoldOut => {
                if let Some(level) = store.stock_level(voucher.id).await? {
                    if level.stock == 0 {
                        self.flag_stock(voucher, level).await;
                    }
                }
                Err(SeckillError::SoldOut)
            }
            Sale::Fenced => {
                // Our lock's lease ran out and a newer holder has written:
                // that request is the user's purchase in progress.
                tracing::warn!(
                    user_id,
                    voucher_id = voucher.id,
                    fence,
                    "purchase refused: a newer lock holder wrote first"
                );
                Err(SeckillError::InProgress)
            }
        }
    }

    /// Sells one unit under a new order id. The id is drawn before the
    /// statement, so no Redis round trip happens while the voucher's row is
    /// locked. An id already taken (the Redis counter lost its value and
    /// started over within one second) is retried with the next one.
    async fn sell_with_fresh_id(
        &self,
        user_id: i64,
        voucher_id: i64,
        fence: i64,
    ) -> Result<(OrderId, Sale)> {
        const ATTEMPTS: usize = 5;
        let mut attempt = 1;
        loop {
            let order_id = self.inner.ids.next_id().await?;
            match self
                .inner
                .store
                .sell_one(order_id.as_i64(), user_id, voucher_id, fence)
                .await
            {
                Err(StoreError::DuplicateOrderId) if attempt < ATTEMPTS => {
                    tracing::warn!(%order_id, "order id already taken; drawing another");
                    attempt += 1;
                }
                other => return Ok((order_id, other?)),
            }
        }
    }

    async fn sale_window(&self, voucher_id: i64) -> Result<Arc<Voucher>> {
        let store = &self.inner.store;
        self.inner
            .windows
            .try_get_with(voucher_id, async move {
                Ok::<_, LoadError>(Arc::new(
                    store.voucher(voucher_id).await?.ok_or(LoadError::Missing)?,
                ))
            })
            .await
            .map_err(|error| match &*error {
                LoadError::Missing => SeckillError::NotFound("voucher"),
                LoadError::Store(StoreError::Unavailable(e)) => SeckillError::Unavailable {
                    dependency: "Postgres",
                    detail: e.to_string(),
                },
                LoadError::Store(e) => SeckillError::Internal(e.to_string()),
            })
    }

    fn soldout_key(&self, voucher_id: i64) -> String {
        format!(
            "{}seckill:soldout:{voucher_id}",
            self.inner.settings.redis_prefix
        )
    }

    async fn is_flagged_sold_out(&self, voucher_id: i64) -> Result<bool> {
        if self.inner.sold_out_here.contains_key(&voucher_id) {
            return Ok(true);
        }
        let mut conn = self.inner.redis.get().await?;
        let flag: Option<u8> = redis::cmd("HGET")
            .arg(self.soldout_key(voucher_id))
            .arg("sold_out")
            .query_async(&mut conn)
            .await?;
        if flag == Some(1) {
            self.inner.sold_out_here.insert(voucher_id, ());
        }
        Ok(flag == Some(1))
    }

    /// Publishes the stock state seen in Postgres to the Redis flag. A
    /// failure only costs speed (later requests go to Postgres), so it is
    /// logged, not returned.
    async fn flag_stock(&self, voucher: &Voucher, level: StockLevel) {
        let left = (voucher.end_time - Utc::now()).to_std().unwrap_or_default();
        let ttl = left.clamp(Duration::from_secs(1), MAX_SOLDOUT_FLAG);
        let result: Result<i64> = async {
            let mut conn = self.inner.redis.get().await?;
            Ok(self
                .inner
                .soldout_mark
                .key(self.soldout_key(voucher.id))
                .arg(level.initial_stock)
                .arg(u8::from(level.stock == 0))
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                .invoke_async(&mut conn)
                .await?)
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(voucher_id = voucher.id, %error, "could not update the sold-out flag");
        }
    }

    pub async fn create_voucher(&self, draft: VoucherDraft) -> Result<i64> {
        let title = draft.title.trim();
        if title.is_empty() || title.chars().count() > TITLE_MAX_CHARS {
            return Err(SeckillError::Invalid(format!(
                "title must have 1 to {TITLE_MAX_CHARS} characters"
            )));
        }
        let stock = stock_units(draft.stock)?;
        if draft.end_time <= draft.begin_time {
            return Err(SeckillError::Invalid(
                "end_time must be after begin_time".into(),
            ));
        }
        Ok(self
            .inner
            .store
            .create_voucher(&NewVoucher {
                title: title.to_owned(),
                stock,
                begin_time: draft.begin_time,
                end_time: draft.end_time,
            })
            .await?)
    }

    /// The voucher with its stock as committed now (never cached).
    pub async fn voucher(&self, voucher_id: i64) -> Result<Voucher> {
        self.inner
            .store
            .voucher(voucher_id)
            .await?
            .ok_or(SeckillError::NotFound("voucher"))
    }

    /// Adds `units` to a voucher's stock and reopens its sale on every
    /// instance.
    pub async fn restock(&self, voucher_id: i64, units: i64) -> Result<Voucher> {
        let units = i32::try_from(units)
            .ok()
            .filter(|u| *u > 0)
            .ok_or_else(|| {
                SeckillError::Invalid(format!("add must be between 1 and {}", i32::MAX))
            })?;
        let voucher = self
            .inner
            .store
            .restock(voucher_id, units)
            .await?
            .ok_or(SeckillError::NotFound("voucher"))?;
        let level = StockLevel {
            stock: voucher.stock,
            initial_stock: voucher.initial_stock,
        };
        self.flag_stock(&voucher, level).await;
        self.inner.sold_out_here.invalidate(&voucher_id);
        Ok(voucher)
    }

    pub async fn order(&self, order_id: OrderId) -> Result<Order> {
        self.inner
            .store
            .order(order_id.as_i64())
            .await?
            .ok_or(SeckillError::NotFound("order"))
    }

    pub async fn orders_for_voucher(&self, voucher_id: i64) -> Result<Vec<(i64, i64)>> {
        let store = &self.inner.store;
        if store.stock_level(voucher_id).await?.is_none() {
            return Err(SeckillError::NotFound("voucher"));
        }
        Ok(store.orders_for_voucher(voucher_id).await?)
    }

    pub async fn stats(&self, voucher_id: i64) -> Result<store::Stats> {
        self.inner
            .store
            .stats(voucher_id)
            .await?
            .ok_or(SeckillError::NotFound("voucher"))
    }

    /// Whether Postgres and Redis both answer.
    pub async fn ready(&self) -> Result<()> {
        self.inner.store.ping().await?;
        let mut conn = self.inner.redis.get().await?;
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(())
    }

    pub fn pool_usage(&self) -> PoolUsage {
        let pg = self.inner.store.pool();
        let redis = self.inner.redis.status();
        PoolUsage {
            postgres_size: pg.size(),
            postgres_idle: u32::try_from(pg.num_idle()).unwrap_or(u32::MAX),
            redis_size: u32::try_from(redis.size).unwrap_or(u32::MAX),
            redis_available: u32::try_from(redis.available).unwrap_or(u32::MAX),
        }
    }
}
