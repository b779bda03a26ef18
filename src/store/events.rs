//! Order events (the `order_events` outbox that the migration's triggers
//! fill in each change's transaction): the feed in commit order, and the
//! webhooks' cursor in it (its lease, acknowledgements and failures), the
//! events held back after a failure, and their retry.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};

use uuid::Uuid;

use super::{Result, Store};
use crate::domain::{EventId, EventType, Order, OrderEvent, OrderId, RefundDue, UserId, VoucherId};

/// The columns of an event (`e`) and its user's subject (`u`).
macro_rules! event_columns {
    () => {
        "e.id, e.tx::text::bigint AS tx, e.type, e.created_at, e.sequence, e.order_id,
         e.user_id, e.voucher_id, e.quantity, e.order_created_at, e.status, e.pay_by,
         e.paid_at, e.payment_id, e.amount_cents, u.subject AS user_ref"
    };
}

/// The feed, for its readers and the webhooks alike: events past the
/// cursor `($1, $2)`, up to `($4, $5)` (a failing batch's last event; the
/// end of the feed otherwise), whose transaction is older than every one
/// still running, so that none can commit behind the cursor later (see the
/// migration's note on `tx`); each with whether its order has an event
/// held back by the webhooks (failed, or waiting for its retry), which
/// they must not overtake.
const FEED: &str = concat!(
    "SELECT ",
    event_columns!(),
    ", EXISTS (SELECT 1 FROM webhook_failed f WHERE f.order_id = e.order_id) AS held
     FROM order_events e LEFT JOIN user_refs u ON u.user_id = e.user_id
     WHERE (e.tx, e.id) > ($1::text::xid8, $2)
       AND (e.tx, e.id) <= ($4::text::xid8, $5)
       AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY e.tx, e.id
     LIMIT $3"
);

/// The feed's end, as [`FEED`]'s upper bound: past every event.
const FEED_END: (&str, i64) = ("18446744073709551615", i64::MAX);

/// Whether the row `f` of `webhook_failed` is listed as failed: not put
/// back, or put back behind an earlier event of its order that was not
/// (it goes out only after that one).
macro_rules! listed_as_failed {
    () => {
        "(NOT f.retry OR EXISTS (
             SELECT 1 FROM webhook_failed g
             WHERE g.order_id = f.order_id AND NOT g.retry AND (g.tx, g.id) < (f.tx, f.id)))"
    };
}

/// After a batch for holder `$1`: an acknowledged batch of the feed
/// (`$9`) moves the cursor forward to `($2, $3)` (never back) and clears
/// the feed's failures; a batch of events put back (not `$9`) clears
/// theirs. The events `$4` (tx), `$5` (id), `$6` (order) are held back
/// behind their orders' earlier held events (waiting for a retry if all
/// of those do); the retried events `$7`, `$8` that were delivered are
/// forgotten; the events `$10`, `$11`, `$12` of a batch given up are failed
/// (error `$13`). Nothing changes unless `$1` holds the lease, in one
/// statement: an instance that lost the lease meanwhile cannot fail events
/// that its successor delivered.
const ADVANCE: &str = "
WITH cursor AS (
    UPDATE webhook_cursor
    SET after_tx = greatest(after_tx, $2::text::xid8),
        after_id = CASE WHEN (after_tx, after_id) < ($2::text::xid8, $3) THEN $3 ELSE after_id END,
        failures = CASE WHEN $9 THEN 0 ELSE failures END,
        first_failure_at = CASE WHEN $9 THEN NULL ELSE first_failure_at END,
        next_attempt_at = CASE WHEN $9 THEN now() ELSE next_attempt_at END,
        failing_upto_tx = CASE WHEN $9 THEN NULL ELSE failing_upto_tx END,
        failing_upto_id = CASE WHEN $9 THEN NULL ELSE failing_upto_id END,
        retry_failures = CASE WHEN $9 THEN retry_failures ELSE 0 END,
        retry_first_failure_at = CASE WHEN $9 THEN retry_first_failure_at END,
        retry_next_attempt_at = CASE WHEN $9 THEN retry_next_attempt_at ELSE now() END,
        last_error = NULL
    WHERE holder = $1
    RETURNING 1
), held AS (
    INSERT INTO webhook_failed (tx, id, order_id, retry, last_error)
    SELECT b.tx::text::xid8, b.id, b.order_id, bool_and(f.retry), 'an earlier event of its order is held back'
    FROM unnest($4::bigint[], $5::bigint[], $6::bigint[]) AS b(tx, id, order_id)
    JOIN webhook_failed f ON f.order_id = b.order_id
    WHERE EXISTS (SELECT 1 FROM cursor)
    GROUP BY b.tx, b.id, b.order_id
    ON CONFLICT DO NOTHING
), done AS (
    DELETE FROM webhook_failed f
    USING unnest($7::bigint[], $8::bigint[]) AS d(tx, id)
    WHERE f.tx = d.tx::text::xid8 AND f.id = d.id AND EXISTS (SELECT 1 FROM cursor)
), failed AS (
    INSERT INTO webhook_failed (tx, id, order_id, retry, last_error)
    SELECT b.tx::text::xid8, b.id, b.order_id, false, left($13, 300)
    FROM unnest($10::bigint[], $11::bigint[], $12::bigint[]) AS b(tx, id, order_id)
    WHERE EXISTS (SELECT 1 FROM cursor)
    ON CONFLICT (tx, id) DO UPDATE
    SET retry = false, failed_at = now(), last_error = EXCLUDED.last_error
)
SELECT count(*) FROM cursor";

