//! What an async sale reads from Postgres: the vouchers whose streams may
//! still hold orders, and, for reconciliation, one snapshot of a voucher's
//! stock, its buyers, its closed orders, how many orders each user has of
//! it and which of a list of order ids are stored.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::{voucher_columns, Result, Store};
use crate::domain::{OrderId, SaleMode, UserId, Voucher, VoucherId};

/// A voucher as one snapshot saw it, for rebuilding its Redis state.
#[derive(Debug, Clone)]
pub struct SaleSnapshot {
    pub voucher: Voucher,
    /// Every live (`unpaid` or `paid`) order of the voucher, as (user,
    /// order id).
    pub buyers: Vec<(UserId, OrderId)>,
    /// Every closed (`cancelled` or `expired`) order of the voucher: their
    /// units are in `voucher.level.stock` already.
    pub closed: Vec<OrderId>,
    /// Those of the asked order ids that are stored (for any voucher).
    pub stored: Vec<OrderId>,
    /// How many orders of the voucher each user has, of every status (what
    /// `max_orders_per_user` bounds).
    pub orders_per_user: Vec<(UserId, i64)>,
}

#[derive(FromRow)]
struct Row {
    #[sqlx(flatten)]
    voucher: Voucher,
    users: Option<Vec<UserId>>,
    orders: Option<Vec<OrderId>>,
    closed: Option<Vec<OrderId>>,
    stored: Option<Vec<OrderId>>,
    counted_users: Option<Vec<UserId>>,
    counts: Option<Vec<i64>>,
}

impl Store {
    /// Async vouchers whose sale ended after `since` (or has not ended),
    /// in id order, each with its initial stock (which every restock
    /// raises).
    pub async fn async_vouchers(&self, since: DateTime<Utc>) -> Result<Vec<(VoucherId, i64)>> {
        self.db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(
                        "SELECT voucher_id, initial_stock::bigint FROM seckill_vouchers
                         WHERE sale_mode = $2 AND end_time > $1 ORDER BY voucher_id",
                    )
                    .bind(since)
                    .bind(SaleMode::Async)
                    .persistent(persistent)
                    .fetch_all(c),
                )
            })
            .await
    }

    /// The voucher, its buyers, its users' order counts and which of
    /// `order_ids` are stored, in one statement, so one snapshot: an order
    /// committed meanwhile is in all of them or in none.
    pub async fn sale_snapshot(
        &self,
        voucher_id: VoucherId,
        order_ids: Vec<OrderId>,
    ) -> Result<Option<SaleSnapshot>> {
        let row: Option<Row> = self
            .db
            .run(move |c, persistent| {
                Box::pin(
                    sqlx::query_as(concat!(
                        "SELECT ",
                        voucher_columns!(),
                        ", (SELECT array_agg(o.user_id ORDER BY o.id) FROM voucher_orders o
                            WHERE o.voucher_id = s.voucher_id AND o.status IN ('unpaid', 'paid')) AS users,
                           (SELECT array_agg(o.id ORDER BY o.id) FROM voucher_orders o
                            WHERE o.voucher_id = s.voucher_id AND o.status IN ('unpaid', 'paid')) AS orders,
                           (SELECT array_agg(o.id) FROM voucher_orders o
                            WHERE o.voucher_id = s.voucher_id
                              AND o.status IN ('cancelled', 'expired')) AS closed,
                           (SELECT array_agg(o.id) FROM voucher_orders o
                            WHERE o.id = ANY($2)) AS stored,
                           c.counted_users, c.counts
                         FROM vouchers v JOIN seckill_vouchers s ON s.voucher_id = v.id
                         CROSS JOIN LATERAL
                           (SELECT array_agg(n.user_id ORDER BY n.user_id) AS counted_users,
                                   array_agg(n.orders ORDER BY n.user_id) AS counts
                            FROM (SELECT o.user_id, count(*) AS orders FROM voucher_orders o
                                  WHERE o.voucher_id = s.voucher_id GROUP BY o.user_id) n) c
                         WHERE v.id = $1"
                    ))
                    .bind(voucher_id)
                    .bind(order_ids.clone())
                    .persistent(persistent)
                    .fetch_optional(c),
                )
            })
            .await?;
        Ok(row.map(|row| SaleSnapshot {
            voucher: row.voucher,
            buyers: row
                .users
                .unwrap_or_default()
                .into_iter()
                .zip(row.orders.unwrap_or_default())
                .collect(),
            closed: row.closed.unwrap_or_default(),
            stored: row.stored.unwrap_or_default(),
            orders_per_user: row
                .counted_users
                .unwrap_or_default()
                .into_iter()
                .zip(row.counts.unwrap_or_default())
                .collect(),
        }))
    }
}
