//! The lab's Redis-stock designs: `redis_decr`, `redis_lua` and
//! `redis_stream`, each the form teams copy, with a crash injectable
//! between the Redis step and the Postgres step ([`StallAt::Crash`]).
//!
//! Every lab voucher has its Redis side from birth (its stock, its buyers,
//! its stream, under the voucher's hash tag); the lab's stats read the
//! Redis stock back, so that orders Redis accepted and Postgres never got
//! show as a count. `redis_stream`'s writer is the production design in
//! miniature: a consumer group, acknowledgement after the insert,
//! `XAUTOCLAIM` of a dead consumer's entries, and an insert that stores a
//! user's order once however often it is written.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::{self, streams::StreamId, Script};
use tokio_util::sync::CancellationToken;

use super::{Attempt, Lab, LabOrder, Stall, StallAt, Strategy};
use crate::store::Decrement;
use seckill::domain::VoucherId;
use seckill::kv::{Consumer, Delivery};
use seckill::seckill::{PurchaseError, Refusal, Result, SeckillError};

/// The check-and-decrement of `redis_lua` and `redis_stream`
/// (`lab/lua/check_and_decrement.lua`), hashed once.
static CHECK_AND_DECREMENT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/check_and_decrement.lua")));

/// The consumer group of every lab stream.
const GROUP: &str = "lab-writers";
/// A lab writer with nothing to do for this long stops; the next purchase
/// of its voucher in this instance starts another.
const WRITER_IDLE: Duration = Duration::from_secs(30);
/// Most entries a lab writer reads or claims at a time.
const BATCH: usize = 100;

/// A lab voucher's Redis keys, in one cluster slot.
pub(super) struct Keys {
    pub stock: String,
    pub buyers: String,
    pub orders: String,
}

pub(super) fn keys(prefix: &str, voucher_id: i64) -> Keys {
    let base = format!("{prefix}stock:{{{voucher_id}}}");
    Keys {
        stock: format!("{base}:units"),
        buyers: format!("{base}:buyers"),
        orders: format!("{base}:orders"),
    }
}

/// The request's "death" right after the Redis step.
fn crashed(stall: Option<Stall>) -> bool {
    stall.is_some_and(|s| s.at == StallAt::Crash)
}

fn crash_error() -> SeckillError {
    SeckillError::redis_unavailable("the lab crashed this request between Redis and Postgres")
}

impl Lab {
    /// Puts a new lab voucher's stock into Redis.
    pub(super) async fn load_redis_stock(&self, voucher_id: i64, stock: i32) -> Result<()> {
        let keys = keys(&self.inner.settings.redis_prefix, voucher_id);
        let _: () = self
            .inner
            .redis
            .query(redis::cmd("SET").arg(&keys.stock).arg(stock))
            .await?;
        Ok(())
    }

    /// The Redis stock of a lab voucher, if it has one.
    pub async fn redis_stock(&self, voucher_id: i64) -> Result<Option<i64>> {
        let keys = keys(&self.inner.settings.redis_prefix, voucher_id);
        Ok(self
            .inner
            .redis
            .query(redis::cmd("GET").arg(&keys.stock))
            .await?)
    }

