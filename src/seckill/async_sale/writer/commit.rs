//! The writer's second stage: an accepted order's stream entry parsed,
//! stored by group commit's statement (`batch::sell_batch`) in rounds of
//! distinct users, the orders Postgres refused reported, and every entry
//! acknowledged and deleted only then.

use redis::streams::StreamId;

use super::super::{entry_units, AsyncSales, SaleKeys, GROUP};
use crate::domain::{OrderId, Quantity, UserId, VoucherId};
use crate::kv::KvError;
use crate::seckill::batch::{raise_id_counter, sell_batch};
use crate::seckill::metric;
use crate::store::{Sale, SaleRequest, StoreError};
use crate::telemetry::Chain;

/// An accepted order as the stream holds it.
pub(super) struct Entry {
    stream_id: String,
    order_id: OrderId,
    user_id: UserId,
    quantity: Quantity,
    at_ms: i64,
}

/// Why Postgres refused an order Redis accepted (reported in the sale's
/// `unstored` hash and the `seckill_async_unstored_total` metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The user holds another live order for the voucher.
    AlreadyPurchased,
    SoldOut,
    /// The order id was taken: the id counter was lost.
    IdTaken,
    Fenced,
}

impl Refusal {
    /// What an order's row says of it: `None` when it is stored under its
    /// own id (now, or by an earlier delivery of the same entry).
    fn of(order_id: OrderId, sale: Sale) -> Option<Self> {
        match sale {
            Sale::Sold => None,
            Sale::Held(id) if id == order_id => None,
            Sale::Held(_) => Some(Self::AlreadyPurchased),
            // Postgres had fewer units left than Redis sold: as sold out.
            Sale::SoldOut | Sale::Short(_) => Some(Self::SoldOut),
            Sale::IdTaken => Some(Self::IdTaken),
            Sale::Fenced => Some(Self::Fenced),
            // Not asked of a stream's entries (no bound is passed).
            Sale::TooMany => Some(Self::AlreadyPurchased),
        }
    }

    const fn code(self) -> &'static str {
        match self {
            Self::AlreadyPurchased => "already_purchased",
            Self::SoldOut => "sold_out",
            Self::IdTaken => "id_taken",
            Self::Fenced => "fenced",
        }
    }
}

/// The `reason` label of `seckill_async_unstored_total`.
pub const UNSTORED_REASONS: [&str; 4] = [
    Refusal::AlreadyPurchased.code(),
    Refusal::SoldOut.code(),
    Refusal::IdTaken.code(),
    Refusal::Fenced.code(),
];

/// Why a batch was not written: its entries stay pending with this
/// consumer and are tried again.
#[derive(Debug, thiserror::Error)]
pub(super) enum CommitError {
    #[error("storing the batch")]
    Postgres(#[from] StoreError),
    #[error("settling the batch in Redis")]
    Redis(#[from] KvError),
}

/// A stream entry as read: an accepted order, or an entry our script never
/// writes (reported and deleted, not written).
pub(super) type Parsed = Result<Entry, Malformed>;

/// The stream id of an entry whose fields are not an accepted order's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Malformed(String);

/// An entry's fields, each in its range.
pub(super) fn parse(id: &StreamId) -> Parsed {
    let number = |name: &str| id.get::<i64>(name);
    let fields = || {
        let order_id = OrderId::from_stored(number("order")?)?;
        let user_id = UserId::new(number("user")?)?;
        Some((order_id, user_id, entry_units(id)?, number("at")?))
    };
    match fields() {
        Some((order_id, user_id, quantity, at_ms)) => Ok(Entry {
            stream_id: id.id.clone(),
            order_id,
            user_id,
            quantity,
            at_ms,
        }),
        None => Err(Malformed(id.id.clone())),
    }
}

/// The entries in statements of distinct users, in order: the statement
/// takes one order per user, so a second order of one user (only possible
/// if Redis lost its buyers) goes in a later round, where it meets the
/// first.
fn by_distinct_users(entries: &[Entry]) -> Vec<Vec<&Entry>> {
    let mut rounds: Vec<Vec<&Entry>> = Vec::new();
    for entry in entries {
        match rounds
            .iter_mut()
            .find(|round| round.iter().all(|e| e.user_id != entry.user_id))
        {
            Some(round) => round.push(entry),
            None => rounds.push(vec![entry]),
        }
    }
    rounds
}

/// Writes `entries` to Postgres, reports the orders it refused, and then
/// acknowledges and deletes them all. An error leaves them pending with
/// this consumer, to be tried again.
pub(super) async fn commit(
    sales: &AsyncSales,
    voucher_id: VoucherId,
    keys: &SaleKeys,
    entries: Vec<Parsed>,
) -> Result<Books, CommitError> {
    let mut valid = Vec::with_capacity(entries.len());
    let mut malformed = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => valid.push(entry),
            Err(Malformed(stream_id)) => {
                tracing::error!(%stream_id, "a malformed entry in an async sale's stream");
                malformed.push(stream_id);
            }
        }
    }
    let refused = store(sales, voucher_id, &valid).await?;
    if !refused.is_empty() {
        report(sales, keys, &refused).await?;
    }
    let stream_ids: Vec<&str> = valid
        .iter()
        .map(|e| e.stream_id.as_str())
        .chain(malformed.iter().map(String::as_str))
        .collect();
    sales
        .inner
        .redis
        .ack_and_delete(&keys.orders, GROUP, &stream_ids)
        .await?;
    metrics::counter!(metric::ASYNC_WRITTEN).increment(valid.len() as u64);
    let differ = refused
        .iter()
        .any(|(_, r)| matches!(r, Refusal::AlreadyPurchased | Refusal::SoldOut));
    Ok(if differ { Books::Differ } else { Books::Agree })
}

