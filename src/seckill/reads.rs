//! What the service tells without selling: a voucher as the crowd reads
//! it (from memory), orders, a voucher's books, whether it is ready, and
//! its connection counts.

use std::sync::Arc;
use std::time::Instant;

use super::vouchers::LoadError;
use super::{Result, Seckill, SeckillError, LISTED_VOUCHERS, READY_EVERY};
use crate::domain::OrderId;
use crate::domain::VoucherId;
use crate::domain::{Order, OrderLine, SaleMode, Voucher};
use crate::kv::Keys;

/// A voucher's books: `stock + units = initial_stock`, where `units` are
/// those of the `pending`, `unpaid` and `paid` orders.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub initial_stock: i32,
    /// Units still for sale: Postgres's stock, less an async sale's
    /// pending orders.
    pub stock: i64,
    /// Units of live orders (pending ones of an async sale too).
    pub units: i64,
    pub distinct_users: i64,
    pub pending: i64,
    pub unpaid: i64,
    pub paid: i64,
    pub cancelled: i64,
    pub expired: i64,
    pub max_orders_per_user: i32,
}

/// Connection counts, for the metrics page.
#[derive(Debug, Clone, Copy)]
pub struct PoolUsage {
    pub postgres_size: u32,
    pub postgres_idle: u32,
    /// The pool of everything but the sale's commits.
    pub other_size: u32,
    pub other_idle: u32,
    /// The service's shared Redis connection: 1 while open.
    pub redis_open: u32,
}

impl Seckill {
    /// The voucher, from memory: as the sale keeps it (at most the voucher
    /// cache's lifetime old; an async sale's once read), with its remaining stock read at most
    /// [`STOCK_REFRESH`] ago. A crowd of readers costs one query per
    /// voucher and refresh, however large. An async sale's stock is
    /// Redis's, which counts the orders accepted and not yet written
    /// (Postgres's, while Redis cannot say).
    pub async fn voucher(&self, voucher_id: VoucherId) -> Result<Voucher> {
        let mut voucher = Voucher::clone(&*self.selling(voucher_id).await?);
        let store = &self.inner.store;
        let sales = &self.inner.async_sales;
        let sold_in_redis = voucher.terms.sale_mode == SaleMode::Async;
        let stock_seen = &self.inner.vouchers.stock_seen;
        let level = stock_seen
            .try_get_with(voucher_id, async move {
                if sold_in_redis {
                    if let Ok(Some(stock)) = sales.stock(voucher_id).await {
                        return Ok(i32::try_from(stock.max(0)).unwrap_or(i32::MAX));
                    }
                }
                match store.stock_level(voucher_id).await {
                    Ok(Some(level)) => Ok(level.stock),
                    Ok(None) => Err(LoadError::Missing),
                    Err(e) => Err(LoadError::Store(e)),
                }
            })
            .await
            .map_err(|error| error.answer())?;
        voucher.level.stock = level;
        Ok(voucher)
    }

    /// The vouchers whose sale has not ended, on sale first, then coming,
    /// each by its start (at most [`LISTED_VOUCHERS`]: past it, the sales
    /// that began last and the first to start), with their stock:
    /// as listed at most [`LIST_REFRESH`](super::LIST_REFRESH) ago, one query per refresh however
    /// many read it.
    pub async fn vouchers_on_offer(&self) -> Result<Arc<[Voucher]>> {
        let store = &self.inner.store;
        let now = self.inner.clock.now();
        self.inner
            .vouchers
            .on_offer
            .try_get_with((), async move {
                let listed = store.vouchers_not_ended(now, LISTED_VOUCHERS).await?;
                Ok::<_, LoadError>(listed.into())
            })
            .await
            .map_err(|error| error.answer())
    }

    /// An order: stored, or accepted by an async sale and not written
    /// yet (`pending`).
    pub async fn order(&self, order_id: OrderId) -> Result<Order> {
        if let Some(order) = self.inner.store.order(order_id).await? {
            return Ok(order);
        }
        match self.inner.async_sales.pending(order_id).await? {
            // Written meanwhile: the pending lookup outlives the write.
            Some(mut pending) => match self.inner.store.order(order_id).await? {
                Some(order) => Ok(order),
                None => {
                    // Shown as a stored order shows it.
                    pending.user_ref = self.inner.store.user_ref(pending.user_id).await?;
                    Ok(pending)
                }
            },
            None => Err(SeckillError::NotFound("order")),
        }
    }