/// A failed delivery for holder `$1`, of the feed's batch ending at `($4,
/// $5)` (`$6`) or of a batch put back (not `$6`): that kind's failures
/// counted, its next attempt in `$2` ms, the feed's failing batch kept as
/// it is until it is acknowledged or failed. Its failures in a row, and
/// whether its first failure is `$7` seconds old (time to give up): both
/// by Postgres's clock, which wrote the first.
const FAILED_ATTEMPT: &str = "
UPDATE webhook_cursor
SET failures = failures + $6::int,
    first_failure_at = CASE WHEN $6 THEN coalesce(first_failure_at, now()) ELSE first_failure_at END,
    next_attempt_at = CASE WHEN $6 THEN now() + make_interval(secs => $2::double precision / 1000)
                           ELSE next_attempt_at END,
    failing_upto_tx = CASE WHEN $6 THEN coalesce(failing_upto_tx, $4::text::xid8) ELSE failing_upto_tx END,
    failing_upto_id = CASE WHEN $6 AND failing_upto_tx IS NULL THEN $5 ELSE failing_upto_id END,
    retry_failures = retry_failures + (NOT $6)::int,
    retry_first_failure_at = CASE WHEN $6 THEN retry_first_failure_at
                                  ELSE coalesce(retry_first_failure_at, now()) END,
    retry_next_attempt_at = CASE WHEN $6 THEN retry_next_attempt_at
                                 ELSE now() + make_interval(secs => $2::double precision / 1000) END,
    last_error = left($3, 300)
WHERE holder = $1
RETURNING CASE WHEN $6 THEN failures ELSE retry_failures END AS failures,
          now() - CASE WHEN $6 THEN first_failure_at ELSE retry_first_failure_at END
              >= make_interval(secs => $7::double precision) AS given_up";

impl FromRow<'_, PgRow> for OrderEvent {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        let kind: String = row.try_get("type")?;
        let kind = kind
            .parse::<EventType>()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        let payment_id: Option<String> = row.try_get("payment_id")?;
        let amount_cents: Option<i64> = row.try_get("amount_cents")?;
        Ok(Self {
            id: event_id(row, "tx", "id")?,
            kind,
            created_at: row.try_get("created_at")?,
            sequence: row.try_get("sequence")?,
            order: Order {
                id: row.try_get("order_id")?,
                user_id: row.try_get("user_id")?,
                voucher_id: row.try_get("voucher_id")?,
                quantity: row.try_get("quantity")?,
                created_at: row.try_get("order_created_at")?,
                status: row.try_get("status")?,
                pay_by: row.try_get("pay_by")?,
                paid_at: row.try_get("paid_at")?,
                user_ref: row.try_get("user_ref")?,
            },
            refund: payment_id
                .zip(amount_cents)
                .map(|(payment_id, amount_cents)| RefundDue {
                    payment_id,
                    amount_cents,
                }),
        })
    }
}