/// Whether Redis's sale and Postgres's books agree, as a commit found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Books {
    Agree,
    /// Postgres refused an order Redis sold as sold out or as a second
    /// order of its user: Redis's stock or buyers are not Postgres's.
    Differ,
}

/// Stores `entries` in statements of distinct users; the orders Postgres
/// refused, and why.
async fn store(
    sales: &AsyncSales,
    voucher_id: VoucherId,
    entries: &[Entry],
) -> Result<Vec<(OrderId, Refusal)>, StoreError> {
    let inner = &sales.inner;
    let mut refused = Vec::new();
    for round in by_distinct_users(entries) {
        let requests: Vec<SaleRequest> = round
            .iter()
            .map(|e| SaleRequest {
                order_id: e.order_id,
                user_id: e.user_id,
                fence: None,
                quantity: e.quantity,
                // Created when Redis accepted it: the deadline counts from
                // the same clock as the sale's window.
                at: chrono::DateTime::from_timestamp_millis(e.at_ms)
                    .unwrap_or_else(|| inner.clock.now()),
            })
            .collect();
        metrics::histogram!(metric::ASYNC_BATCH_SIZE).record(requests.len() as f64);
        // Redis accepted these orders: Postgres stores them whatever the
        // voucher's bound on orders per user, which Redis's step did not
        // count (see the guide's abuse chapter).
        let sold = sell_batch(&inner.store, voucher_id, i32::MAX, &requests).await?;
        // Confirmed when committed: measured from the script's clock.
        let now_ms = inner.clock.now().timestamp_millis();
        for (entry, sale) in round.iter().zip(sold.sales) {
            match Refusal::of(entry.order_id, sale) {
                None => metrics::histogram!(metric::ASYNC_CONFIRM_SECONDS)
                    .record((now_ms - entry.at_ms).max(0) as f64 / 1000.0),
                Some(reason) => refused.push((entry.order_id, reason)),
            }
        }
    }
    // Ids taken already: the day's counter was lost (a Redis or a cluster
    // node that failed over without it); raised so that the next ids are
    // free. The orders accepted under taken ids are reported.
    if let Some((taken, _)) = refused.iter().find(|(_, r)| *r == Refusal::IdTaken) {
        let day = taken.drawn_at();
        if let Err(error) = raise_id_counter(&inner.store, &inner.ids, day, 0).await {
            tracing::warn!(error = %Chain(&error), "raising the order-id counter failed");
        }
    }
    Ok(refused)
}

