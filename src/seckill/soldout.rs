//! The sold-out flags in Redis: once any instance sees a voucher's stock at
//! 0, every instance refuses it without touching Postgres.
//!
//! A flag speaks for one state of one voucher and for nothing else. Its key
//! lives under the database's namespace (see `startup`), so a flag written
//! for a voucher of another database, or of this one before a reset, is
//! never read. It carries the voucher's epoch (`Voucher::epoch`: the
//! initial stock plus the units given back), which only grows and which
//! every restock and every cancelled or expired order raises; a flag whose
//! epoch is not the voucher's current one is ignored. A restock or a
//! returned unit therefore reopens the sale on every instance by itself,
//! as soon as each one has read the voucher again, even if Redis could not
//! be told; the instance that returned a unit also writes "open" at the new
//! epoch, which the others read at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redis::{self, Script};

use crate::domain::{StockLevel, Voucher, VoucherId};
use crate::kv::{Keys, Kv, KvError};
use crate::telemetry::Chain;

/// Longest life of a sold-out flag whose sale ends later than that; after
/// it a single purchase attempt reads Postgres and sets the flag again.
const MAX_FLAG_LIFE: Duration = Duration::from_secs(86_400);
/// How long this instance trusts a "sold out" it read from Redis. A flood
/// on a sold-out voucher then costs Redis one read per voucher per period
/// instead of one per request. Keyed by epoch, so a restock seen here ends
/// it at once.
const TRUST_SOLD_OUT: Duration = Duration::from_millis(200);
/// How long this instance trusts an "open" it read. An open flag only lets
/// a purchase on to its lock and its batch, where Postgres decides; trusting
/// it a little costs at most this long of purchases that reach Postgres
/// after the sell-out, and saves a Redis round trip on every purchase of a
/// sale in full swing.
const TRUST_OPEN: Duration = Duration::from_millis(100);

pub(super) struct SoldOutFlags {
    redis: Kv,
    keys: Keys,
    mark: Script,
    /// What this instance recently saw of each (voucher, epoch): `true`
    /// sold out, `false` open, each trusted for its own time. Concurrent
    /// misses share one Redis read (a crowd's first wave asks once).
    seen: moka::future::Cache<(VoucherId, i64), bool>,
}

/// How long a flag seen here is trusted, by what it said.
struct Trust;

impl moka::Expiry<(VoucherId, i64), bool> for Trust {
    fn expire_after_create(
        &self,
        _: &(VoucherId, i64),
        sold_out: &bool,
        _: Instant,
    ) -> Option<Duration> {
        Some(trust(*sold_out))
    }

    fn expire_after_update(
        &self,
        _: &(VoucherId, i64),
        sold_out: &bool,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(trust(*sold_out))
    }
}

/// How long this instance trusts what it read of a flag, by what it said
/// (read again, the flag is trusted anew by what it says then).
fn trust(sold_out: bool) -> Duration {
    if sold_out {
        TRUST_SOLD_OUT
    } else {
        TRUST_OPEN
    }
}

/// Whether a flag holding `epoch` and `sold_out` (either missing when
/// there is no flag) says the voucher at `current` (its epoch as read
/// here) is sold out: a flag of another epoch says nothing.
fn says_sold_out(epoch: Option<i64>, sold_out: Option<u8>, current: i64) -> bool {
    sold_out == Some(1) && epoch == Some(current)
}

/// How long a flag written at `now` lives, for a sale that ends at
/// `end_time`: until it ends, at least a second and at most
/// `MAX_FLAG_LIFE`.
fn flag_life(end_time: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    let left = (end_time - now).to_std().unwrap_or_default();
    left.clamp(Duration::from_secs(1), MAX_FLAG_LIFE)
}

impl SoldOutFlags {
    pub(super) fn new(redis: Kv, prefix: String) -> Self {
        Self {
            redis,
            keys: Keys::new(prefix),
            mark: Script::new(include_str!("../../lua/soldout_mark.lua")),
            seen: moka::future::Cache::builder()
                .max_capacity(10_000)
                .expire_after(Trust)
                .build(),
        }
    }

    fn key(&self, voucher_id: VoucherId) -> String {
        self.keys.sold_out(voucher_id)
    }

    /// Whether the voucher, in the state `voucher` describes, is flagged
    /// sold out.
    pub(super) async fn is_sold_out(&self, voucher: &Voucher) -> Result<bool, Arc<KvError>> {
        let here = (voucher.id, voucher.level.epoch());
        if let Some(sold_out) = self.seen.get(&here).await {
            return Ok(sold_out);
        }
        self.seen
            .try_get_with(here, async {
                let (epoch, sold_out): (Option<i64>, Option<u8>) = self
                    .redis
                    .query(
                        redis::cmd("HMGET")
                            .arg(self.key(voucher.id))
                            .arg("epoch")
                            .arg("sold_out"),
                    )
                    .await?;
                Ok(says_sold_out(epoch, sold_out, voucher.level.epoch()))
            })
            .await
    }

    /// Whether this instance knows, without asking, that the voucher in
    /// this state is sold out.
    pub(super) async fn known_sold_out(&self, voucher: &Voucher) -> bool {
        self.seen.get(&(voucher.id, voucher.level.epoch())).await == Some(true)
    }