/// The webhooks' place in the feed, as the lease's holder read it.
#[derive(Debug, Clone, Copy)]
pub struct WebhookCursor {
    /// Everything up to here was acknowledged (or held back).
    pub after: EventId,
    /// The feed's batches: failed attempts in a row at its head, and when
    /// the next attempt is due.
    pub feed: Attempts,
    /// The last event of the batch that is failing: it is retried as it
    /// was, no event added.
    pub failing_upto: Option<EventId>,
    /// Held-back events put back for a retry, on a clock of their own;
    /// `None` when there are none. They go before the feed.
    pub retries: Option<Attempts>,
}

/// One kind of batch's failed attempts in a row, and how long until the
/// next attempt is due (by Postgres's clock, which set it).
#[derive(Debug, Clone, Copy)]
pub struct Attempts {
    pub failures: i32,
    pub due_in: Duration,
}

impl Attempts {
    fn from_row(row: &PgRow, failures: &str, due_in_ms: &str) -> sqlx::Result<Self> {
        let due_in_ms: i64 = row.try_get(due_in_ms)?;
        Ok(Self {
            failures: row.try_get(failures)?,
            due_in: Duration::from_millis(due_in_ms.max(0).unsigned_abs()),
        })
    }
}

impl FromRow<'_, PgRow> for WebhookCursor {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            after: event_id(row, "after_tx", "after_id")?,
            feed: Attempts::from_row(row, "failures", "due_in_ms")?,
            failing_upto: match row.try_get::<Option<i64>, _>("failing_upto_tx")? {
                Some(_) => Some(event_id(row, "failing_upto_tx", "failing_upto_id")?),
                None => None,
            },
            retries: match row.try_get("retries")? {
                true => Some(Attempts::from_row(
                    row,
                    "retry_failures",
                    "retry_due_in_ms",
                )?),
                false => None,
            },
        })
    }
}

/// Which batch a delivery sent: the feed's, up to an event (the cursor
/// moves there once it is acknowledged), or one of events put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOf {
    Feed { upto: EventId },
    PutBack,
}

/// How a batch ended, for [`Store::webhook_advance`]: its events held back
/// behind their orders' earlier held events, the events put back that it
/// delivered, or, given up, its events failed and why.
#[derive(Debug, Default)]
pub struct BatchEnd {
    pub held: Vec<(EventId, OrderId)>,
    pub retried: Vec<EventId>,
    pub failed: Vec<(EventId, OrderId)>,
    pub error: String,
}

impl BatchOf {
    /// The statements' `upto` and whether the batch is the feed's.
    fn bind(self) -> (EventId, bool) {
        match self {
            Self::Feed { upto } => (upto, true),
            Self::PutBack => (EventId::default(), false),
        }
    }
}

/// An event as the webhooks read the feed: `held` when an earlier event
/// of its order is held back.
pub struct FeedEvent {
    pub event: OrderEvent,
    pub held: bool,
}

/// The webhooks' backlog, for the metrics.
#[derive(Debug, Clone, Copy, Default, FromRow)]
pub struct Backlog {
    /// Seconds since the oldest event past the cursor was written; 0 when
    /// there is none.
    pub lag_seconds: f64,
    /// Events held back after a failure, not put back for a retry.
    pub failed: i64,
}

/// The event id a row holds in its columns `tx` and `id`.
fn event_id(row: &PgRow, tx: &str, id: &str) -> sqlx::Result<EventId> {
    Ok(EventId {
        tx: row.try_get(tx)?,
        row: row.try_get(id)?,
    })
}