/// Records the refused orders in the sale's `unstored` hash (and the
/// metric) and forgets their pending lookups.
async fn report(
    sales: &AsyncSales,
    keys: &SaleKeys,
    refused: &[(OrderId, Refusal)],
) -> Result<(), KvError> {
    let redis = &sales.inner.redis;
    let mut hash = redis::cmd("HSET");
    hash.arg(&keys.unstored);
    for (order_id, refusal) in refused {
        hash.arg(order_id).arg(refusal.code());
    }
    redis.query::<()>(&hash).await?;
    for (order_id, _) in refused {
        let forget = redis::cmd("HDEL")
            .arg(sales.pending_key(*order_id))
            .arg(order_id)
            .clone();
        // A lookup left behind would say `pending` for its two days: a
        // failure here fails the batch, written again (refused again) and
        // reported again.
        redis.query::<()>(&forget).await?;
    }
    // Told once all is recorded: a batch that failed above is written and
    // reported again, and would count its refusals twice.
    for (order_id, refusal) in refused {
        let reason = refusal.code();
        tracing::error!(%order_id, reason, "Postgres refused an order Redis accepted");
        metrics::counter!(metric::ASYNC_UNSTORED, "reason" => reason).increment(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: i64) -> OrderId {
        OrderId::from_stored(id).unwrap()
    }

    fn entry(order_id: i64, user_id: i64) -> Entry {
        Entry {
            stream_id: format!("{order_id}-0"),
            order_id: order(order_id),
            user_id: UserId::new(user_id).unwrap(),
            quantity: Quantity::ONE,
            at_ms: 0,
        }
    }

    #[test]
    fn an_order_stored_under_its_own_id_is_no_refusal_and_every_other_answer_is_one() {
        let seven = order(7);
        assert_eq!(Refusal::of(seven, Sale::Sold), None);
        assert_eq!(
            Refusal::of(seven, Sale::Held(seven)),
            None,
            "a redelivered entry"
        );
        assert_eq!(
            Refusal::of(seven, Sale::Held(order(8))),
            Some(Refusal::AlreadyPurchased)
        );
        assert_eq!(Refusal::of(seven, Sale::SoldOut), Some(Refusal::SoldOut));
        assert_eq!(Refusal::of(seven, Sale::IdTaken), Some(Refusal::IdTaken));
        assert_eq!(Refusal::of(seven, Sale::Fenced), Some(Refusal::Fenced));
        let codes: std::collections::HashSet<&str> = [
            Refusal::AlreadyPurchased,
            Refusal::SoldOut,
            Refusal::IdTaken,
            Refusal::Fenced,
        ]
        .iter()
        .map(|r| r.code())
        .collect();
        assert_eq!(codes.len(), 4, "each refusal has its own code");
    }

    #[test]
    fn a_second_order_of_a_user_waits_for_a_later_statement_and_order_is_kept() {
        let entries = [
            entry(1, 10),
            entry(2, 20),
            entry(3, 10),
            entry(4, 30),
            entry(5, 10),
        ];
        let rounds = by_distinct_users(&entries);
        let ids: Vec<Vec<i64>> = rounds
            .iter()
            .map(|r| r.iter().map(|e| e.order_id.get()).collect())
            .collect();
        assert_eq!(ids, vec![vec![1, 2, 4], vec![3], vec![5]]);
        assert!(by_distinct_users(&[]).is_empty());
    }

    #[test]
    fn a_malformed_entry_parses_to_its_stream_id_and_a_good_one_to_its_fields() {
        let good = StreamId {
            id: "1-0".into(),
            map: [
                ("order".to_owned(), redis::Value::BulkString(b"42".to_vec())),
                ("user".to_owned(), redis::Value::BulkString(b"7".to_vec())),
                ("at".to_owned(), redis::Value::BulkString(b"1000".to_vec())),
            ]
            .into_iter()
            .collect(),
        };
        let e = parse(&good).unwrap();
        assert_eq!(
            (e.order_id, e.user_id, e.at_ms),
            (order(42), UserId::new(7).unwrap(), 1000)
        );
        let bad = StreamId {
            id: "2-0".into(),
            map: [("order".to_owned(), redis::Value::BulkString(b"x".to_vec()))]
                .into_iter()
                .collect(),
        };
        assert_eq!(parse(&bad).err(), Some(Malformed("2-0".into())));
    }
}
