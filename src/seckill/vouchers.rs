//! The vouchers in memory: each read once per moment however large the
//! crowd (`sale_window`), an unknown id remembered as unknown for a moment,
//! and an async sale's voucher kept once read (`selling`), so that it sells
//! on while Postgres is away.

use std::sync::Arc;
use std::time::Duration;

use super::{Result, SaleMode, Seckill, SeckillError, Voucher, STOCK_REFRESH};
use crate::store::StoreError;

/// How long an unknown voucher id is remembered as unknown.
const MISSING_TTL: Duration = Duration::from_millis(500);
/// How long an async sale's voucher stays in memory unread.
const ASYNC_VOUCHER_IDLE: Duration = Duration::from_secs(3_600);

/// Why a voucher could not be read into a cache: shared by the requests
/// that waited for the one read.
#[derive(Debug, thiserror::Error)]
pub(super) enum LoadError {
    #[error("voucher not found")]
    Missing,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LoadError {
    /// What each of the requests that shared the read is answered.
    pub(super) fn answer(self: Arc<Self>) -> SeckillError {
        match &*self {
            Self::Missing => return SeckillError::NotFound("voucher"),
            Self::Store(e @ (StoreError::Unavailable(_) | StoreError::TimedOut(_))) => {
                return SeckillError::postgres_unavailable(e)
            }
            Self::Store(_) => {}
        }
        SeckillError::internal_from("reading a voucher", self)
    }
}

/// The vouchers as [`Inner`] keeps them in memory (see its fields).
pub(super) struct Caches {
    pub(super) windows: moka::future::Cache<i64, Arc<Voucher>>,
    pub(super) async_vouchers: moka::sync::Cache<i64, Arc<Voucher>>,
    pub(super) missing: moka::sync::Cache<i64, ()>,
    pub(super) stock_seen: moka::future::Cache<i64, i32>,
}

impl Caches {
    pub(super) fn new(voucher_cache_ttl: Duration) -> Self {
        Self {
            windows: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(voucher_cache_ttl)
                .build(),
            async_vouchers: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_idle(ASYNC_VOUCHER_IDLE)
                .build(),
            missing: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(MISSING_TTL)
                .build(),
            stock_seen: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(STOCK_REFRESH)
                .build(),
        }
    }
}

impl Seckill {
    /// The voucher as its purchases and its room read it: an async sale's
    /// from memory once read (see `async_vouchers`), a sync sale's as
    /// [`Seckill::sale_window`] keeps it.
    pub(super) async fn selling(&self, voucher_id: i64) -> Result<Arc<Voucher>> {
        match self.inner.async_vouchers.get(&voucher_id) {
            Some(voucher) => Ok(voucher),
            None => self.sale_window(voucher_id).await,
        }
    }

    pub(super) async fn sale_window(&self, voucher_id: i64) -> Result<Arc<Voucher>> {
        // A crowd's voucher is cached: a plain lookup, without the
        // machinery that shares one load among concurrent misses.
        if let Some(voucher) = self.inner.windows.get(&voucher_id).await {
            return Ok(voucher);
        }
        if self.inner.missing.contains_key(&voucher_id) {
            return Err(SeckillError::NotFound("voucher"));
        }
        let store = &self.inner.store;
        let found = self
            .inner
            .windows
            .try_get_with(voucher_id, async move {
                Ok::<_, LoadError>(Arc::new(
                    store.voucher(voucher_id).await?.ok_or(LoadError::Missing)?,
                ))
            })
            .await
            .map_err(|error| error.answer());
        match &found {
            Ok(voucher) if voucher.sale_mode == SaleMode::Async => {
                self.inner
                    .async_vouchers
                    .insert(voucher_id, voucher.clone());
            }
            Err(SeckillError::NotFound(_)) => self.inner.missing.insert(voucher_id, ()),
            _ => {}
        }
        found
    }
}