    /// Remembers that this instance saw the voucher sold out at `epoch`
    /// (a batch of its own left no unit), before anyone is told: purchases
    /// that arrive from then on are refused here, without a lock.
    pub(super) async fn saw_sold_out(&self, voucher_id: VoucherId, epoch: i64) {
        self.seen.insert((voucher_id, epoch), true).await;
    }

    /// Publishes the stock state of `voucher_id` (whose sale ends at
    /// `end_time`) seen in Postgres. A failure only costs speed (later
    /// requests go to Postgres) or, for a returned unit, up to the voucher
    /// cache's lifetime before other instances see it for sale; so it is
    /// logged, not returned.
    pub(super) async fn publish(
        &self,
        voucher_id: VoucherId,
        end_time: DateTime<Utc>,
        level: StockLevel,
        now: DateTime<Utc>,
    ) {
        // This instance knows first: no need to ask Redis again.
        self.seen
            .insert((voucher_id, level.epoch()), level.stock == 0)
            .await;
        let ttl = flag_life(end_time, now);
        let written: Result<i64, KvError> = self
            .redis
            .invoke(
                self.mark
                    .key(self.key(voucher_id))
                    .arg(level.epoch())
                    .arg(u8::from(level.stock == 0))
                    .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            )
            .await;
        if let Err(error) = written {
            tracing::warn!(%voucher_id, error = %Chain(&error), "could not update the sold-out flag");
        }
    }
}

#[cfg(test)]
mod tests {
    use moka::Expiry;

    use super::*;

    fn level(stock: i32, initial_stock: i32, returned: i64) -> StockLevel {
        StockLevel {
            stock,
            initial_stock,
            returned,
        }
    }

    /// Flags whose Redis is nowhere: a test passes only if they answer
    /// from what this instance saw.
    fn flags_without_redis() -> SoldOutFlags {
        let nowhere = redis::Client::open("redis://127.0.0.1:1").unwrap();
        SoldOutFlags::new(Kv::new(nowhere, Duration::from_millis(100)), "test".into())
    }

    #[test]
    fn an_open_read_is_trusted_less_than_a_sold_out_one_and_a_new_read_by_what_it_says() {
        let key = (VoucherId::new(1).unwrap(), 100);
        let now = Instant::now();
        let open = Trust.expire_after_create(&key, &false, now).unwrap();
        let sold_out = Trust.expire_after_create(&key, &true, now).unwrap();
        assert!(open < sold_out, "open {open:?}, sold out {sold_out:?}");
        assert!(sold_out <= Duration::from_secs(1), "{sold_out:?}");
        // Read again: the flag is trusted anew for what it says now, not
        // for what the earlier read had left.
        let left = Some(Duration::from_millis(1));
        assert_eq!(
            Trust.expire_after_update(&key, &true, now, left),
            Some(sold_out)
        );
        assert_eq!(
            Trust.expire_after_update(&key, &false, now, Some(sold_out)),
            Some(open)
        );
    }

    #[test]
    fn a_flag_says_sold_out_only_for_the_epoch_it_was_written_at() {
        let cases = [
            (Some(100), Some(1), 100, true),
            (Some(100), Some(0), 100, false),
            // A restock or a returned unit since: the flag is stale.
            (Some(100), Some(1), 101, false),
            // An instance that read the voucher before the others did.
            (Some(101), Some(1), 100, false),
            (None, None, 100, false),
            (None, Some(1), 100, false),
            (Some(100), None, 100, false),
        ];
        for (epoch, sold_out, current, expected) in cases {
            assert_eq!(
                says_sold_out(epoch, sold_out, current),
                expected,
                "flag {epoch:?}/{sold_out:?}, voucher at {current}"
            );
        }
    }

    #[test]
    fn a_flag_lives_until_the_sale_ends_but_at_least_a_second_and_at_most_a_day() {
        let now = Utc::now();
        let minutes = chrono::Duration::minutes;
        assert_eq!(flag_life(now + minutes(10), now), Duration::from_secs(600));
        assert_eq!(flag_life(now, now), Duration::from_secs(1));
        assert_eq!(flag_life(now - minutes(10), now), Duration::from_secs(1));
        assert_eq!(flag_life(now + minutes(60 * 24 * 30), now), MAX_FLAG_LIFE);
    }

    #[tokio::test]
    async fn a_sold_out_seen_here_is_answered_from_memory_until_a_restock_or_a_return() {
        let flags = flags_without_redis();
        let sold = Voucher::on_sale(7, level(0, 10, 2));
        assert!(!flags.known_sold_out(&sold).await);
        flags.saw_sold_out(sold.id, sold.level.epoch()).await;
        assert!(flags.known_sold_out(&sold).await);
        assert!(flags.is_sold_out(&sold).await.unwrap());
        // Another voucher, and this one restocked or with a unit given
        // back, are not known sold out.
        let other = Voucher::on_sale(8, level(0, 10, 2));
        let restocked = Voucher::on_sale(7, level(5, 15, 2));
        let returned = Voucher::on_sale(7, level(1, 10, 3));
        for voucher in [&other, &restocked, &returned] {
            assert!(!flags.known_sold_out(voucher).await, "{:?}", voucher.level);
        }
    }
}
