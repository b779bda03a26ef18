//! Reconciliation: Postgres is the truth. Redis's side of an async sale
//! (stock, buyers) is rebuilt from one Postgres snapshot plus the stream's
//! orders not yet written, while the sale is paused.
//!
//! The order of reads makes it exact without stopping the writers: the
//! sale is paused first (its hash deleted: the purchase script answers
//! "not loaded" and appends nothing), then the stream is read, then
//! Postgres. An entry the writers commit between the two reads is in the
//! stream read and in the snapshot, so it counts once, as stored.

use std::collections::{HashMap, HashSet};

use deadpool_redis::redis::{self, streams::StreamRangeReply};
use serde::Serialize;

use super::{writer, AsyncSales};
use crate::id::OrderId;
use crate::seckill::batch::raise_id_counter;
use crate::seckill::error::{Result, SeckillError};

/// Most field-value pairs in one HSET of the buyers.
const CHUNK: usize = 1_000;

/// What a reconciliation found and set.
#[derive(Debug, Clone, Serialize)]
pub struct Reconciled {
    pub voucher_id: i64,
    /// The stock Redis sells from now: Postgres's, less the accepted
    /// orders still waiting in the stream.
    pub stock: i64,
    /// Accepted orders not yet in Postgres (left in the stream for the
    /// writers).
    pub pending: usize,
    /// Users recorded as buyers (stored or pending).
    pub buyers: usize,
    /// Orders Redis accepted that Postgres refused, with the reason.
    pub unstored: Vec<Unstored>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unstored {
    pub order_id: String,
    pub reason: String,
}

impl AsyncSales {
    /// Rebuilds Redis's side of `voucher_id`'s async sale from Postgres and
    /// the unwritten stream entries, then reopens it.
    pub(in crate::seckill) async fn reconcile(&self, voucher_id: i64) -> Result<Reconciled> {
        let inner = &self.inner;
        let keys = self.keys(voucher_id);
        // Pause: purchases answer 503 until the sale hash is back.
        inner
            .redis
            .query::<()>(redis::cmd("DEL").arg(&keys.sale))
            .await?;
        let stream: StreamRangeReply = inner
            .redis
            .query(redis::cmd("XRANGE").arg(&keys.orders).arg("-").arg("+"))
            .await?;
        let accepted: Vec<(i64, i64)> = stream
            .ids
            .iter()
            .filter_map(|id| Some((id.get::<i64>("order")?, id.get::<i64>("user")?)))
            .collect();
        let snapshot = inner
            .store
            .sale_snapshot(
                voucher_id,
                accepted.iter().map(|(order, _)| *order).collect(),
            )
            .await?
            .ok_or(SeckillError::NotFound("voucher"))?;
        if snapshot.voucher.sale_mode != "async" {
            return Err(SeckillError::Invalid(
                "this voucher is sold synchronously: it has nothing in Redis to reconcile".into(),
            ));
        }
        let stored: HashSet<i64> = snapshot.stored.iter().copied().collect();
        let mut buyers: HashMap<i64, i64> = snapshot.buyers.iter().copied().collect();
        let mut pending = 0;
        for (order_id, user_id) in &accepted {
            if !stored.contains(order_id) && !buyers.contains_key(user_id) {
                buyers.insert(*user_id, *order_id);
                pending += 1;
            }
        }
        let stock = (i64::from(snapshot.voucher.stock) - pending).max(0);
        // A Redis that lost the sale lost the day's id counter too: it
        // would hand out ids that orders hold already. Raised past those
        // stored and those accepted before the sale reopens.
        let today = inner.clock.now();
        let day = crate::id::day_range(today);
        let accepted_today = accepted
            .iter()
            .filter(|(order, _)| day.as_ref().is_some_and(|d| d.contains(order)))
            .filter_map(|(order, _)| OrderId::from_stored(*order))
            .map(OrderId::sequence)
            .max()
            .unwrap_or(0);
        raise_id_counter(&inner.store, &inner.ids, today, accepted_today).await?;

        inner
            .redis
            .query::<()>(redis::cmd("DEL").arg(&keys.buyers))
            .await?;
        let pairs: Vec<(i64, i64)> = buyers.into_iter().collect();
        for chunk in pairs.chunks(CHUNK) {
            let mut write = redis::cmd("HSET");
            write.arg(&keys.buyers);
            for (user_id, order_id) in chunk {
                write.arg(user_id).arg(order_id);
            }
            inner.redis.query::<()>(&write).await?;
        }
        if !writer::ensure_group(self, &keys).await {
            return Err(SeckillError::redis_unavailable(
                "cannot create the sale's consumer group",
            ));
        }
        let voucher = &snapshot.voucher;
        // Never opens early, never sells late: the window to the millisecond
        // inside the microsecond one.
        let begin_ms = (voucher.begin_time.timestamp_micros() + 999).div_euclid(1000);
        let end_ms = voucher.end_time.timestamp_micros().div_euclid(1000);
        let mut open = redis::cmd("HSET");
        open.arg(&keys.sale)
            .arg("stock")
            .arg(stock)
            .arg("begin_ms")
            .arg(begin_ms)
            .arg("end_ms")
            .arg(end_ms);
        inner.redis.query::<()>(&open).await?;

        let unstored: HashMap<String, String> = inner
            .redis
            .query(redis::cmd("HGETALL").arg(&keys.unstored))
            .await?;
        let mut unstored: Vec<Unstored> = unstored
            .into_iter()
            .map(|(order_id, reason)| Unstored { order_id, reason })
            .collect();
        unstored.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        metrics::counter!("seckill_async_reconciliations_total").increment(1);
        Ok(Reconciled {
            voucher_id,
            stock,
            pending: usize::try_from(pending).unwrap_or(0),
            buyers: pairs.len(),
            unstored,
        })
    }
}
