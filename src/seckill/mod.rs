//! The flash sale itself: who may buy what and when, in the order that
//! keeps stock and orders right. Knows nothing of HTTP.
//!
//! A purchase runs: voucher (short-lived cache) → time window (by Redis's
//! clock) → sold-out flag in Redis → the user's reentrant lock → "already
//! bought?" → order id → one statement that decrements `stock > 0` and
//! inserts the order → release. Each step is cheaper than the next, so the
//! crowd that cannot buy is turned away before it reaches the voucher's row
//! lock.
//!
//! Stages in their own files: [`clock`] (the shared clock of the window),
//! [`soldout`] (the flags), [`user_lock`] (the per-user lock), [`error`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_redis::redis;

mod clock;
mod error;
mod soldout;
mod user_lock;

pub use clock::SaleClock;
pub use error::{Result, SeckillError};
pub use user_lock::{UserGuard, UserLocks};

use crate::id::{self, IdGenerator, OrderId};
use crate::kv::Kv;
use crate::store::{self, NewVoucher, Sale, StockLevel, Store, StoreError};
use soldout::SoldOutFlags;

pub use crate::store::{Order, Stats, Voucher};

const TITLE_MAX_CHARS: usize = 200;

/// A voucher's stock as asked for, in the range its column holds.
pub fn stock_units(stock: i64) -> Result<i32> {
    i32::try_from(stock)
        .ok()
        .filter(|s| *s >= 0)
        .ok_or_else(|| SeckillError::Invalid(format!("stock must be between 0 and {}", i32::MAX)))
}

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
    redis: Kv,
    locks: UserLocks,
    ids: IdGenerator,
    clock: SaleClock,
    /// Vouchers as last read, so a crowd on one voucher does not read its
    /// row once per request. Only the time window and the epoch of the
    /// sold-out flag are taken from here, never the stock.
    windows: moka::future::Cache<i64, Arc<Voucher>>,
    flags: SoldOutFlags,
    settings: SeckillSettings,
    /// Per-purchase lock owner ids, unique within this process.
    purchases: AtomicU64,
}

impl Seckill {
    /// `redis` serves ids, the sold-out flags and the clock; `locks` the
    /// users' locks.
    pub fn new(
        store: Store,
        redis: Kv,
        locks: UserLocks,
        clock: SaleClock,
        settings: SeckillSettings,
    ) -> Self {
        let windows = moka::future::Cache::builder()
            .max_capacity(10_000)
            .time_to_live(settings.voucher_cache_ttl)
            .build();
        Self {
            inner: Arc::new(Inner {
                locks,
                ids: IdGenerator::new(redis.clone(), settings.redis_prefix.clone()),
                flags: SoldOutFlags::new(redis.clone(), settings.redis_prefix.clone()),
                store,
                redis,
                clock,
                windows,
                settings,
                purchases: AtomicU64::new(0),
            }),
        }
    }