/// Event ids and their orders, as arrays for a statement.
fn columns(events: &[(EventId, OrderId)]) -> (Vec<i64>, Vec<i64>, Vec<OrderId>) {
    (
        events.iter().map(|(e, _)| e.tx).collect(),
        events.iter().map(|(e, _)| e.row).collect(),
        events.iter().map(|(_, o)| *o).collect(),
    )
}

/// A change of who holds a live order, as the feed tells it: an order
/// made (`closed` false), or cancelled or expired (`closed` true).
#[derive(Debug, Clone, Copy)]
pub struct HolderChange {
    pub at: EventId,
    pub order_id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    pub closed: bool,
}

impl FromRow<'_, PgRow> for HolderChange {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            at: event_id(row, "tx", "id")?,
            order_id: row.try_get("order_id")?,
            user_id: row.try_get("user_id")?,
            voucher_id: row.try_get("voucher_id")?,
            closed: row.try_get("closed")?,
        })
    }
}

impl Store {
    /// Up to `limit` events after `after` (from the oldest kept when
    /// `None`), in commit order.
    pub async fn events_after(
        &self,
        after: Option<EventId>,
        limit: i64,
    ) -> Result<Vec<OrderEvent>> {
        let feed = self.feed(after.unwrap_or_default(), None, limit).await?;
        Ok(feed.into_iter().map(|e| e.event).collect())
    }

    /// The feed's place now: every event after it is of a transaction
    /// still running or yet to begin (the feed's horizon, so that none
    /// that commits later is behind it).
    pub async fn feed_now(&self) -> Result<EventId> {
        const SQL: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint";
        let horizon: i64 = self.db.scalar(SQL).await?;
        Ok(EventId {
            tx: horizon - 1,
            row: i64::MAX,
        })
    }