    pub async fn orders_for_voucher(&self, voucher_id: VoucherId) -> Result<Vec<OrderLine>> {
        let store = &self.inner.store;
        if store.stock_level(voucher_id).await?.is_none() {
            return Err(SeckillError::NotFound("voucher"));
        }
        Ok(store.orders_for_voucher(voucher_id).await?)
    }

    /// The voucher's books as one snapshot. An async sale's pending
    /// orders (and their units) are those its stream holds that Postgres
    /// does not: the
    /// stream is read first, so an order written in between is counted
    /// once, as stored, and one accepted in between not at all (nor taken
    /// from Postgres's stock).
    pub async fn stats(&self, voucher_id: VoucherId) -> Result<Stats> {
        // The sale mode never changes: the cached voucher tells it.
        let voucher = self.sale_window(voucher_id).await?;
        let listed: Vec<(OrderId, i32)> = match voucher.terms.sale_mode {
            SaleMode::Sync => Vec::new(),
            SaleMode::Async => (self.inner.async_sales.accepted(voucher_id).await?)
                .into_iter()
                .map(|a| (a.order_id, a.quantity.get()))
                .collect(),
        };
        let stats = self.inner.store.stats(voucher_id, listed).await?;
        let stats = stats.ok_or(SeckillError::NotFound("voucher"))?;
        let pending = stats.unstored_listed;
        Ok(Stats {
            initial_stock: stats.initial_stock,
            stock: i64::from(stats.stock) - stats.unstored_units,
            units: stats.units + stats.unstored_units,
            distinct_users: stats.distinct_users,
            pending,
            unpaid: stats.unpaid,
            paid: stats.paid,
            cancelled: stats.cancelled,
            expired: stats.expired,
            max_orders_per_user: voucher.terms.max_orders_per_user,
        })
    }

    /// Whether a purchase can be served now, as the last probe found (see
    /// [`Seckill::probe`]): one probe every [`READY_EVERY`] at most, which
    /// every caller in between shares, waiting for it if it is under way.
    pub async fn ready(&self) -> Result<()> {
        let mut last = self.inner.readiness.lock().await;
        if let Some((ended, answer)) = &*last {
            if ended.elapsed() < READY_EVERY {
                return answer.clone();
            }
        }
        let answer = self.probe().await;
        // Fresh from when it ended: a probe slower than READY_EVERY (a
        // dependency at its deadline) is not run again by each caller that
        // waited for it, one after another.
        *last = Some((Instant::now(), answer.clone()));
        answer
    }

    /// Whether a purchase can be served now: Postgres and Redis take
    /// writes, and so does the lock's Redis (with RedLock, a majority of its
    /// nodes). Each check has the dependency deadline.
    async fn probe(&self) -> Result<()> {
        let inner = &self.inner;
        let ready_key = Keys::new(inner.settings.redis_prefix.as_str()).ready();
        let (postgres, redis, locks) = tokio::join!(
            inner.store.check_writable(),
            inner.redis.check_writable(&ready_key),
            inner.locks.check_writable(),
        );
        if !postgres? {
            return Err(SeckillError::postgres_unavailable(
                "Postgres is a standby: it takes no writes",
            ));
        }
        redis?;
        locks?;
        Ok(())
    }

    pub fn pool_usage(&self) -> PoolUsage {
        let pg = self.inner.store.pool();
        let other = self.inner.store.other_pool();
        PoolUsage {
            postgres_size: pg.size(),
            postgres_idle: u32::try_from(pg.num_idle()).unwrap_or(u32::MAX),
            other_size: other.size(),
            other_idle: u32::try_from(other.num_idle()).unwrap_or(u32::MAX),
            redis_open: u32::try_from(self.inner.redis.open_connections()).unwrap_or(u32::MAX),
        }
    }
}