    /// `redis_decr`, `redis_lua` and `redis_stream`.
    pub(super) async fn redis_stock_purchase(
        &self,
        attempt: Attempt,
    ) -> Result<LabOrder, PurchaseError> {
        let (strategy, user_id, voucher_id, stall) = attempt.parts();
        // The path let only a positive id through: no voucher has another.
        let voucher = VoucherId::new(voucher_id).ok_or(SeckillError::NotFound("lab voucher"))?;
        let inner = &self.inner;
        let keys = keys(&inner.settings.redis_prefix, voucher_id);
        let store = &inner.store;
        if strategy == Strategy::RedisDecr {
            // Check, then act, in two round trips: the race is between them.
            let stock: Option<i64> = inner
                .redis
                .query(redis::cmd("GET").arg(&keys.stock))
                .await?;
            if stock.unwrap_or(0) <= 0 {
                return Err(Refusal::SoldOut.into());
            }
            if store.has_order(user_id, voucher_id).await? {
                return Err(Refusal::AlreadyPurchased { order_id: None }.into());
            }
            let _: i64 = inner
                .redis
                .query(redis::cmd("DECR").arg(&keys.stock))
                .await?;
        } else {
            let mut call = CHECK_AND_DECREMENT.prepare_invoke();
            call.key(&keys.stock).key(&keys.buyers);
            if strategy == Strategy::RedisStream {
                call.key(&keys.orders);
            }
            call.arg(user_id)
                .arg(if crashed(stall) { "1" } else { "0" });
            let answer: i64 = inner.redis.invoke(&call).await?;
            match answer {
                1 => {}
                -1 => return Err(Refusal::SoldOut.into()),
                _ => return Err(Refusal::AlreadyPurchased { order_id: None }.into()),
            }
        }
        if strategy == Strategy::RedisStream {
            self.ensure_stream_writer(voucher);
            return Ok(LabOrder::Pending);
        }
        if crashed(stall) {
            return Err(crash_error().into());
        }
        store
            .sell(strategy.name(), user_id, voucher_id, Decrement::Always)
            .await?
            .map(LabOrder::Stored)
            .ok_or(SeckillError::NotFound("lab voucher").into())
    }

    fn ensure_stream_writer(&self, voucher: VoucherId) {
        self.inner.stream_writers.get_or_start(
            voucher,
            |()| true,
            |stop| ((), self.clone().write_stream(voucher, stop)),
        );
    }

    /// One lab writer: claims entries idle past the lease (a dead writer's),
    /// reads new ones, stores them, acknowledges; a batch holding an order
    /// marked to crash, read for the first time, is dropped unacknowledged
    /// (the writer "died" with it) and recovered by a later claim.
    async fn write_stream(self, voucher: VoucherId, stop: CancellationToken) {
        let voucher_id = voucher.get();
        let inner = &self.inner;
        let keys = keys(&inner.settings.redis_prefix, voucher_id);
        if let Err(error) = inner.redis.create_group(&keys.orders, GROUP).await {
            tracing::warn!(%voucher_id, %error, "lab stream group");
        }
        let name = format!("{}:{voucher_id}", inner.locks.process_id());
        let consumer = Consumer {
            stream: &keys.orders,
            group: GROUP,
            name: &name,
        };
        let mut last_work = Instant::now();
        while last_work.elapsed() < WRITER_IDLE && !stop.is_cancelled() {
            let claimed = inner
                .redis
                .claim_idle(consumer, inner.settings.lease, BATCH)
                .await;
            let fresh = inner.redis.read_group(consumer, Delivery::New, BATCH).await;
            let (claimed, fresh) = match (claimed, fresh) {
                (Ok(c), Ok(f)) => (c, f),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%voucher_id, %error, "lab stream writer");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if claimed.is_empty() && fresh.is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            last_work = Instant::now();
            let dies = fresh
                .iter()
                .any(|e| e.get::<String>("crash").as_deref() == Some("1"));
            if dies {
                tracing::info!(
                    %voucher_id,
                    entries = fresh.len(),
                    "lab writer crashed with its batch unacknowledged"
                );
            }
            let batches = if dies {
                vec![claimed]
            } else {
                vec![claimed, fresh]
            };
            for entries in batches {
                if let Err(error) = self.store_entries(voucher_id, &keys, &entries).await {
                    tracing::warn!(%voucher_id, %error, "lab stream writer: not stored yet");
                }
            }
        }
        inner.stream_writers.retire_if(voucher, |()| true);
        // A purchase between the last read and the line above found this
        // writer still running and started none: look once more.
        if !stop.is_cancelled() && !matches!(inner.redis.stream_len(&keys.orders).await, Ok(0)) {
            self.ensure_stream_writer(voucher);
        }
    }

    /// Stores each entry's order (once per user), then acknowledges and
    /// deletes the entries.
    async fn store_entries(
        &self,
        voucher_id: i64,
        keys: &Keys,
        entries: &[StreamId],
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let name = Strategy::RedisStream.name();
        for entry in entries {
            if let Some(user_id) = entry.get::<i64>("user") {
                self.inner
                    .store
                    .store_accepted(name, user_id, voucher_id)
                    .await?;
            }
        }
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        self.inner
            .redis
            .ack_and_delete(&keys.orders, GROUP, &ids)
            .await?;
        Ok(())
    }
}
