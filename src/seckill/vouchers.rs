//! The vouchers in memory: each read once per moment however large the
//! crowd (`sale_window`), an unknown id remembered as unknown for a moment,
//! and an async sale's voucher kept once read (`selling`), so that it sells
//! on while Postgres is away.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Result, Seckill, SeckillError, LIST_REFRESH, STOCK_REFRESH};
use crate::domain::{SaleMode, Voucher, VoucherId};
use crate::store::StoreError;

/// How long an unknown voucher id is remembered as unknown.
const MISSING_TTL: Duration = Duration::from_millis(500);
/// How long the highest voucher id read answers "no such voucher" for an
/// id above it before it is read again.
const NEWEST_REFRESH: Duration = Duration::from_millis(50);
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
            Self::Missing => SeckillError::NotFound("voucher"),
            Self::Store(StoreError::Unavailable(_) | StoreError::TimedOut(_)) => {
                SeckillError::postgres_unavailable(self)
            }
            Self::Store(_) => SeckillError::internal_from("reading a voucher", self),
        }
    }
}

/// The vouchers kept in memory.
pub(super) struct Caches {
    /// Vouchers as last read, so a crowd on one voucher does not read its
    /// row once per request. The time window and the epoch of the sold-out
    /// flag are taken from here, and the gate takes the stock as what is
    /// left at most at that epoch; the batch never does.
    pub(super) windows: moka::future::Cache<VoucherId, Arc<Voucher>>,
    /// Async sales' vouchers, once read: what their purchases read of them
    /// (id, limits, room) never changes, and Redis keeps their window and
    /// stock, so they go on selling while Postgres fails over.
    pub(super) async_vouchers: moka::sync::Cache<VoucherId, Arc<Voucher>>,
    /// Voucher ids found missing, for a moment: a flood of unknown ids
    /// asks Postgres once per id and moment, not once per request.
    pub(super) missing: moka::sync::Cache<VoucherId, ()>,
    /// The highest voucher id known here (0: none yet), read without a
    /// lock: an id at or below it may be a voucher.
    pub(super) highest: AtomicI64,
    /// The highest voucher id as last read from Postgres, kept for
    /// [`NEWEST_REFRESH`]: an id above [`Caches::highest`] is no voucher
    /// unless a read says otherwise, so a flood of made-up ids (a new one
    /// each request) asks Postgres one `max(id)` at a time, not one query
    /// per request on the pool the sale reloads its voucher from. The
    /// requests that come while it is read share that read, and its
    /// failure: with Postgres away they wait for one deadline, not one
    /// each in turn.
    pub(super) newest: moka::future::Cache<(), i64>,
    /// Each voucher's remaining stock as last read, for `GET /vouchers`:
    /// a crowd of readers costs one query per voucher and refresh.
    pub(super) stock_seen: moka::future::Cache<VoucherId, i32>,
    /// The vouchers on offer (`GET /vouchers`), as last listed: a crowd of
    /// readers costs one query per refresh.
    pub(super) on_offer: moka::future::Cache<(), Arc<[Voucher]>>,
}

impl Caches {
    pub(super) fn new(voucher_cache_ttl: Duration) -> Self {
        Self {
            windows: kept_for(voucher_cache_ttl),
            async_vouchers: moka::sync::Cache::builder()
                .max_capacity(VOUCHERS)
                .time_to_idle(ASYNC_VOUCHER_IDLE)
                .build(),
            missing: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(MISSING_TTL)
                .build(),
            highest: AtomicI64::new(0),
            newest: moka::future::Cache::builder()
                .max_capacity(1)
                .time_to_live(NEWEST_REFRESH)
                .build(),
            stock_seen: kept_for(STOCK_REFRESH),
            on_offer: moka::future::Cache::builder()
                .max_capacity(1)
                .time_to_live(LIST_REFRESH)
                .build(),
        }
    }
}

/// Most vouchers each cache holds.
const VOUCHERS: u64 = 10_000;

/// A cache of vouchers whose entries last `ttl` from when they were read.
fn kept_for<V>(ttl: Duration) -> moka::future::Cache<VoucherId, V>
where
    V: Clone + Send + Sync + 'static,
{
    moka::future::Cache::builder()
        .max_capacity(VOUCHERS)
        .time_to_live(ttl)
        .build()
}

impl Seckill {
    /// The voucher as its purchases and its room read it: an async sale's
    /// from memory once read (see `async_vouchers`), a sync sale's as
    /// [`Seckill::sale_window`] keeps it.
    pub(super) async fn selling(&self, voucher_id: VoucherId) -> Result<Arc<Voucher>> {
        match self.inner.vouchers.async_vouchers.get(&voucher_id) {
            Some(voucher) => Ok(voucher),
            None => self.sale_window(voucher_id).await,
        }
    }

    pub(super) async fn sale_window(&self, voucher_id: VoucherId) -> Result<Arc<Voucher>> {
        // A crowd's voucher is cached: a plain lookup, without the
        // machinery that shares one load among concurrent misses.
        if let Some(voucher) = self.inner.vouchers.windows.get(&voucher_id).await {
            return Ok(voucher);
        }
        if self.inner.vouchers.missing.contains_key(&voucher_id)
            || !self.may_exist(voucher_id).await?
        {
            return Err(SeckillError::NotFound("voucher"));
        }
        let store = &self.inner.store;
        let found = self
            .inner
            .vouchers
            .windows
            .try_get_with(voucher_id, async move {
                Ok::<_, LoadError>(Arc::new(
                    store.voucher(voucher_id).await?.ok_or(LoadError::Missing)?,
                ))
            })
            .await
            .map_err(|error| error.answer());
        match &found {
            Ok(voucher) if voucher.terms.sale_mode == SaleMode::Async => {
                self.inner
                    .vouchers
                    .async_vouchers
                    .insert(voucher_id, voucher.clone());
            }
            Err(SeckillError::NotFound(_)) => self.inner.vouchers.missing.insert(voucher_id, ()),
            _ => {}
        }
        found
    }

    /// Whether `voucher_id` is not above the highest voucher id: read
    /// again when it is, unless read within [`NEWEST_REFRESH`] (a voucher
    /// made on another instance is found once that read is older).
    async fn may_exist(&self, voucher_id: VoucherId) -> Result<bool> {
        let vouchers = &self.inner.vouchers;
        if voucher_id.get() <= vouchers.highest.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let store = &self.inner.store;
        let read = vouchers
            .newest
            .try_get_with((), async move {
                store.newest_voucher_id().await.map_err(LoadError::Store)
            })
            .await
            .map_err(LoadError::answer)?;
        let highest = vouchers
            .highest
            .fetch_max(read, Ordering::Relaxed)
            .max(read);
        Ok(voucher_id.get() <= highest)
    }

    /// A voucher made here: ids up to it exist (so the voucher is found
    /// at once, without another read of the highest id).
    pub(super) fn made(&self, voucher_id: VoucherId) {
        self.inner
            .vouchers
            .highest
            .fetch_max(voucher_id.get(), Ordering::Relaxed);
        self.inner.vouchers.missing.invalidate(&voucher_id);
    }
}
