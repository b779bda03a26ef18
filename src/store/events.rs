//! Order events (the `order_events` outbox that the migration's triggers
//! fill in each change's transaction): the feed in commit order, and the
//! webhooks' claims, acknowledgements, retries and failures.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};

use super::{Result, Store};
use crate::domain::{EventId, EventType, Order, OrderEvent, RefundDue};

/// The columns of an event (`e`) and its user's subject (`u`).
macro_rules! event_columns {
    () => {
        "e.id, e.tx::text::bigint AS tx, e.type, e.created_at, e.sequence, e.order_id,
         e.user_id, e.voucher_id, e.order_created_at, e.status, e.pay_by, e.paid_at,
         e.payment_id, e.amount_cents, u.subject AS user_ref"
    };
}

/// The feed: events past the cursor `($1, $2)` whose transaction is older
/// than every one still running, so that none can commit behind the
/// cursor later (see the migration's note on `tx`).
const FEED: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM order_events e LEFT JOIN user_refs u ON u.user_id = e.user_id
     WHERE (e.tx, e.id) > ($1::text::xid8, $2)
       AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY e.tx, e.id
     LIMIT $3"
);

/// Claims up to `$1` events to deliver for `$2` ms: due, not failed, and
/// each the earliest undelivered event of its order, so that no later
/// event of an order goes out before an earlier one is acknowledged.
/// Claimed rows are skipped by the other instances (`SKIP LOCKED` while
/// the claim commits, then `next_attempt_at` in the future: a sender that
/// dies leaves them to come due again when the claim runs out).
const CLAIM: &str = concat!(
    "WITH due AS (
        SELECT e.id FROM order_events e
        WHERE e.delivered_at IS NULL AND e.failed_at IS NULL AND e.next_attempt_at <= now()
          AND NOT EXISTS (
            SELECT 1 FROM order_events p
            WHERE p.order_id = e.order_id AND p.sequence < e.sequence AND p.delivered_at IS NULL
          )
        ORDER BY e.id
        LIMIT $1
        FOR UPDATE SKIP LOCKED
     ), claimed AS (
        UPDATE order_events e
        SET next_attempt_at = now() + make_interval(secs => $2::double precision / 1000),
            first_attempt_at = coalesce(e.first_attempt_at, now()),
            attempts = e.attempts + 1
        FROM due WHERE e.id = due.id
        RETURNING e.*
     )
     SELECT ",
    event_columns!(),
    " FROM claimed e LEFT JOIN user_refs u ON u.user_id = e.user_id
     ORDER BY e.id"
);