    /// Up to `limit` orders made, cancelled or expired after `after`, in
    /// commit order (the feed's horizon, without the orders' bodies).
    pub async fn holder_changes(&self, after: EventId, limit: i64) -> Result<Vec<HolderChange>> {
        const SQL: &str = "
            SELECT e.tx::text::bigint AS tx, e.id, e.order_id, e.user_id, e.voucher_id,
                   e.type <> 'order.created' AS closed
            FROM order_events e
            WHERE (e.tx, e.id) > ($1::text::xid8, $2)
              AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
              AND e.type IN ('order.created', 'order.cancelled', 'order.expired')
            ORDER BY e.tx, e.id
            LIMIT $3";
        self.db
            .run(|c, persistent| {
                Box::pin(
                    sqlx::query_as(SQL)
                        .bind(after.tx.to_string())
                        .bind(after.row)
                        .bind(limit)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await
    }

    /// Takes (or keeps) the webhooks' lease for `holder`, for `lease`; the
    /// cursor, or `None` while another holder's lease runs.
    pub async fn take_webhook_lease(
        &self,
        holder: Uuid,
        lease: Duration,
    ) -> Result<Option<WebhookCursor>> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(
                        "UPDATE webhook_cursor
                         SET holder = $1,
                             lease_until = now() + make_interval(secs => $2::double precision / 1000)
                         WHERE holder = $1 OR holder IS NULL OR lease_until < now()
                         RETURNING after_tx::text::bigint AS after_tx, after_id,
                                   failing_upto_tx::text::bigint AS failing_upto_tx, failing_upto_id,
                                   failures, retry_failures,
                                   (extract(epoch FROM next_attempt_at - now()) * 1000)::bigint
                                       AS due_in_ms,
                                   (extract(epoch FROM retry_next_attempt_at - now()) * 1000)::bigint
                                       AS retry_due_in_ms,
                                   EXISTS (SELECT 1 FROM webhook_failed WHERE retry) AS retries",
                    )
                    .bind(holder)
                    .bind(lease_ms)
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await
    }

    /// Gives `holder`'s lease back (its instance is stopping): another
    /// instance sends at once, not when the lease would have run out.
    pub async fn release_webhook_lease(&self, holder: Uuid) -> Result<()> {
        self.db
            .execute(
                sqlx::query(
                    "UPDATE webhook_cursor SET holder = NULL, lease_until = 'epoch'
                     WHERE holder = $1",
                )
                .bind(holder),
            )
            .await
            .map(drop)
    }

    /// Up to `limit` events of the feed after `after` (and up to `upto`
    /// when given), each with whether the webhooks hold its order back.
    pub async fn feed(
        &self,
        after: EventId,
        upto: Option<EventId>,
        limit: i64,
    ) -> Result<Vec<FeedEvent>> {
        let upto = upto.map_or((FEED_END.0.to_owned(), FEED_END.1), |e| {
            (e.tx.to_string(), e.row)
        });
        let rows: Vec<(OrderEvent, bool)> = self
            .db
            .run(move |c, persistent| {
                let upto = upto.clone();
                Box::pin(async move {
                    let rows = sqlx::query(FEED)
                        .bind(after.tx.to_string())
                        .bind(after.row)
                        .bind(limit)
                        .bind(upto.0)
                        .bind(upto.1)
                        .persistent(persistent)
                        .fetch_all(c)
                        .await?;
                    rows.iter()
                        .map(|row| Ok((OrderEvent::from_row(row)?, row.try_get("held")?)))
                        .collect::<sqlx::Result<Vec<_>>>()
                })
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(event, held)| FeedEvent { event, held })
            .collect())
    }

    /// Up to `limit` held-back events put back for a retry, oldest first.
    pub async fn webhook_retries(&self, limit: i64) -> Result<Vec<OrderEvent>> {
        self.failed_where(true, limit).await
    }

    /// Up to `limit` events whose delivery failed, oldest first: with
    /// them, those put back that wait behind an earlier event of their
    /// order that failed again (they go out only after it, once it is put
    /// back too).
    pub async fn failed_events(&self, limit: i64) -> Result<Vec<OrderEvent>> {
        self.failed_where(false, limit).await
    }

    /// Up to `limit` events of `webhook_failed`, oldest first: those put
    /// back for a retry (`retry`), or the failed ones. A retry never passes
    /// an earlier event of its order that failed again (put back in an
    /// earlier batch that was given up): within an order, an event goes
    /// out only after every earlier one; it waits for the next retry, and
    /// is listed as failed meanwhile.
    async fn failed_where(&self, retry: bool, limit: i64) -> Result<Vec<OrderEvent>> {
        const SQL: &str = concat!(
            "SELECT ",
            event_columns!(),
            " FROM webhook_failed f
             JOIN order_events e ON e.tx = f.tx AND e.id = f.id
             LEFT JOIN user_refs u ON u.user_id = e.user_id
             WHERE ",
            listed_as_failed!(),
            " <> $2
             ORDER BY f.tx, f.id LIMIT $1"
        );
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(SQL)
                        .bind(limit)
                        .bind(retry)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await
    }

    /// Ends a batch as `end` says: acknowledged (or with nothing to send),
    /// then for the feed's the cursor moves to its end, and that kind's
    /// failures are cleared; or given up after its retry period, its
    /// events failed (listed, and sent again only after a retry), the
    /// cursor past a batch of the feed, the next batch tried at once.
    /// `false` when `holder` had lost the lease: nothing changed, and the
    /// next holder sends the batch again.
    pub async fn webhook_advance(
        &self,
        holder: Uuid,
        batch: BatchOf,
        end: BatchEnd,
    ) -> Result<bool> {
        let (upto, of_feed) = batch.bind();
        let (held_tx, held_id, held_order) = columns(&end.held);
        let retried_tx: Vec<i64> = end.retried.iter().map(|e| e.tx).collect();
        let retried_id: Vec<i64> = end.retried.iter().map(|e| e.row).collect();
        let (failed_tx, failed_id, failed_order) = columns(&end.failed);
        let error = end.error;
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_scalar(ADVANCE)
                        .bind(holder)
                        .bind(upto.tx.to_string())
                        .bind(upto.row)
                        .bind(held_tx)
                        .bind(held_id)
                        .bind(held_order)
                        .bind(retried_tx)
                        .bind(retried_id)
                        .bind(of_feed)
                        .bind(failed_tx)
                        .bind(failed_id)
                        .bind(failed_order)
                        .bind(error)
                        .persistent(persistent)
                        .fetch_one(c),
                )
            })
            .await
            .map(|n: i64| n > 0)
    }

    /// Records a failed delivery of `batch`: nobody sends that kind for
    /// `retry_in`, and the feed's failing batch is kept as it is until it
    /// is acknowledged or failed. That kind's failures in a row, and
    /// whether its first is `retry_for` old (time to give up); `None` when
    /// `holder` had lost the lease.
    pub async fn webhook_failed_attempt(
        &self,
        holder: Uuid,
        batch: BatchOf,
        retry_in: Duration,
        retry_for: Duration,
        error: String,
    ) -> Result<Option<(i32, bool)>> {
        let retry_ms = i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX);
        let (upto, of_feed) = batch.bind();
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(FAILED_ATTEMPT)
                        .bind(holder)
                        .bind(retry_ms)
                        .bind(error)
                        .bind(upto.tx.to_string())
                        .bind(upto.row)
                        .bind(of_feed)
                        .bind(retry_for.as_secs_f64())
                        .persistent(persistent)
                        .fetch_optional(c),
                )
            })
            .await
    }

    /// Puts every failed event back to be delivered, before the feed and
    /// oldest first; how many (those [`Self::failed_events`] listed).
    /// They go out at once, with a retry period of their own.
    pub async fn retry_failed_events(&self) -> Result<u64> {
        const SQL: &str = concat!(
            "WITH put AS (UPDATE webhook_failed f SET retry = true WHERE ",
            listed_as_failed!(),
            " RETURNING 1
             ), fresh AS (
                 UPDATE webhook_cursor
                 SET retry_failures = 0, retry_first_failure_at = NULL,
                     retry_next_attempt_at = now()
                 WHERE EXISTS (SELECT 1 FROM put)
             )
             SELECT count(*) FROM put"
        );
        let put: i64 = self.db.scalar(SQL).await?;
        Ok(put.unsigned_abs())
    }

    /// Deletes up to `limit` of the oldest events, of those older than
    /// `days`: acknowledged ones (up to the webhooks' cursor, not held
    /// back), or any when `acknowledged_only` is false (no webhooks).
    /// How many.
    pub async fn delete_old_events(
        &self,
        days: i32,
        acknowledged_only: bool,
        limit: i64,
    ) -> Result<u64> {
        self.db
            .run(move |c, _| {
                Box::pin(async move {
                    sqlx::query(
                        "DELETE FROM order_events d USING (
                            SELECT e.tx, e.id FROM order_events e, webhook_cursor w
                            WHERE (NOT $2 OR (e.tx, e.id) <= (w.after_tx, w.after_id))
                              AND NOT EXISTS (SELECT 1 FROM webhook_failed f
                                              WHERE f.tx = e.tx AND f.id = e.id)
                            ORDER BY e.tx, e.id LIMIT $3
                         ) oldest
                         WHERE d.tx = oldest.tx AND d.id = oldest.id
                           AND d.created_at < now() - make_interval(days => $1)",
                    )
                    .bind(days)
                    .bind(acknowledged_only)
                    .bind(limit)
                    .persistent(false)
                    .execute(c)
                    .await
                    .map(|done| done.rows_affected())
                })
            })
            .await
    }

    /// How far the webhooks are behind, and how many events failed.
    pub async fn event_backlog(&self) -> Result<Backlog> {
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(concat!(
                        "SELECT coalesce((
                                    SELECT extract(epoch FROM now() - e.created_at)::float8
                                    FROM order_events e, webhook_cursor w
                                    WHERE (e.tx, e.id) > (w.after_tx, w.after_id)
                                    ORDER BY e.tx, e.id LIMIT 1), 0) AS lag_seconds,
                                (SELECT count(*) FROM webhook_failed f WHERE ",
                        listed_as_failed!(),
                        ") AS failed"
                    ))
                    .persistent(persistent)
                    .fetch_one(c),
                )
            })
            .await
    }
}