    /// The clock that judges every sale's window.
    pub fn clock(&self) -> &SaleClock {
        &self.inner.clock
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
        let now = self.inner.clock.now();
        if now < voucher.begin_time {
            return Err(SeckillError::NotStarted);
        }
        if now >= voucher.end_time {
            return Err(SeckillError::Ended);
        }
        if self.inner.flags.is_sold_out(&voucher).await? {
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
        if let Some(order_id) = store.order_of(user_id, voucher.id).await? {
            return Err(already_purchased(order_id));
        }
        let sale = match self.sell_with_fresh_id(user_id, voucher.id, fence).await {
            Err(SeckillError::AlreadyPurchased { order_id: None }) => {
                // The unique index caught an order that committed after our
                // check (a lapsed lease): name it, as the check would have.
                let existing = store.order_of(user_id, voucher.id).await?;
                return Err(SeckillError::AlreadyPurchased {
                    order_id: existing.and_then(OrderId::from_stored),
                });
            }
            other => other?,
        };
        match sale {
            (order_id, Sale::Sold(level)) => {
                if level.stock == 0 {
                    self.publish_stock(voucher, level).await;
                }
                Ok(order_id)
            }
            (_, Sale::SoldOut) => {
                if let Some(level) = store.stock_level(voucher.id).await? {
                    if level.stock == 0 {
                        self.publish_stock(voucher, level).await;
                    }
                }
                Err(SeckillError::SoldOut)
            }
            (_, Sale::Fenced) => {
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
    /// locked. An id that is taken already means Redis lost the day's
    /// counter (a restart without persistence, a failover) and counts again
    /// from where it restarted: the counter is raised past the highest id
    /// Postgres holds for that day, and the sale draws again.
    async fn sell_with_fresh_id(
        &self,
        user_id: i64,
        voucher_id: i64,
        fence: i64,
    ) -> Result<(OrderId, Sale)> {
        const ATTEMPTS: usize = 3;
        for _ in 0..ATTEMPTS {
            let order_id = self.inner.ids.next_id().await?;
            match self
                .inner
                .store
                .sell_one(order_id.as_i64(), user_id, voucher_id, fence)
                .await
            {
                Err(StoreError::DuplicateOrderId) => {
                    tracing::warn!(%order_id, "order id already taken: the id counter was lost");
                    self.recover_id_counter(order_id).await?;
                }
                other => return Ok((order_id, other?)),
            }
        }
        // Raised each time and still taken: Redis keeps losing the counter.
        Err(SeckillError::redis_unavailable(
            "the order-id counter keeps handing out ids that are taken",
        ))
    }

    /// Raises the day's id counter of `taken` past every id Postgres holds
    /// for that day.
    async fn recover_id_counter(&self, taken: OrderId) -> Result<()> {
        let day = taken.drawn_at();
        let range = id::day_range(day).ok_or_else(|| {
            SeckillError::redis_unavailable("Redis's clock is outside the order id range")
        })?;
        let highest = self.inner.store.highest_sequence(range).await?;
        self.inner.ids.raise_day(day, highest).await?;
        metrics::counter!("seckill_id_counter_recoveries_total").increment(1);
        tracing::warn!(%day, highest, "raised the order-id counter past the ids already used");
        Ok(())
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
                LoadError::Store(e @ (StoreError::Unavailable(_) | StoreError::TimedOut(_))) => {
                    SeckillError::postgres_unavailable(e)
                }
                LoadError::Store(e) => SeckillError::Internal(e.to_string()),
            })
    }

    async fn publish_stock(&self, voucher: &Voucher, level: StockLevel) {
        let now = self.inner.clock.now();
        self.inner.flags.publish(voucher, level, now).await;
    }

    pub async fn create_voucher(&self, draft: VoucherDraft) -> Result<i64> {
        let title = draft.title.trim();
        if title.is_empty() || title.chars().count() > TITLE_MAX_CHARS {
            return Err(SeckillError::Invalid(format!(
                "title must have 1 to {TITLE_MAX_CHARS} characters"
            )));
        }
        if title.chars().any(char::is_control) {
            return Err(SeckillError::Invalid(
                "title must not hold control characters".into(),
            ));
        }
        let stock = stock_units(draft.stock)?;
        let begin_time = storable_time("begin_time", draft.begin_time)?;
        let end_time = storable_time("end_time", draft.end_time)?;
        if end_time <= begin_time {
            return Err(SeckillError::Invalid(
                "end_time must be after begin_time (to the microsecond)".into(),
            ));
        }
        Ok(self
            .inner
            .store
            .create_voucher(&NewVoucher {
                title: title.to_owned(),
                stock,
                begin_time,
                end_time,
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

    /// Adds `units` to a voucher's stock. The sale reopens on every
    /// instance without a word to Redis: the restock raises the voucher's
    /// epoch, and a sold-out flag of an older epoch is ignored (see
    /// [`soldout`]); here at once, elsewhere within the voucher cache's
    /// lifetime.
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
        self.inner.windows.invalidate(&voucher_id).await;
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
        self.inner.redis.query::<()>(&redis::cmd("PING")).await?;
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

fn already_purchased(order_id: i64) -> SeckillError {
    SeckillError::AlreadyPurchased {
        order_id: OrderId::from_stored(order_id),
    }
}

/// A time as Postgres keeps it (to the microsecond, truncated as the
/// driver sends it) and as RFC 3339 can write it back (years 0000 to 9999
/// in UTC); anything else is refused rather than stored changed.
fn storable_time(field: &str, time: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let micros = time.timestamp_micros();
    let stored = DateTime::from_timestamp_micros(micros).unwrap_or(time);
    let first = DateTime::parse_from_rfc3339("0000-01-01T00:00:00Z").map(|t| t.to_utc());
    let last = DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999Z").map(|t| t.to_utc());
    match (first, last) {
        (Ok(first), Ok(last)) if (first..=last).contains(&stored) => Ok(stored),
        _ => Err(SeckillError::Invalid(format!(
            "{field} must fall between 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_kept_to_the_microsecond_and_within_four_digit_years() {
        let t = DateTime::parse_from_rfc3339("2026-01-01T00:00:00.0000009Z")
            .unwrap()
            .to_utc();
        assert_eq!(
            storable_time("t", t).unwrap(),
            DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap()
        );
        let late = DateTime::parse_from_rfc3339("9999-12-31T23:59:59-12:00")
            .unwrap()
            .to_utc();
        assert!(storable_time("t", late).is_err());
    }
}