impl FromRow<'_, PgRow> for OrderEvent {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        let kind: String = row.try_get("type")?;
        let kind = kind
            .parse::<EventType>()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        let payment_id: Option<String> = row.try_get("payment_id")?;
        let amount_cents: Option<i64> = row.try_get("amount_cents")?;
        Ok(Self {
            id: EventId {
                tx: row.try_get("tx")?,
                row: row.try_get("id")?,
            },
            kind,
            created_at: row.try_get("created_at")?,
            sequence: row.try_get("sequence")?,
            order: Order {
                id: row.try_get("order_id")?,
                user_id: row.try_get("user_id")?,
                voucher_id: row.try_get("voucher_id")?,
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

/// The webhooks' backlog, for the metrics.
#[derive(Debug, Clone, Copy, Default, FromRow)]
pub struct Backlog {
    /// Seconds since the oldest event not yet acknowledged (nor failed)
    /// was written; 0 when there is none.
    pub lag_seconds: f64,
    pub failed: i64,
}

impl Store {
    /// Up to `limit` events after `after` (from the oldest kept when
    /// `None`), in commit order.
    pub async fn events_after(
        &self,
        after: Option<EventId>,
        limit: i64,
    ) -> Result<Vec<OrderEvent>> {
        let after = after.unwrap_or_default();
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(FEED)
                        .bind(after.tx.to_string())
                        .bind(after.row)
                        .bind(limit)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await
    }

    /// Claims up to `limit` events to deliver, for `lease`.
    pub async fn claim_events(&self, limit: i64, lease: Duration) -> Result<Vec<OrderEvent>> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(CLAIM)
                        .bind(limit)
                        .bind(lease_ms)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await
    }

    /// Marks events acknowledged by the receiver.
    pub async fn acknowledge_events(&self, rows: Vec<i64>) -> Result<()> {
        self.db
            .run(move |c, persistent| {
                Box::pin(async move {
                    sqlx::query(
                        "UPDATE order_events
                         SET delivered_at = now(), next_attempt_at = now(), last_error = NULL
                         WHERE id = ANY($1)",
                    )
                    .bind(rows)
                    .persistent(persistent)
                    .execute(c)
                    .await
                    .map(drop)
                })
            })
            .await
    }

    /// Records a failed delivery of `rows`: each is tried again after
    /// `retry_in`, or failed if its first attempt is older than
    /// `give_up_after`. How many were failed now.
    pub async fn delivery_failed(
        &self,
        rows: Vec<i64>,
        error: String,
        retry_in: Duration,
        give_up_after: Duration,
    ) -> Result<u64> {
        let retry_ms = i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX);
        let give_up_ms = i64::try_from(give_up_after.as_millis()).unwrap_or(i64::MAX);
        self.db
            .run(move |c, persistent| {
                Box::pin(async move {
                    sqlx::query_scalar(
                        "WITH marked AS (
                            UPDATE order_events
                            SET last_error = left($2, 300),
                                next_attempt_at = now() + make_interval(secs => $3::double precision / 1000),
                                failed_at = CASE
                                    WHEN first_attempt_at
                                         + make_interval(secs => $4::double precision / 1000) <= now()
                                    THEN now() END
                            WHERE id = ANY($1) AND delivered_at IS NULL
                            RETURNING failed_at
                         )
                         SELECT count(*) FILTER (WHERE failed_at IS NOT NULL) FROM marked",
                    )
                    .bind(rows)
                    .bind(error)
                    .bind(retry_ms)
                    .bind(give_up_ms)
                    .persistent(persistent)
                    .fetch_one(c)
                    .await
                    .map(|n: i64| u64::try_from(n).unwrap_or(0))
                })
            })
            .await
    }

    /// Up to `limit` events whose delivery failed, oldest first.
    pub async fn failed_events(&self, limit: i64) -> Result<Vec<OrderEvent>> {
        const SQL: &str = concat!(
            "SELECT ",
            event_columns!(),
            " FROM order_events e LEFT JOIN user_refs u ON u.user_id = e.user_id
             WHERE e.failed_at IS NOT NULL
             ORDER BY e.id LIMIT $1"
        );
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(SQL)
                        .bind(limit)
                        .persistent(persistent)
                        .fetch_all(c),
                )
            })
            .await
    }

    /// Puts every failed event back to be delivered now, with a new
    /// retry period; how many.
    pub async fn retry_failed_events(&self) -> Result<u64> {
        self.db
            .run(move |c, persistent| {
                Box::pin(async move {
                    sqlx::query(
                        "UPDATE order_events
                         SET failed_at = NULL, first_attempt_at = NULL, attempts = 0,
                             next_attempt_at = now()
                         WHERE failed_at IS NOT NULL",
                    )
                    .persistent(persistent)
                    .execute(c)
                    .await
                    .map(|done| done.rows_affected())
                })
            })
            .await
    }

    /// Deletes up to `limit` events older than `days`: acknowledged ones,
    /// or any when `acknowledged_only` is false (nothing delivers them).
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
                        "DELETE FROM order_events WHERE id IN (
                            SELECT id FROM order_events
                            WHERE created_at < now() - make_interval(days => $1)
                              AND (delivered_at IS NOT NULL OR NOT $2)
                            ORDER BY created_at LIMIT $3
                            FOR UPDATE SKIP LOCKED)",
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
                    sqlx::query_as(
                        "SELECT coalesce(extract(epoch FROM now() - min(created_at))
                                         FILTER (WHERE failed_at IS NULL), 0)::float8 AS lag_seconds,
                                count(*) FILTER (WHERE failed_at IS NOT NULL) AS failed
                         FROM order_events WHERE delivered_at IS NULL",
                    )
                    .persistent(persistent)
                    .fetch_one(c),
                )
            })
            .await
    }
}
